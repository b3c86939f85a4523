/*!
 * \file support/device.cc
 * \brief Allocation, staged copies and synchronisation for the device kinds of device.h.
 */
#include "support/device.h"

#include <tvm/runtime/device_api.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace tvm_hetero {
namespace support {

namespace ffi = tvm::ffi;
using tvm::runtime::DeviceAPI;

namespace {

constexpr size_t kAlignment = 64;

/*! \brief The device whose API allocates for `dev`: the host CPU for local kinds with host memory. */
DLDevice ApiDevice(DLDevice dev) { return IsHost(dev) ? DLDevice{kDLCPU, 0} : dev; }

/*! \brief Allocates with the device's own API (the host's for kinds whose memory is host memory,
 *         which may have no TVM device API of their own). */
struct DeviceAlloc {
  void AllocData(DLTensor* t) {
    size_t nbytes = std::max<size_t>(ffi::GetDataSize(*t), 1);
    t->data = DeviceAPI::Get(ApiDevice(t->device))->AllocDataSpace(ApiDevice(t->device), nbytes, kAlignment, t->dtype);
  }
  void FreeData(DLTensor* t) {
    // Never throw from a destructor: a remote device may already be gone.
    try {
      DeviceAPI::Get(ApiDevice(t->device))->FreeDataSpace(ApiDevice(t->device), t->data);
    } catch (...) {
    }
  }
};

/*! \brief A view at `offset` bytes into `base`; holding `base` keeps its memory alive. */
struct ViewAlloc {
  ffi::Tensor base;
  size_t offset = 0;
  void AllocData(DLTensor* t) { t->data = static_cast<char*>(base.data_ptr()) + offset; }
  void FreeData(DLTensor*) {}
};

}  // namespace

std::string DeviceName(DLDevice dev) {
  std::ostringstream os;
  if (dev.device_type >= kRPCSessMask) {
    os << "remote[" << dev.device_type / kRPCSessMask - 1 << "]:";
    dev.device_type = static_cast<DLDeviceType>(dev.device_type % kRPCSessMask);
  }
  // A kind driven through a vendor runtime (no TVM kernels) is named by its kind: "KIND:0".
  const DeviceKindTraits& kind = TraitsOf(dev);
  os << (kind.runs_tvm_kernels ? tvm::runtime::DLDeviceType2Str(dev.device_type) : kind.name) << ":" << dev.device_id;
  return os.str();
}

ffi::Tensor AllocTensor(ffi::Shape shape, DLDataType dtype, DLDevice device) {
  return ffi::Tensor::FromNDAlloc(DeviceAlloc(), shape, dtype, device);
}

ffi::Tensor ViewOf(const ffi::Tensor& base, size_t offset, ffi::Shape shape, DLDataType dtype, DLDevice device) {
  return ffi::Tensor::FromNDAlloc(ViewAlloc{base, offset}, shape, dtype, device);
}

ffi::Tensor StagingBuffer(DLDevice from, DLDevice to, ffi::Shape shape, DLDataType dtype) {
  if (!NeedsStaging(from, to)) return ffi::Tensor();
  return AllocTensor(shape, dtype, DLDevice{kDLCPU, 0});
}

void CopyAcrossDevices(const DLTensor* from, DLTensor* to, DLTensor* staging) {
  if (IsHost(from->device) && IsHost(to->device)) {
    // cpu(0) and cpu(1) are distinct devices of one address space.
    std::memcpy(static_cast<char*>(to->data) + to->byte_offset,
                static_cast<const char*>(from->data) + from->byte_offset, ffi::GetDataSize(*from));
    return;
  }
  if (NeedsStaging(from->device, to->device)) {
    if (staging == nullptr) {
      TVM_FFI_THROW(InternalError) << "a copy from " << DeviceName(from->device) << " to " << DeviceName(to->device)
                                   << " needs a host staging buffer";
    }
    CopyAcrossDevices(from, staging);  // lands on the host: complete on return
    CopyAcrossDevices(staging, to);
    return;
  }
  DLDevice api_device = CopyApiDevice(from->device, to->device);
  DeviceAPI* api = DeviceAPI::Get(api_device);
  api->CopyDataFromTo(const_cast<DLTensor*>(from), to, nullptr);
  // A copy that lands on the host must be complete before the host reads it.
  if (IsHost(to->device)) api->StreamSync(api_device, nullptr);
}

void CopyOnce(const DLTensor* from, DLTensor* to) {
  ffi::Tensor staging = StagingBuffer(from->device, to->device, ffi::Shape(to->shape, to->shape + to->ndim), to->dtype);
  CopyAcrossDevices(from, to, staging.defined() ? Mutable(staging) : nullptr);
}

void AddUnique(std::vector<DLDevice>* devices, DLDevice dev) {
  for (const DLDevice& d : *devices) {
    if (SameDevice(d, dev)) return;
  }
  devices->push_back(dev);
}

}  // namespace support
}  // namespace tvm_hetero
