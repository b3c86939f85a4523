/*!
 * \file one_row_matmul.cc
 * \brief The one-row float32 matmuls of one_row_matmul.h (rows and panels): AVX-512 where the CPU
 *        has it, else plain loops with the same order of operations.
 */
#include "backends/one_row_matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>

namespace tvm_hetero {
namespace one_row_matmul {

namespace {

/*! \brief Outputs [n0, n1) with the plain loop: y starts at the bias, then four rows per pass. */
void ColumnsPortable(const float* x, const float* w, const float* bias, float* y, int64_t k, int64_t n,
                     int64_t n0, int64_t n1) {
  for (int64_t c = n0; c < n1; ++c) y[c] = bias ? bias[c] : 0.f;
  for (int64_t r = 0; r < k; ++r) {
    const float* row = w + r * n;
    for (int64_t c = n0; c < n1; ++c) y[c] += x[r] * row[c];
  }
}

/*! \brief Weight rows streamed together per pass over the outputs: 8 read the decode shapes from
 *         DRAM 15-20% faster than 4 (fewer passes over y per weight byte; a standalone loop over
 *         the decode shapes with cold caches: 1536 x 576 15.5 against 13.0 GB/s, 576 x 3072 22.1
 *         against 19.1). */
constexpr int kRowsPerPass = 8;

/*! \brief Outputs [n0, n1) with AVX-512: rows eight at a time, 16 outputs per vector, a masked tail. */
__attribute__((target("avx512f"))) void ColumnsAvx512(const float* x, const float* w, const float* bias, float* y,
                                                      int64_t k, int64_t n, int64_t n0, int64_t n1) {
  int64_t full = n0 + (n1 - n0) / 16 * 16;
  __mmask16 tail = static_cast<__mmask16>((1u << (n1 - full)) - 1u);
  for (int64_t c = n0; c < full; c += 16) _mm512_storeu_ps(y + c, bias ? _mm512_loadu_ps(bias + c) : _mm512_setzero_ps());
  if (tail) _mm512_mask_storeu_ps(y + full, tail, bias ? _mm512_maskz_loadu_ps(tail, bias + full) : _mm512_setzero_ps());
  int64_t r = 0;
  for (; r + kRowsPerPass <= k; r += kRowsPerPass) {
    __m512 xs[kRowsPerPass];
    const float* rows[kRowsPerPass];
    for (int i = 0; i < kRowsPerPass; ++i) {
      xs[i] = _mm512_set1_ps(x[r + i]);
      rows[i] = w + (r + i) * n;
    }
    for (int64_t c = n0; c < full; c += 16) {
      __m512 v = _mm512_loadu_ps(y + c);
      for (int i = 0; i < kRowsPerPass; ++i) v = _mm512_fmadd_ps(xs[i], _mm512_loadu_ps(rows[i] + c), v);
      _mm512_storeu_ps(y + c, v);
    }
    if (tail) {
      __m512 v = _mm512_maskz_loadu_ps(tail, y + full);
      for (int i = 0; i < kRowsPerPass; ++i) v = _mm512_fmadd_ps(xs[i], _mm512_maskz_loadu_ps(tail, rows[i] + full), v);
      _mm512_mask_storeu_ps(y + full, tail, v);
    }
  }
  for (; r < k; ++r) {
    __m512 a = _mm512_set1_ps(x[r]);
    const float* row = w + r * n;
    for (int64_t c = n0; c < full; c += 16) {
      _mm512_storeu_ps(y + c, _mm512_fmadd_ps(a, _mm512_loadu_ps(row + c), _mm512_loadu_ps(y + c)));
    }
    if (tail) {
      __m512 v = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(tail, row + full), _mm512_maskz_loadu_ps(tail, y + full));
      _mm512_mask_storeu_ps(y + full, tail, v);
    }
  }
}

/*! \brief Panels [p0, p1) with the plain loop, in the AVX-512 loop's order: even and odd rows summed
 *         apart, then added, then the bias. */
void PanelsPortable(const float* x, const float* panels, const float* bias, float* y, int64_t k, int64_t p0,
                    int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = panels + p * k * kPanelWidth;
    float even[kPanelWidth] = {}, odd[kPanelWidth] = {};
    for (int64_t r = 0; r < k; ++r) {
      float* acc = r % 2 ? odd : even;
      for (int64_t i = 0; i < kPanelWidth; ++i) acc[i] += x[r] * panel[r * kPanelWidth + i];
    }
    for (int64_t i = 0; i < kPanelWidth; ++i) {
      y[p * kPanelWidth + i] = (even[i] + odd[i]) + (bias ? bias[p * kPanelWidth + i] : 0.f);
    }
  }
}

/*! \brief `Count` panels from `first` with AVX-512, the panels read side by side: two accumulators
 *         each (even and odd rows), so 2 x Count independent FMA chains hide the FMA latency when
 *         the weights come from the caches (a small model), not only from DRAM. */
template <int Count>
__attribute__((target("avx512f"))) void PanelGroupAvx512(const float* x, const float* panels, const float* bias,
                                                         float* y, int64_t k, int64_t first) {
  __m512 even[Count], odd[Count];
  const float* panel[Count];
  for (int i = 0; i < Count; ++i) {
    even[i] = _mm512_setzero_ps();
    odd[i] = _mm512_setzero_ps();
    panel[i] = panels + (first + i) * k * kPanelWidth;
  }
  int64_t r = 0;
  for (; r + 2 <= k; r += 2) {
    __m512 a = _mm512_set1_ps(x[r]), b = _mm512_set1_ps(x[r + 1]);
    for (int i = 0; i < Count; ++i) {
      even[i] = _mm512_fmadd_ps(a, _mm512_loadu_ps(panel[i] + r * kPanelWidth), even[i]);
      odd[i] = _mm512_fmadd_ps(b, _mm512_loadu_ps(panel[i] + (r + 1) * kPanelWidth), odd[i]);
    }
  }
  if (r < k) {
    __m512 a = _mm512_set1_ps(x[r]);
    for (int i = 0; i < Count; ++i) even[i] = _mm512_fmadd_ps(a, _mm512_loadu_ps(panel[i] + r * kPanelWidth), even[i]);
  }
  for (int i = 0; i < Count; ++i) {
    __m512 sum = _mm512_add_ps(even[i], odd[i]);
    float* out = y + (first + i) * kPanelWidth;
    _mm512_storeu_ps(out, bias ? _mm512_add_ps(sum, _mm512_loadu_ps(bias + (first + i) * kPanelWidth)) : sum);
  }
}

/*! \brief Panels streamed per group: four side by side read a decode step's weights fastest (two to
 *         eight were within 5% of each other; one stream alone was slowest). */
constexpr int kPanelsPerGroup = 4;

/*! \brief Panels [p0, p1) with AVX-512, in groups of kPanelsPerGroup and then the rest. */
__attribute__((target("avx512f"))) void PanelsAvx512(const float* x, const float* panels, const float* bias, float* y,
                                                     int64_t k, int64_t p0, int64_t p1) {
  int64_t p = p0;
  for (; p + kPanelsPerGroup <= p1; p += kPanelsPerGroup) PanelGroupAvx512<kPanelsPerGroup>(x, panels, bias, y, k, p);
  switch (p1 - p) {
    case 3: return PanelGroupAvx512<3>(x, panels, bias, y, k, p);
    case 2: return PanelGroupAvx512<2>(x, panels, bias, y, k, p);
    case 1: return PanelGroupAvx512<1>(x, panels, bias, y, k, p);
    default: return;
  }
}

bool HasAvx512() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

}  // namespace

