/*!
 * \file tvm_hetero/llm/sampler.h
 * \brief Choosing the next token from a row of logits: greedy, or sampled with temperature, top-k
 *        and top-p (python/tvm_hetero/llm/sampling.py's rules).
 *
 * Greedy (temperature 0) is argmax, the lowest index among equal maxima (as numpy and transformers).
 * Sampling draws from SplitMix64 (Steele, Lea and Flood 2014; a 64-bit state, each draw's top 53 bits
 * as a double in [0, 1)), seeded with the seed: the same seed gives the same tokens on every platform.
 * The draws are not numpy's, so sampled tokens differ from the Python loop's for the same seed.
 * The scratch space is sized once for the vocabulary; choosing a token allocates nothing.
 */
#ifndef TVM_HETERO_LLM_SAMPLER_H_
#define TVM_HETERO_LLM_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace tvm_hetero {
namespace llm {

/*! \brief How tokens are chosen; the defaults are greedy. */
struct SamplingOptions {
  /*! \brief 0: greedy; > 0: logits are divided by it and a token is drawn. */
  double temperature = 0.0;
  /*! \brief Draw among the k most likely tokens only (0: all). */
  int64_t top_k = 0;
  /*! \brief Draw among the smallest most-likely prefix whose probability reaches top_p (1: all). */
  double top_p = 1.0;
  /*! \brief The generator's seed (none: a random one). */
  std::optional<uint64_t> seed;
};

/*! \brief SplitMix64: a stated, portable generator (see the file comment). */
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed = 0) : state_(seed) {}
  uint64_t Next();
  /*! \brief A double uniform in [0, 1) from the top 53 bits of the next draw. */
  double Uniform();

 private:
  /*! \brief The generator's whole state. */
  uint64_t state_;
};

/*! \brief Picks token ids from logits (see the file comment). */
class Sampler {
 public:
  /*! \brief Scratch space for a vocabulary of `vocab_size` tokens. */
  explicit Sampler(int64_t vocab_size);
  /*! \brief Check `options` (an error names the option) and start drawing with them. */
  void Reset(const SamplingOptions& options);
  /*! \brief The next token from `logits` [vocab_size]. */
  int32_t Choose(const float* logits);
  /*! \brief The index of the largest logit (the lowest on ties). */
  static int32_t Argmax(const float* logits, int64_t count);

 private:
  /*! \brief Tokens in the vocabulary. */
  int64_t vocab_size_;
  /*! \brief The options of the current generation. */
  SamplingOptions options_;
  /*! \brief The draws of the current generation. */
  SplitMix64 rng_;
  /*! \brief Token ids, most likely first (scratch). */
  std::vector<int32_t> order_;
  /*! \brief Scaled logits, then the kept tokens' cumulative probabilities (scratch). */
  std::vector<double> scaled_, cumulative_;
};

}  // namespace llm
}  // namespace tvm_hetero

#endif  // TVM_HETERO_LLM_SAMPLER_H_
