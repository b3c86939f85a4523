// The matmul kernels of tvm_hetero.llm's decode and 8-bit weights (src/backends/int8_matmul.h,
// one_row_matmul.h: rows and panels) against plain reference loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include <omp.h>

#include "backends/int8_matmul.h"
#include "backends/one_row_matmul.h"

namespace tvm_hetero {
namespace {

struct Int8Case {
  int64_t rows, in, out;
  bool bias;
};

class Int8MatmulTest : public ::testing::TestWithParam<Int8Case> {};

// Rows made of multiples of 1/8 whose largest magnitude is 127/8: the kernel's quantization is then
// exact (scale 1/8, q = 8x), so its output must equal the integer dot products scaled, bit for bit
// up to the one float rounding of the final product.
TEST_P(Int8MatmulTest, EqualsIntegerDotProductsOfExactlyQuantizedRows) {
  const Int8Case c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.rows * 131 + c.in * 7 + c.out));
  std::uniform_int_distribution<int> byte(0, 255), q(-127, 127);
  std::vector<uint8_t> w(c.out * c.in);
  for (auto& v : w) v = static_cast<uint8_t>(byte(rng));
  std::vector<float> scales(c.out), bias(c.out), x(c.rows * c.in), y(c.rows * c.out, -1.f);
  for (int64_t n = 0; n < c.out; ++n) scales[n] = 0.01f * static_cast<float>(1 + n % 7);
  for (int64_t n = 0; n < c.out; ++n) bias[n] = 0.5f * static_cast<float>(n % 5) - 1.f;
  std::vector<int> qs(c.rows * c.in);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t k = 0; k < c.in; ++k) qs[r * c.in + k] = q(rng);
    qs[r * c.in + (r % c.in)] = (r % 2) ? 127 : -127;  // the row's largest magnitude is 127
    for (int64_t k = 0; k < c.in; ++k) x[r * c.in + k] = static_cast<float>(qs[r * c.in + k]) / 8.f;
  }
  int8_matmul::Weights weights;
  weights.data = w.data();
  weights.scales = scales.data();
  weights.bias = c.bias ? bias.data() : nullptr;
  weights.out = c.out;
  weights.in = c.in;
  size_t bytes = (int8_matmul::ScratchBytes(c.rows, c.in) + 63) / 64 * 64;
  void* scratch = std::aligned_alloc(64, bytes);
  int8_matmul::Multiply(x.data(), c.rows, weights, y.data(), scratch);
  std::free(scratch);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t n = 0; n < c.out; ++n) {
      int64_t dot = 0;
      for (int64_t k = 0; k < c.in; ++k) dot += (static_cast<int64_t>(w[n * c.in + k]) - 128) * qs[r * c.in + k];
      double want = dot / 8.0 * scales[n] + (c.bias ? bias[n] : 0.f);
      ASSERT_NEAR(y[r * c.out + n], want, 1e-6 * std::fabs(want) + 1e-6) << "row " << r << ", output " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8MatmulTest,
                         ::testing::Values(Int8Case{1, 64, 16, false}, Int8Case{1, 100, 37, true},
                                           Int8Case{1, 576, 960, false}, Int8Case{3, 130, 21, true},
                                           Int8Case{4, 64, 64, false}, Int8Case{9, 1536, 48, true}));

TEST(OneRowMatmul, EqualsAPlainLoopOnTheStoredLayout) {
  for (auto [k, n] : {std::pair<int64_t, int64_t>{576, 960}, {7, 37}, {1536, 576}, {130, 16}}) {
    std::mt19937 rng(static_cast<unsigned>(k + n));
    std::normal_distribution<float> normal;
    std::vector<float> w(k * n), x(k), bias(n), y(n);
    for (auto& v : w) v = normal(rng);
    for (auto& v : x) v = normal(rng);
    for (auto& v : bias) v = normal(rng);
    one_row_matmul::Multiply(x.data(), w.data(), bias.data(), y.data(), k, n);
    for (int64_t c = 0; c < n; ++c) {
      double want = bias[c];
      for (int64_t r = 0; r < k; ++r) want += static_cast<double>(x[r]) * w[r * n + c];
      ASSERT_NEAR(y[c], want, 1e-4 * (1.0 + std::fabs(want))) << "k " << k << ", n " << n << ", output " << c;
    }
  }
}

// Panels (N / 16, K, 16): group sizes 4, 3, 2 and 1 all reached (1, 2, 3, 5, 7 and 60 panels), with
// and without a bias, on one thread and on a team of two.
TEST(OneRowMatmul, PanelsEqualAPlainLoopOverTheColumnsTheyHold) {
  const int64_t width = one_row_matmul::kPanelWidth;
  for (int threads : {1, 2}) {
    for (auto [k, panels] : {std::pair<int64_t, int64_t>{576, 60}, {16, 1}, {64, 2}, {48, 3}, {1536, 5}, {32, 7}}) {
      int64_t n = panels * width;
      std::mt19937 rng(static_cast<unsigned>(k * 3 + n));
      std::normal_distribution<float> normal;
      std::vector<float> w(k * n), stored(k * n), x(k), bias(n), y(n, NAN);
      for (auto& v : w) v = normal(rng);
      for (auto& v : x) v = normal(rng);
      for (auto& v : bias) v = normal(rng);
      for (int64_t r = 0; r < k; ++r) {
        for (int64_t c = 0; c < n; ++c) stored[((c / width) * k + r) * width + c % width] = w[r * n + c];
      }
      bool with_bias = panels % 2 == 1;
      omp_set_num_threads(threads);
      one_row_matmul::MultiplyPanels(x.data(), stored.data(), with_bias ? bias.data() : nullptr, y.data(), k, n);
      for (int64_t c = 0; c < n; ++c) {
        double want = with_bias ? bias[c] : 0.0;
        for (int64_t r = 0; r < k; ++r) want += static_cast<double>(x[r]) * w[r * n + c];
        ASSERT_NEAR(y[c], want, 1e-4 * (1.0 + std::fabs(want)))
            << threads << " thread(s), k " << k << ", n " << n << ", output " << c;
      }
    }
  }
  omp_set_num_threads(1);
}

}  // namespace
}  // namespace tvm_hetero
