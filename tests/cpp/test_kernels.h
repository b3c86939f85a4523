/*! \file test_kernels.h \brief The kernel library the C++ tests run graphs with: float32 add and sub. */
#ifndef TVM_HETERO_TESTS_TEST_KERNELS_H_
#define TVM_HETERO_TESTS_TEST_KERNELS_H_

#include <dlpack/dlpack.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace tvm_hetero::testing {

/*! \brief out[i] = f(a[i], b[i]) over float32 vectors of out's length. */
template <typename F>
inline void ElementwiseFloat32(F f, const DLTensor* a, const DLTensor* b, DLTensor* out) {
  const float* x = static_cast<const float*>(a->data);
  const float* y = static_cast<const float*>(b->data);
  float* z = static_cast<float*>(out->data);
  for (int64_t i = 0; i < out->shape[0]; ++i) z[i] = f(x[i], y[i]);
}

/*! \brief Kernel calls per device, to check placement (one thread at a time). */
struct CallLog {
  std::vector<int> device_ids;
  /*! \brief Called at the start of every kernel, if set (to hold a run in progress). */
  std::function<void()> on_call;
};

/*!
 * \brief Element-wise float32 `add` and `sub` that check all their arguments share a device. With a
 *        log, every call is recorded there; without one the module is stateless, safe on any thread.
 */
class TestKernels : public tvm::ffi::ModuleObj {
 public:
  explicit TestKernels(CallLog* log = nullptr) : log_(log) {}
  const char* kind() const final { return "tvm_hetero.TestKernels"; }
  tvm::ffi::Optional<tvm::ffi::Function> GetFunction(const tvm::ffi::String& name) final {
    if (name == "add") return Elementwise([](float a, float b) { return a + b; });
    if (name == "sub") return Elementwise([](float a, float b) { return a - b; });
    return std::nullopt;
  }

 private:
  template <typename F>
  tvm::ffi::Function Elementwise(F f) {
    CallLog* log = log_;
    return tvm::ffi::Function::FromTyped([f, log](DLTensor* a, DLTensor* b, DLTensor* out) {
      if (a->device.device_id != out->device.device_id || b->device.device_id != out->device.device_id) {
        TVM_FFI_THROW(ValueError) << "arguments on different devices";
      }
      if (log != nullptr) {
        if (log->on_call) log->on_call();
        log->device_ids.push_back(out->device.device_id);
      }
      ElementwiseFloat32(f, a, b, out);
    });
  }
  CallLog* log_;
};

}  // namespace tvm_hetero::testing

#endif  // TVM_HETERO_TESTS_TEST_KERNELS_H_
