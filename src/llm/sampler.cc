/*!
 * \file llm/sampler.cc
 * \brief Greedy and sampled token choice (tvm_hetero/llm/sampler.h).
 */
#include <tvm/ffi/error.h>
#include <tvm_hetero/llm/sampler.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace tvm_hetero {
namespace llm {

uint64_t SplitMix64::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double SplitMix64::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

Sampler::Sampler(int64_t vocab_size)
    : vocab_size_(vocab_size), order_(vocab_size), scaled_(vocab_size), cumulative_(vocab_size) {}

void Sampler::Reset(const SamplingOptions& options) {
  if (!std::isfinite(options.temperature) || options.temperature < 0) {
    TVM_FFI_THROW(ValueError) << "temperature must be a finite number >= 0, got " << options.temperature;
  }
  if (options.top_k < 0) TVM_FFI_THROW(ValueError) << "top_k must be a positive integer, got " << options.top_k;
  if (!(options.top_p > 0.0 && options.top_p <= 1.0)) {
    TVM_FFI_THROW(ValueError) << "top_p must be in (0, 1], got " << options.top_p;
  }
  if (options.temperature == 0 && (options.top_k > 0 || options.top_p < 1.0)) {
    TVM_FFI_THROW(ValueError) << "top_k and top_p choose among sampled tokens: give a temperature > 0 as well";
  }
  options_ = options;
  rng_ = SplitMix64(options.seed ? *options.seed : std::random_device()());
}

int32_t Sampler::Argmax(const float* logits, int64_t count) {
  int64_t best = 0;
  for (int64_t i = 1; i < count; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

int32_t Sampler::Choose(const float* logits) {
  if (options_.temperature == 0) return Argmax(logits, vocab_size_);
  for (int64_t i = 0; i < vocab_size_; ++i) {
    scaled_[i] = static_cast<double>(logits[i]) / options_.temperature;
    order_[i] = static_cast<int32_t>(i);
  }
  // Most likely first, the lower id first among equals (numpy's stable argsort of -scaled).
  auto more_likely = [this](int32_t a, int32_t b) { return scaled_[a] > scaled_[b] || (scaled_[a] == scaled_[b] && a < b); };
  int64_t kept = options_.top_k > 0 ? std::min(options_.top_k, vocab_size_) : vocab_size_;
  std::partial_sort(order_.begin(), order_.begin() + kept, order_.end(), more_likely);
  double total = 0;
  for (int64_t i = 0; i < kept; ++i) {
    total += std::exp(scaled_[order_[i]] - scaled_[order_[0]]);
    cumulative_[i] = total;
  }
  if (options_.top_p < 1.0) {  // the smallest prefix whose probability reaches top_p
    int64_t reach = 0;
    while (reach < kept - 1 && cumulative_[reach] / total < options_.top_p) ++reach;
    kept = reach + 1;
    total = cumulative_[reach];
  }
  double target = rng_.Uniform() * total;
  int64_t pick = 0;
  while (pick < kept - 1 && cumulative_[pick] <= target) ++pick;
  return order_[pick];
}

}  // namespace llm
}  // namespace tvm_hetero
