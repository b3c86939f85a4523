/*!
 * \file one_row_matmul.h
 * \brief y = x · W (+ bias) for one float32 row x and a float32 weight stored (K, N) row-major, read
 *        once, in place: a decode step's projections and LM head without a reordered copy.
 *
 * The row's K weight rows are streamed in order, eight at a time: y[n] += x[k]·W[k][n] + ... +
 * x[k+7]·W[k+7][n] over the outputs, so memory is read front to back (what the prefetchers follow
 * best) and y (N floats) stays in the caches. Guarantee: every weight is read exactly once per call;
 * each output is summed in float32 in order of k (its rounding differs from oneDNN's by the order
 * of the sums only).
 */
#ifndef TVM_HETERO_BACKENDS_ONE_ROW_MATMUL_H_
#define TVM_HETERO_BACKENDS_ONE_ROW_MATMUL_H_

#include <cstdint>

namespace tvm_hetero {
namespace one_row_matmul {

/*!
 * \brief y (n) = x (k) · w (k × n) + bias (n, or null), on the calling thread's OpenMP team
 *        (outputs split between threads in blocks of 16). Allocates nothing.
 */
void Multiply(const float* x, const float* w, const float* bias, float* y, int64_t k, int64_t n);

}  // namespace one_row_matmul
}  // namespace tvm_hetero

#endif  // TVM_HETERO_BACKENDS_ONE_ROW_MATMUL_H_
