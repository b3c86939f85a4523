/*! \file test_kernels.h \brief The element-wise float32 body the C++ tests' kernel modules share. */
#ifndef TVM_HETERO_TESTS_TEST_KERNELS_H_
#define TVM_HETERO_TESTS_TEST_KERNELS_H_

#include <dlpack/dlpack.h>

#include <cstdint>

namespace tvm_hetero::testing {

/*! \brief out[i] = f(a[i], b[i]) over float32 vectors of out's length. */
template <typename F>
inline void ElementwiseFloat32(F f, const DLTensor* a, const DLTensor* b, DLTensor* out) {
  const float* x = static_cast<const float*>(a->data);
  const float* y = static_cast<const float*>(b->data);
  float* z = static_cast<float*>(out->data);
  for (int64_t i = 0; i < out->shape[0]; ++i) z[i] = f(x[i], y[i]);
}

}  // namespace tvm_hetero::testing

#endif  // TVM_HETERO_TESTS_TEST_KERNELS_H_
