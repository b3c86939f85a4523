/*!
 * \file support/device_kinds.cc
 * \brief The registry of device kinds (one record each) and its export to Python.
 */
#include "support/device_kinds.h"

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>
#include <tvm/runtime/device_api.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

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

// Kinds registered at run time by a vendor's package (RegisterDeviceKind): a fixed table, so a
// reader never sees an entry move; an entry is complete before the count that publishes it grows.
constexpr int kMaxAddedKinds = 16;
std::array<KindEntry, kMaxAddedKinds> added_kinds{};
std::array<std::string, kMaxAddedKinds> added_names;
std::atomic<int> num_added_kinds{0};
std::mutex adding_kinds;

}  // namespace

const DeviceKindTraits* RegisteredTraits(int device_type) {
  for (const KindEntry& entry : kKinds) {
    if (entry.device_type == device_type) return &entry.traits;
  }
  int added = num_added_kinds.load(std::memory_order_acquire);
  for (int i = 0; i < added; ++i) {
    if (added_kinds[i].device_type == device_type) return &added_kinds[i].traits;
  }
  return nullptr;
}

void RegisterDeviceKind(int device_type, const std::string& name, bool host_memory, bool runs_tvm_kernels) {
  std::lock_guard<std::mutex> lock(adding_kinds);
  if (device_type <= 0 || device_type >= kRPCSessMask) {
    TVM_FFI_THROW(ValueError) << "device kind '" << name << "': device type " << device_type << " is outside (0, "
                              << kRPCSessMask << ")";
  }
  if (const DeviceKindTraits* known = RegisteredTraits(device_type)) {
    if (name == known->name && known->host_memory == host_memory && known->runs_tvm_kernels == runs_tvm_kernels) return;
    TVM_FFI_THROW(ValueError) << "device kind '" << name << "': device type " << device_type << " belongs to kind '"
                              << known->name << "'";
  }
  int index = num_added_kinds.load(std::memory_order_relaxed);
  if (index == kMaxAddedKinds) TVM_FFI_THROW(ValueError) << "device kind '" << name << "': too many kinds registered";
  added_names[index] = name;
  // A kind reached through a vendor runtime: a call returns when its work is done; host memory
  // (shared with the CPUs) or memory of its own that the runtime stages through.
  added_kinds[index] = KindEntry{device_type, DeviceKindTraits{added_names[index].c_str(), false, false, host_memory,
                                                               host_memory, WaitMode::kReturn, runs_tvm_kernels}};
  num_added_kinds.store(index + 1, std::memory_order_release);
}

const DeviceKindTraits& TraitsOf(DLDevice dev) {
  if (static_cast<int>(dev.device_type) >= kRPCSessMask) return kRemote;
  const DeviceKindTraits* found = RegisteredTraits(static_cast<int>(dev.device_type));
  return found != nullptr ? *found : kOther;
}

std::vector<int> RegisteredDeviceTypes() {
  std::vector<int> types;
  for (const KindEntry& entry : kKinds) types.push_back(entry.device_type);
  int added = num_added_kinds.load(std::memory_order_acquire);
  for (int i = 0; i < added; ++i) types.push_back(added_kinds[i].device_type);
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
      .def("tvm_hetero.support.rpc_session_mask", []() { return static_cast<int64_t>(kRPCSessMask); })
      .def("tvm_hetero.support.register_device_kind",
           [](int64_t device_type, tvm::ffi::String name, bool host_memory, bool runs_tvm_kernels) {
             RegisterDeviceKind(static_cast<int>(device_type), std::string(name), host_memory, runs_tvm_kernels);
           });
}

}  // namespace support
}  // namespace tvm_hetero
