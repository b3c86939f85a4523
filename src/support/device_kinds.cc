/*!
 * \file support/device_kinds.cc
 * \brief The registry of device kinds (one record each) and its export to Python.
 */
#include "support/device_kinds.h"

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>
#include <tvm/runtime/device_api.h>

namespace tvm_hetero {
namespace support {

namespace {

struct KindEntry {
  int device_type;
  DeviceKindTraits traits;
};

// name, remote, asynchronous, host_memory, offsets_usable, wait, runs_tvm_kernels
constexpr DeviceKindTraits kHostCpu{"cpu", false, false, true, true, WaitMode::kReturn, true};
constexpr DeviceKindTraits kCuda{"cuda", false, true, false, true, WaitMode::kStreamSync, true};
constexpr DeviceKindTraits kRocm{"rocm", false, true, false, true, WaitMode::kStreamSync, true};
// Buffer handles, not addresses: an offset cannot be added to them.
constexpr DeviceKindTraits kOpenCL{"opencl", false, true, false, false, WaitMode::kStreamSync, true};
constexpr DeviceKindTraits kVulkan{"vulkan", false, true, false, false, WaitMode::kStreamSync, true};
constexpr DeviceKindTraits kMetal{"metal", false, true, false, false, WaitMode::kStreamSync, true};
// A Qualcomm HTP driven through QNN graphs (ONNX Runtime's QNN EP): its buffers are host memory
// shared with the CPUs (rpcmem on a phone), a graph execution blocks until done, and it runs no
// TVM kernels.
constexpr DeviceKindTraits kQnnHtp{"qnn-htp", false, false, true, true, WaitMode::kReturn, false};
// A remote call answers once the remote process has issued the work (a remote accelerator may still
// be running it, so a run ends with a drain); remote memory is another process's.
constexpr DeviceKindTraits kRemote{"remote", true, false, false, false, WaitMode::kStreamSync, true};
// Anything else TVM has a device API for: assume the least.
constexpr DeviceKindTraits kOther{"other", false, true, false, false, WaitMode::kStreamSync, true};

constexpr KindEntry kKinds[] = {
    {kDLCPU, kHostCpu},        {kDLCUDA, kCuda},         {kDLCUDAHost, kHostCpu},
    {kDLCUDAManaged, kCuda},   {kDLROCM, kRocm},         {kDLROCMHost, kHostCpu},
    {kDLOpenCL, kOpenCL},      {kDLVulkan, kVulkan},     {kDLMetal, kMetal},
    {kDLHexagon, kQnnHtp},
};

}  // namespace

const DeviceKindTraits* RegisteredTraits(int device_type) {
  for (const KindEntry& entry : kKinds) {
    if (entry.device_type == device_type) return &entry.traits;
  }
  return nullptr;
}

const DeviceKindTraits& TraitsOf(DLDevice dev) {
  if (static_cast<int>(dev.device_type) >= kRPCSessMask) return kRemote;
  const DeviceKindTraits* found = RegisteredTraits(static_cast<int>(dev.device_type));
  return found != nullptr ? *found : kOther;
}

std::vector<int> RegisteredDeviceTypes() {
  std::vector<int> types;
  for (const KindEntry& entry : kKinds) types.push_back(entry.device_type);
  return types;
}

void WaitForCompletion(DLDevice dev) {
  if (TraitsOf(dev).wait == WaitMode::kStreamSync) tvm::runtime::DeviceAPI::Get(dev)->StreamSync(dev, nullptr);
}

namespace {

tvm::ffi::Map<tvm::ffi::String, tvm::ffi::Any> TraitsAsMap(int device_type) {
  DLDevice dev{static_cast<DLDeviceType>(device_type), 0};
  const DeviceKindTraits& t = TraitsOf(dev);
  return tvm::ffi::Map<tvm::ffi::String, tvm::ffi::Any>{
      {"name", tvm::ffi::String(t.name)},
      {"remote", t.remote},
      {"asynchronous", t.asynchronous},
      {"host_memory", t.host_memory},
      {"offsets_usable", t.offsets_usable},
      {"wait", tvm::ffi::String(t.wait == WaitMode::kStreamSync ? "stream_sync" : "return")},
      {"runs_tvm_kernels", t.runs_tvm_kernels},
  };
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("tvm_hetero.support.device_kind_traits", TraitsAsMap)
      .def("tvm_hetero.support.registered_device_types", []() -> tvm::ffi::Array<int64_t> {
        tvm::ffi::Array<int64_t> out;
        for (int t : RegisteredDeviceTypes()) out.push_back(t);
        return out;
      })
      .def("tvm_hetero.support.rpc_session_mask", []() { return static_cast<int64_t>(kRPCSessMask); });
}

}  // namespace support
}  // namespace tvm_hetero
