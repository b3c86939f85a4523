/*!
 * \file int8_matmul.cc
 * \brief The 8-bit weight matmul of int8_matmul.h: rows quantized per row, then VNNI dot products.
 *
 * Work split: the team first quantizes the rows (each thread some rows), then each thread takes a
 * contiguous range of outputs. A thread walks its outputs in blocks of J weight rows and, for each,
 * every block of R activation rows: J·R int32 accumulators in registers, each 64-byte step loading
 * J weight vectors and R activation vectors for J·R vpdpbusd. A block of weight rows (J · in
 * bytes) stays in L1 while all rows pass over it, so prefill reads each weight once from memory
 * per call. Decode (one row) reads the weights once, front to back, one weight row at a time.
 */
#include "backends/int8_matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tvm_hetero {
namespace int8_matmul {

namespace {

constexpr int64_t kLane = 64;  // bytes of one zmm register: the step along `in`

int64_t Padded(int64_t in) { return (in + kLane - 1) / kLane * kLane; }

/*! \brief Where the quantized rows, their scales and their sums lie in the scratch. */
struct QuantizedRows {
  int8_t* q;
  float* scale;
  int32_t* sum;
  int64_t stride;
  QuantizedRows(void* scratch, int64_t rows, int64_t in) {
    stride = Padded(in);
    q = static_cast<int8_t*>(scratch);
    scale = reinterpret_cast<float*>(q + rows * stride);
    sum = reinterpret_cast<int32_t*>(scale + rows);
  }
};

/*! \brief Row r quantized: q = round(x / s), s = max|x| / 127 (1 for a zero row), zero-padded. */
void QuantizeRow(const float* x, int64_t in, int8_t* q, int64_t stride, float* scale, int32_t* sum) {
  float amax = 0.f;
  for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::fabs(x[k]));
  float s = amax > 0.f ? amax / 127.f : 1.f;
  float inv = 1.f / s;  // multiplied, as the vector kernel does, so both round alike
  int32_t total = 0;
  for (int64_t k = 0; k < in; ++k) {
    int32_t v = static_cast<int32_t>(std::nearbyint(x[k] * inv));
    v = std::min(127, std::max(-127, v));
    q[k] = static_cast<int8_t>(v);
    total += v;
  }
  std::memset(q + in, 0, static_cast<size_t>(stride - in));
  *scale = s;
  *sum = total;
}

/*! \brief y[r][n] from the integer dot product `acc` of weight row n and quantized row r. */
inline float Output(int32_t acc, int64_t r, int64_t n, const QuantizedRows& rows, const Weights& w) {
  float v = rows.scale[r] * w.scales[n] * static_cast<float>(acc - w.zero_point * rows.sum[r]);
  return w.bias ? v + w.bias[n] : v;
}

/*! \brief The portable kernel: the same integers, one output at a time. */
void OutputsPortable(const QuantizedRows& rows, int64_t num_rows, const Weights& w, float* y, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wn = w.data + n * w.in;
    for (int64_t r = 0; r < num_rows; ++r) {
      const int8_t* q = rows.q + r * rows.stride;
      int32_t acc = 0;
      for (int64_t k = 0; k < w.in; ++k) acc += static_cast<int32_t>(wn[k]) * q[k];
      y[r * w.out + n] = Output(acc, r, n, rows, w);
    }
  }
}

#define TVM_HETERO_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

/*! \brief J weight rows (from n) against R quantized rows (from r): the J·R outputs. */
template <int R, int J>
TVM_HETERO_VNNI inline void Block(const QuantizedRows& rows, int64_t r, const Weights& w, int64_t n, float* y) {
  __m512i acc[R][J];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < J; ++j) acc[i][j] = _mm512_setzero_si512();
  const uint8_t* wrow = w.data + n * w.in;
  const int8_t* qrow = rows.q + r * rows.stride;
  int64_t full = w.in / kLane * kLane;
  for (int64_t k = 0; k < full; k += kLane) {
    __m512i wv[J];
    for (int j = 0; j < J; ++j) wv[j] = _mm512_loadu_si512(wrow + j * w.in + k);
    for (int i = 0; i < R; ++i) {
      __m512i xv = _mm512_load_si512(qrow + i * rows.stride + k);
      for (int j = 0; j < J; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], xv);
    }
  }
  if (full < w.in) {  // the tail: weights read under a mask (the quantized rows are zero-padded)
    __mmask64 mask = (~0ULL) >> (kLane - (w.in - full));
    __m512i wv[J];
    for (int j = 0; j < J; ++j) wv[j] = _mm512_maskz_loadu_epi8(mask, wrow + j * w.in + full);
    for (int i = 0; i < R; ++i) {
      __m512i xv = _mm512_load_si512(qrow + i * rows.stride + full);
      for (int j = 0; j < J; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], xv);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < J; ++j) y[(r + i) * w.out + n + j] = Output(_mm512_reduce_add_epi32(acc[i][j]), r + i, n + j, rows, w);
}

