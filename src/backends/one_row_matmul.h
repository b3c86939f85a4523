/*!
 * \file one_row_matmul.h
 * \brief y = x · W (+ bias) for one float32 row x and a float32 weight read once, in place: a decode
 *        step's projections and LM head without a reordered copy, on either of two stored layouts.
 *
 * Rows (K, N) row-major, Multiply: the K weight rows are streamed in order, eight at a time: y[n] += x[k]·W[k][n] + ... +
 * x[k+7]·W[k+7][n] over the outputs, so memory is read front to back (what the prefetchers follow
 * best) and y (N floats) stays in the caches. Guarantee: every weight is read exactly once per call;
 * each output is summed in float32 in order of k (its rounding differs from oneDNN's by the order
 * of the sums only).
 *
 * Panels (N/16, K, 16), MultiplyPanels: panel j holds columns 16j..16j+15 of W, row after row, so
 * one output vector is the sum over k of x[k]·panel[k] with no pass over y; four panels are streamed
 * together (four sequential reads, eight accumulators in registers: even and odd k apart). A decode step's shapes read
 * 1.4-1.5x faster this way than rows eight at a time (a standalone loop over SmolLM2-135M's 211
 * matrices, cold caches, one thread). The same bytes are oneDNN's BA16a16b layout of (K, N) when
 * 16 divides K, so a prefill graph's oneDNN matmul reads the very same weights. Guarantee: every
 * weight is read exactly once; each output is two float32 sums in order of k (even k, odd k), added.
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

/*! \brief The number of columns per panel of MultiplyPanels' layout. */
constexpr int64_t kPanelWidth = 16;

/*!
 * \brief y (n) = x (k) · W + bias (n, or null) for W stored as n / 16 panels of (k × 16), 16
 *        dividing n; panels split between the calling thread's OpenMP team. Allocates nothing.
 */
void MultiplyPanels(const float* x, const float* panels, const float* bias, float* y, int64_t k, int64_t n);

}  // namespace one_row_matmul
}  // namespace tvm_hetero

#endif  // TVM_HETERO_BACKENDS_ONE_ROW_MATMUL_H_
