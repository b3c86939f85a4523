/*!
 * \file tvm_hetero/llm/generation_session.h
 * \brief One generation's state and the loop that runs it, as python/tvm_hetero/llm/session.py does:
 *        the KV cache at full capacity (zeroed), the cache mask, and per entry graph a frame with every
 *        input and output bound once (zero copy) to tensors allocated at set-up.
 *
 * After set-up a step writes the chunk's ids, positions and logit row into the bound tensors, runs
 * the frame and copies only the new rows into the cache at the filled position, opening them in the
 * mask (padding rows are never written). Nothing is allocated, looked up or logged per token.
 * A session is used by one thread at a time (a second caller gets "session is busy"); sessions of one
 * model run on several threads at once, sharing the weights.
 */
#ifndef TVM_HETERO_LLM_GENERATION_SESSION_H_
#define TVM_HETERO_LLM_GENERATION_SESSION_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm_hetero/llm/language_model.h>
#include <tvm_hetero/llm/sampler.h>
#include <tvm_hetero/run_frame.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace tvm_hetero {
namespace llm {

/*! \brief What one generation asks for. */
struct GenerationOptions {
  /*! \brief New tokens at most (>= 1). */
  int64_t max_new_tokens = 32;
  /*! \brief Greedy by default. */
  SamplingOptions sampling;
  /*! \brief Generation ends after one of these (yielded); none: the model's end-of-sequence ids. */
  std::optional<std::vector<int32_t>> stop_tokens;
};

/*! \brief Where the last generation's time went. */
struct GenerationTimes {
  /*! \brief Prompt tokens and the seconds their prefill took (sampling the first token included). */
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  /*! \brief Decode steps and their seconds (each: one graph call, the cache write, sampling). */
  int64_t decode_steps = 0;
  double decode_seconds = 0;
};

/*! \brief Called with each new token as soon as it is chosen. */
using TokenCallback = std::function<void(int32_t)>;

/*! \brief A KV cache and a bound frame per entry graph (see the file comment). */
class GenerationSession {
 public:
  /*! \brief Allocate the cache, the mask, the logits and every graph's bound frame. */
  explicit GenerationSession(std::shared_ptr<const LanguageModel> model);
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  /*!
   * \brief Check the prompt and options (errors name the token id and its position, an empty prompt,
   *        both lengths against the capacity, the option), then prefill; tokens come from Next().
   */
  void Start(const std::vector<int64_t>& prompt, const GenerationOptions& options);
  /*! \brief The next new token, or nothing once the generation has ended (stop token or limit). */
  std::optional<int32_t> Next();
  /*! \brief Start, then every token: passed to `on_token` (when given) and returned. */
  std::vector<int32_t> Generate(const std::vector<int64_t>& prompt, const GenerationOptions& options,
                                const TokenCallback& on_token = nullptr);

  /*! \brief Start over with `count` checked ids in chunks; the last row's logits [vocab]. */
  const float* Prefill(const int32_t* ids, int64_t count);
  /*! \brief Append one token (checked: id and room); its logits [vocab]. */
  const float* Decode(int32_t token);

  /*! \brief Rows of the cache holding a token. */
  int64_t filled() const { return filled_; }
  /*! \brief Graph calls made, per graph (the model's order). */
  const std::vector<int64_t>& calls() const { return calls_; }
  /*! \brief The last generation's timings. */
  const GenerationTimes& times() const { return times_; }
  /*! \brief Bytes written into the cache since the session began (new rows only). */
  int64_t cache_bytes_written() const { return cache_bytes_written_; }
  const LanguageModel& model() const { return *model_; }

 private:
  /*! \brief One entry graph's frame with its inputs and outputs bound to this session's tensors. */
  struct BoundGraph {
    /*! \brief Rows per call. */
    int64_t size = 0;
    /*! \brief The frame, every input and output bound. */
    std::unique_ptr<RunFrame> frame;
    /*! \brief Bound inputs the loop writes: tokens [1, n], positions [n], logit_row [1]. */
    int32_t *tokens = nullptr, *positions = nullptr, *logit_row = nullptr;
    /*! \brief Where its run leaves the logits [vocab]: the session's logits, or a packed output's part. */
    const float* logits = nullptr;
    /*! \brief Per layer, the bound outputs of new keys [1, KV, D, n] and values [1, KV, n, D]. */
    std::vector<const float*> new_keys, new_values;
    /*! \brief Every tensor the frame is bound to (kept alive with it). */
    std::vector<tvm::ffi::Tensor> tensors;
  };

  /*! \brief Bind every input and output of graph `graph` (set-up). */
  BoundGraph Bind(const EntryGraph& graph);
  /*! \brief Bind a graph's one packed output (logits, then each layer's new keys and values, flattened). */
  void BindPackedOutput(const EntryGraph& graph, BoundGraph* bound);
  /*! \brief Bind a graph's separate outputs: the session's logits, then new keys and values per layer. */
  void BindSeparateOutputs(const EntryGraph& graph, BoundGraph* bound);
  /*! \brief Run `graph` on `count` ids at the filled position, then append its new rows. */
  void RunChunk(BoundGraph& graph, const int32_t* ids, int64_t count);
  /*! \brief Copy the first `count` new rows of each layer into the cache and open them in the mask. */
  void AppendRows(const BoundGraph& graph, int64_t count);
  /*! \brief Close every cache row (a new prompt). */
  void ResetCache();
  /*! \brief Checks of Start (see there). */
  void CheckRequest(const std::vector<int64_t>& prompt, const GenerationOptions& options) const;

  /*! \brief The model: graphs, shapes, chunk plans (shared; immutable). */
  std::shared_ptr<const LanguageModel> model_;
  /*! \brief Per layer, the key cache [1, KV, D, C] and value cache [1, KV, C, D]. */
  std::vector<tvm::ffi::Tensor> key_cache_, value_cache_;
  /*! \brief The additive mask [1, 1, 1, C] every graph reads: 0 on filled rows, -1e30 elsewhere. */
  tvm::ffi::Tensor cache_mask_;
  /*! \brief The logits [1, 1, vocab] every graph without packed outputs writes (output 0). */
  tvm::ffi::Tensor logits_;
  /*! \brief The intermediate values of whichever graph runs (FrameOptions::scratch). */
  tvm::ffi::Tensor scratch_;
  /*! \brief Per graph (the model's order), the bound frame. */
  std::vector<BoundGraph> bound_;
  /*! \brief For each chunk size 1..largest, its position in bound_ (-1: none). */
  std::vector<int> graph_of_size_;
  /*! \brief Rows filled. */
  int64_t filled_ = 0;
  /*! \brief Graph calls made, per graph. */
  std::vector<int64_t> calls_;
  /*! \brief Bytes of new rows written into the cache. */
  int64_t cache_bytes_written_ = 0;
  /*! \brief Chooses tokens (scratch sized once). */
  Sampler sampler_;
  /*! \brief The current generation: its stop tokens, limit, tokens produced, the last one, whether done. */
  std::vector<int32_t> stop_tokens_;
  int64_t max_new_tokens_ = 0, produced_ = 0;
  int32_t last_token_ = 0;
  bool finished_ = true;
  /*! \brief The current prompt as int32 (capacity reserved at set-up). */
  std::vector<int32_t> prompt_;
  /*! \brief The last generation's timings. */
  GenerationTimes times_;
  /*! \brief A call is in progress (a flag, not a lock). */
  std::atomic<bool> in_use_{false};
  class ExclusiveUse;
};

}  // namespace llm
}  // namespace tvm_hetero

#endif  // TVM_HETERO_LLM_GENERATION_SESSION_H_