void Multiply(const float* x, const float* w, const float* bias, float* y, int64_t k, int64_t n) {
  int64_t blocks = (n + 15) / 16;
  int team = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(blocks)));
  auto columns = HasAvx512() ? ColumnsAvx512 : ColumnsPortable;
  auto share = [&](int me, int threads) {
    int64_t n0 = std::min(n, blocks * me / threads * 16), n1 = std::min(n, blocks * (me + 1) / threads * 16);
    if (n0 < n1) columns(x, w, bias, y, k, n, n0, n1);
  };
  if (team == 1) return share(0, 1);  // no parallel region: libgomp allocates a team for each
#pragma omp parallel num_threads(team)
  share(omp_get_thread_num(), omp_get_num_threads());
}

void MultiplyPanels(const float* x, const float* panels, const float* bias, float* y, int64_t k, int64_t n) {
  int64_t count = n / kPanelWidth;
  int team = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(count)));
  auto run = HasAvx512() ? PanelsAvx512 : PanelsPortable;
  auto share = [&](int me, int threads) {
    int64_t p0 = count * me / threads, p1 = count * (me + 1) / threads;
    if (p0 < p1) run(x, panels, bias, y, k, p0, p1);
  };
  if (team == 1) return share(0, 1);  // no parallel region: libgomp allocates a team for each
#pragma omp parallel num_threads(team)
  share(omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace one_row_matmul
}  // namespace tvm_hetero
