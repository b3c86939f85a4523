/*!
 * \file int8_matmul.h
 * \brief y = x · dequantize(W)ᵀ (+ bias) for float32 rows x and 8-bit weights: W is (out, in) uint8
 *        with zero point 128 and one float32 scale per output channel, so weight (n, k) is
 *        (W[n][k] - zero_point) · scale[n] (tvm_hetero.llm stores zero point 128). Computed in integers (AVX-512 VNNI where the CPU has it).
 *
 * Each row of x is quantized when the call runs, symmetrically to int8: s = max|x| / 127,
 * q = round(x / s) (nearest even), so |x - s·q| <= s / 2 per element. vpdpbusd multiplies the
 * unsigned weights by the signed q and sums four products into int32 lanes exactly (no
 * saturation: |sum| <= in · 255 · 127 < 2^31 for in < 66000), and the zero point comes off once
 * per row: Σ (W - zp) q = Σ W q - zp Σ q. Guarantee: the result equals the float computation on
 * the dequantized weights and the quantized row, up to float32 rounding of the final scaling; the
 * only approximation is q for x (an error of at most s / 2 per element).
 */
#ifndef TVM_HETERO_BACKENDS_INT8_MATMUL_H_
#define TVM_HETERO_BACKENDS_INT8_MATMUL_H_

#include <cstddef>
#include <cstdint>

namespace tvm_hetero {
namespace int8_matmul {

/*! \brief The weights of one matmul as stored: (out, in) uint8, one zero point, a scale per out. */
struct Weights {
  const uint8_t* data = nullptr;
  int32_t zero_point = 128;
  const float* scales = nullptr;
  /*! \brief One per output (null: none). */
  const float* bias = nullptr;
  int64_t out = 0, in = 0;
};

/*! \brief Bytes of scratch a call with `rows` rows needs (the quantized rows, their scales and sums). */
size_t ScratchBytes(int64_t rows, int64_t in);

/*!
 * \brief y (rows × out) = x (rows × in) · dequantize(W)ᵀ + bias, on the calling thread's OpenMP team
 *        (omp_get_max_threads). `scratch`: ScratchBytes(rows, in) bytes, 64-byte aligned. Allocates
 *        nothing.
 */
void Multiply(const float* x, int64_t rows, const Weights& w, float* y, void* scratch);

/*! \brief Whether the VNNI kernel runs (else a portable loop computes the same integers). */
bool HasVnni();

}  // namespace int8_matmul
}  // namespace tvm_hetero

#endif  // TVM_HETERO_BACKENDS_INT8_MATMUL_H_
