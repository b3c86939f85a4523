/*!
 * \file bench/kernel_call_floor.cc
 * \brief The cost floor for dispatch benchmarks: a bare C++ loop calling one kernel with packed
 *        arguments prepared once, the least any runtime can spend per op. Built as
 *        libtvm_hetero_bench.so for bench/dispatch_overhead.py, never into the shipped library.
 */
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <chrono>
#include <vector>

namespace tvm_hetero {

namespace ffi = tvm::ffi;

/*! \brief Nanoseconds per call of `kernel(args...)` over `iterations` calls. */
double KernelCallFloorNs(const ffi::Function& kernel, const std::vector<DLTensor*>& tensors, int64_t iterations) {
  std::vector<ffi::AnyView> args(tensors.begin(), tensors.end());
  ffi::Any rv;
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) kernel.CallPacked(args.data(), static_cast<int32_t>(args.size()), &rv);
  auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  return ns / static_cast<double>(iterations);
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  // kernel_call_floor_ns(kernel, iterations, tensor0, tensor1, ...)
  refl::GlobalDef().def_packed("tvm_hetero.testing.kernel_call_floor_ns", [](ffi::PackedArgs args, ffi::Any* rv) {
    std::vector<DLTensor*> tensors;
    for (int i = 2; i < args.size(); ++i) tensors.push_back(args[i].cast<DLTensor*>());
    *rv = KernelCallFloorNs(args[0].cast<ffi::Function>(), tensors, args[1].cast<int64_t>());
  });
}

}  // namespace tvm_hetero