/*! \brief Outputs [n0, n1) for every row: blocks of J outputs, each against every block of 4 rows. */
template <int J>
TVM_HETERO_VNNI void OutputsVnni(const QuantizedRows& rows, int64_t num_rows, const Weights& w, float* y, int64_t n0,
                                 int64_t n1) {
  int64_t n = n0;
  for (; n + J <= n1; n += J) {
    int64_t r = 0;
    for (; r + 4 <= num_rows; r += 4) Block<4, J>(rows, r, w, n, y);
    switch (num_rows - r) {
      case 3: Block<3, J>(rows, r, w, n, y); break;
      case 2: Block<2, J>(rows, r, w, n, y); break;
      case 1: Block<1, J>(rows, r, w, n, y); break;
      default: break;
    }
  }
  for (; n < n1; ++n) {
    for (int64_t r = 0; r < num_rows; ++r) Block<1, 1>(rows, r, w, n, y);
  }
}

/*! \brief QuantizeRow with AVX-512 (the same rounding: the default mode, nearest even). */
TVM_HETERO_VNNI void QuantizeRowAvx512(const float* x, int64_t in, int8_t* q, int64_t stride, float* scale,
                                       int32_t* sum) {
  int64_t full = in / 16 * 16;
  __m512 amax = _mm512_setzero_ps();
  for (int64_t k = 0; k < full; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  float m = _mm512_reduce_max_ps(amax);
  for (int64_t k = full; k < in; ++k) m = std::max(m, std::fabs(x[k]));
  float s = m > 0.f ? m / 127.f : 1.f;
  __m512 inv = _mm512_set1_ps(1.f / s);
  __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), total = _mm512_setzero_si512();
  for (int64_t k = 0; k < full; k += 16) {
    __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv));
    v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
    total = _mm512_add_epi32(total, v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtsepi32_epi8(v));
  }
  int32_t rest = 0;
  for (int64_t k = full; k < in; ++k) {
    int32_t v = std::min(127, std::max(-127, static_cast<int32_t>(std::nearbyint(x[k] * (1.f / s)))));
    q[k] = static_cast<int8_t>(v);
    rest += v;
  }
  std::memset(q + in, 0, static_cast<size_t>(stride - in));
  *scale = s;
  *sum = _mm512_reduce_add_epi32(total) + rest;
}

/*!
 * \brief Outputs [n0, n1) of one row: weight rows read one after another, front to back (twice the
 *        bandwidth of interleaving several rows' streams: 20-25 against 9-12 GB/s from DRAM, loaded
 *        machine), two accumulators per row so consecutive vpdpbusd do not wait on each other.
 */
TVM_HETERO_VNNI void OneRowVnni(const QuantizedRows& rows, const Weights& w, float* y, int64_t n0, int64_t n1) {
  int64_t full = w.in / kLane * kLane, pairs = w.in / (2 * kLane) * (2 * kLane);
  // The tail's mask (no tail: no mask; a shift by the full 64 bits would be undefined).
  __mmask64 mask = full < w.in ? (~0ULL) >> (kLane - (w.in - full)) : 0;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wrow = w.data + n * w.in;
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
    int64_t k = 0;
    for (; k < pairs; k += 2 * kLane) {
      a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(wrow + k), _mm512_load_si512(rows.q + k));
      b = _mm512_dpbusd_epi32(b, _mm512_loadu_si512(wrow + k + kLane), _mm512_load_si512(rows.q + k + kLane));
    }
    for (; k < full; k += kLane) a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(wrow + k), _mm512_load_si512(rows.q + k));
    if (full < w.in) a = _mm512_dpbusd_epi32(a, _mm512_maskz_loadu_epi8(mask, wrow + full), _mm512_load_si512(rows.q + full));
    y[n] = Output(_mm512_reduce_add_epi32(_mm512_add_epi32(a, b)), 0, n, rows, w);
  }
}

bool DetectVnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
}

}  // namespace

bool HasVnni() {
  static const bool vnni = DetectVnni();
  return vnni;
}

size_t ScratchBytes(int64_t rows, int64_t in) {
  return static_cast<size_t>(rows * Padded(in) + rows * (sizeof(float) + sizeof(int32_t)));
}

void Multiply(const float* x, int64_t num_rows, const Weights& w, float* y, void* scratch) {
  QuantizedRows rows(scratch, num_rows, w.in);
  bool vnni = HasVnni();
  auto quantize = vnni ? QuantizeRowAvx512 : QuantizeRow;
  // Outputs go to threads in blocks of 16 (a cache line of 16 float outputs, whole J blocks).
  int64_t blocks = (w.out + 15) / 16;
  auto outputs = [&](int me, int threads) {
    int64_t n0 = std::min(w.out, blocks * me / threads * 16), n1 = std::min(w.out, blocks * (me + 1) / threads * 16);
    if (!vnni) {
      OutputsPortable(rows, num_rows, w, y, n0, n1);
    } else if (num_rows == 1) {
      OneRowVnni(rows, w, y, n0, n1);
    } else {
      OutputsVnni<4>(rows, num_rows, w, y, n0, n1);
    }
  };
  int team = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(blocks)));
  if (team == 1) {  // no parallel region: libgomp allocates a team for each
    for (int64_t r = 0; r < num_rows; ++r) {
      quantize(x + r * w.in, w.in, rows.q + r * rows.stride, rows.stride, rows.scale + r, rows.sum + r);
    }
    return outputs(0, 1);
  }
#pragma omp parallel num_threads(team)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < num_rows; ++r) {
      quantize(x + r * w.in, w.in, rows.q + r * rows.stride, rows.stride, rows.scale + r, rows.sum + r);
    }
    outputs(omp_get_thread_num(), omp_get_num_threads());
  }
}

}  // namespace int8_matmul
}  // namespace tvm_hetero
