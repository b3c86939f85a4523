/*!
 * \file llm/generation_session.cc
 * \brief The generation loop (tvm_hetero/llm/generation_session.h): set-up binds everything once;
 *        prefill, decode and sampling then only write integers, run frames and copy new rows.
 */
#include <tvm/ffi/error.h>
#include <tvm_hetero/llm/generation_session.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "support/device.h"

namespace tvm_hetero {
namespace llm {

namespace ffi = tvm::ffi;

namespace {

/*! \brief Added to a score to exclude it (graph_io.py's MASKED): finite, so masked rows stay NaN-free. */
constexpr float kMasked = -1e30f;
constexpr DLDataType kInt32{kDLInt, 32, 1};
constexpr DLDataType kFloat32{kDLFloat, 32, 1};

/*! \brief A zeroed tensor on `device` that frames bind without a copy. */
ffi::Tensor ZeroedTensor(std::vector<int64_t> shape, DLDataType dtype, DLDevice device) {
  ffi::Tensor tensor = support::AllocTensor(ffi::Shape(std::move(shape)), dtype, device);
  std::memset(tensor.data_ptr(), 0, ffi::GetDataSize(*tensor.GetDLTensorPtr()));
  return tensor;
}

template <typename T>
T* DataOf(const ffi::Tensor& tensor) {
  return static_cast<T*>(tensor.data_ptr());
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

/*! \brief Holds the session's in-use flag for one call; a second caller is refused. */
class GenerationSession::ExclusiveUse {
 public:
  explicit ExclusiveUse(GenerationSession* session) : session_(session) {
    if (session_->in_use_.exchange(true, std::memory_order_acquire)) {
      TVM_FFI_THROW(RuntimeError) << "generation session is busy: another thread is using it (make a session per thread)";
    }
  }
  ~ExclusiveUse() { session_->in_use_.store(false, std::memory_order_release); }

 private:
  GenerationSession* session_;
};

GenerationSession::GenerationSession(std::shared_ptr<const LanguageModel> model)
    : model_(std::move(model)), sampler_(model_->shape().vocab_size) {
  const DecoderShape& shape = model_->shape();
  int64_t capacity = model_->capacity();
  DLDevice device = model_->device();
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    key_cache_.push_back(ZeroedTensor({1, shape.num_kv_heads, shape.head_dim, capacity}, kFloat32, device));
    value_cache_.push_back(ZeroedTensor({1, shape.num_kv_heads, capacity, shape.head_dim}, kFloat32, device));
  }
  cache_mask_ = ZeroedTensor({1, 1, 1, capacity}, kFloat32, device);
  logits_ = ZeroedTensor({1, 1, shape.vocab_size}, kFloat32, device);
  ResetCache();
  // One graph runs at a time, so the graphs' intermediate values share one scratch: the session
  // holds the largest graph's, not their sum.
  int64_t scratch_bytes = 1;
  for (const EntryGraph& graph : model_->graphs()) {
    scratch_bytes = std::max(scratch_bytes, graph.runtime->ScratchBytes(device));
  }
  scratch_ = support::AllocTensor(ffi::Shape({scratch_bytes}), DLDataType{kDLUInt, 8, 1}, device);
  int64_t largest = model_->graphs().back().size;
  graph_of_size_.assign(largest + 1, -1);
  for (const EntryGraph& graph : model_->graphs()) {
    graph_of_size_[graph.size] = static_cast<int>(bound_.size());
    bound_.push_back(Bind(graph));
  }
  calls_.assign(bound_.size(), 0);
  prompt_.reserve(capacity);
}

GenerationSession::~GenerationSession() = default;

GenerationSession::BoundGraph GenerationSession::Bind(const EntryGraph& graph) {
  const DecoderShape& shape = model_->shape();
  const GraphRuntime& runtime = *graph.runtime;
  DLDevice device = model_->device();
  int64_t n = graph.size;
  BoundGraph bound;
  bound.size = n;
  FrameOptions options;
  options.scratch = scratch_;
  bound.frame = runtime.Frame(options);
  auto bind_input = [&](const std::string& name, const ffi::Tensor& tensor) {
    int index = runtime.GetInputIndex(name);
    if (index < 0) {
      TVM_FFI_THROW(ValueError) << model_->directory() << ": the graph of chunk size " << n << " has no input '"
                                << name << "' (python/tvm_hetero/llm/graph_io.py's contract)";
    }
    bound.frame->BindInput(index, tensor);  // checks shape and dtype, naming the input
    bound.tensors.push_back(tensor);
  };
  ffi::Tensor tokens = ZeroedTensor({1, n}, kInt32, device);
  ffi::Tensor positions = ZeroedTensor({n}, kInt32, device);
  ffi::Tensor logit_row = ZeroedTensor({1}, kInt32, device);
  ffi::Tensor chunk_mask = ZeroedTensor({n, n}, kFloat32, device);
  float* causal = DataOf<float>(chunk_mask);
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t col = row + 1; col < n; ++col) causal[row * n + col] = kMasked;
  }
  bind_input("tokens", tokens);
  bind_input("positions", positions);
  bind_input("logit_row", logit_row);
  bind_input("cache_mask", cache_mask_);
  bind_input("chunk_mask", chunk_mask);
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    bind_input("cache." + std::to_string(layer) + ".k", key_cache_[layer]);
    bind_input("cache." + std::to_string(layer) + ".v", value_cache_[layer]);
  }
  if (graph.packed) {
    BindPackedOutput(graph, &bound);
  } else {
    BindSeparateOutputs(graph, &bound);
  }
  bound.tokens = DataOf<int32_t>(tokens);
  bound.positions = DataOf<int32_t>(positions);
  bound.logit_row = DataOf<int32_t>(logit_row);
  bound.tensors.insert(bound.tensors.end(), {tokens, positions, logit_row, chunk_mask});
  return bound;
}

void GenerationSession::BindPackedOutput(const EntryGraph& graph, BoundGraph* bound) {
  const DecoderShape& shape = model_->shape();
  int64_t n = graph.size;
  if (graph.runtime->NumOutputs() != 1) {
    TVM_FFI_THROW(ValueError) << model_->directory() << ": the graph of chunk size " << n << " has "
                              << graph.runtime->NumOutputs() << " outputs; a graph with packed outputs has 1";
  }
  ffi::Tensor packed = ZeroedTensor({1, PackedSize(shape, n)}, kFloat32, model_->device());
  bound->frame->BindOutput(0, packed);
  const float* base = DataOf<float>(packed);
  auto layout = PackedLayout(shape, n);
  bound->logits = base + layout[0].first;
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    bound->new_keys.push_back(base + layout[1 + 2 * layer].first);
    bound->new_values.push_back(base + layout[2 + 2 * layer].first);
  }
  bound->tensors.push_back(packed);
}

void GenerationSession::BindSeparateOutputs(const EntryGraph& graph, BoundGraph* bound_graph) {
  const DecoderShape& shape = model_->shape();
  const GraphRuntime& runtime = *graph.runtime;
  DLDevice device = model_->device();
  int64_t n = graph.size;
  BoundGraph& bound = *bound_graph;
  int64_t outputs = 1 + 2 * shape.num_layers;
  if (runtime.NumOutputs() != outputs) {
    TVM_FFI_THROW(ValueError) << model_->directory() << ": the graph of chunk size " << n << " has "
                              << runtime.NumOutputs() << " outputs; the contract has " << outputs
                              << " (logits, then new keys and values per layer)";
  }
  bound.frame->BindOutput(0, logits_);
  bound.logits = DataOf<float>(logits_);
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    ffi::Tensor keys = ZeroedTensor({1, shape.num_kv_heads, shape.head_dim, n}, kFloat32, device);
    ffi::Tensor values = ZeroedTensor({1, shape.num_kv_heads, n, shape.head_dim}, kFloat32, device);
    bound.frame->BindOutput(static_cast<int>(1 + 2 * layer), keys);
    bound.frame->BindOutput(static_cast<int>(2 + 2 * layer), values);
    bound.new_keys.push_back(DataOf<float>(keys));
    bound.new_values.push_back(DataOf<float>(values));
    bound.tensors.push_back(keys);
    bound.tensors.push_back(values);
  }
}

void GenerationSession::ResetCache() {
  std::fill_n(DataOf<float>(cache_mask_), model_->capacity(), kMasked);
  filled_ = 0;
}

void GenerationSession::AppendRows(const BoundGraph& graph, int64_t count) {
  const DecoderShape& shape = model_->shape();
  int64_t capacity = model_->capacity(), n = graph.size, heads = shape.num_kv_heads, dim = shape.head_dim;
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    float* keys = DataOf<float>(key_cache_[layer]);
    float* values = DataOf<float>(value_cache_[layer]);
    // Keys are stored transposed: per (head, dim) a run of `count` positions.
    for (int64_t row = 0; row < heads * dim; ++row) {
      std::memcpy(keys + row * capacity + filled_, graph.new_keys[layer] + row * n, count * sizeof(float));
    }
    for (int64_t head = 0; head < heads; ++head) {
      std::memcpy(values + (head * capacity + filled_) * dim, graph.new_values[layer] + head * n * dim,
                  count * dim * sizeof(float));
    }
  }
  cache_bytes_written_ += 2 * shape.num_layers * heads * dim * count * static_cast<int64_t>(sizeof(float));
  std::fill_n(DataOf<float>(cache_mask_) + filled_, count, 0.0f);
  filled_ += count;
}

void GenerationSession::RunChunk(BoundGraph& graph, const int32_t* ids, int64_t count) {
  int64_t last_position = model_->capacity() - 1;
  for (int64_t row = 0; row < graph.size; ++row) {
    graph.tokens[row] = row < count ? ids[row] : 0;
    // Padding rows keep a position inside the tables; their results are never written.
    graph.positions[row] = static_cast<int32_t>(std::min(filled_ + row, last_position));
  }
  graph.logit_row[0] = static_cast<int32_t>(count - 1);
  graph.frame->Run();
  AppendRows(graph, count);
}

const float* GenerationSession::Prefill(const int32_t* ids, int64_t count) {
  if (count < 1 || count > model_->capacity()) {
    TVM_FFI_THROW(ValueError) << "prefill: " << count << " tokens do not fit the cache capacity of "
                              << model_->capacity() << " tokens";
  }
  ResetCache();
  const ChunkPlanner& planner = model_->planner();
  const float* logits = nullptr;
  for (int64_t start = 0; start < count;) {
    Chunk chunk = planner.First(count - start);
    int index = graph_of_size_[chunk.size];
    RunChunk(bound_[index], ids + start, chunk.rows);
    ++calls_[index];
    start += chunk.rows;
    logits = bound_[index].logits;
  }
  return logits;
}

const float* GenerationSession::Decode(int32_t token) {
  if (token < 0 || token >= model_->shape().vocab_size) {
    TVM_FFI_THROW(ValueError) << "decode: token id " << token << " is outside the vocabulary [0, "
                              << model_->shape().vocab_size << ")";
  }
  if (filled_ >= model_->capacity()) {
    TVM_FFI_THROW(ValueError) << "decode: the cache is full (" << model_->capacity() << " tokens, its capacity)";
  }
  BoundGraph& graph = bound_[graph_of_size_[1]];
  graph.tokens[0] = token;
  graph.positions[0] = static_cast<int32_t>(filled_);
  graph.logit_row[0] = 0;
  graph.frame->Run();
  AppendRows(graph, 1);
  ++calls_[graph_of_size_[1]];
  return graph.logits;
}

void GenerationSession::CheckRequest(const std::vector<int64_t>& prompt, const GenerationOptions& options) const {
  int64_t vocab = model_->shape().vocab_size, capacity = model_->capacity();
  if (prompt.empty()) TVM_FFI_THROW(ValueError) << "prompt_ids: the prompt is empty (at least one token is needed)";
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      TVM_FFI_THROW(ValueError) << "prompt_ids: token id " << prompt[i] << " at position " << i
                                << " is outside the vocabulary [0, " << vocab << ")";
    }
  }
  int64_t length = static_cast<int64_t>(prompt.size());
  if (length > capacity) {
    TVM_FFI_THROW(ValueError) << "prompt_ids: a prompt of " << length << " tokens exceeds the cache capacity of "
                              << capacity << " tokens";
  }
  if (options.max_new_tokens < 1) {
    TVM_FFI_THROW(ValueError) << "max_new_tokens must be a positive integer, got " << options.max_new_tokens;
  }
  int64_t needed = length + options.max_new_tokens - 1;  // the last new token is never fed back
  if (needed > capacity) {
    TVM_FFI_THROW(ValueError) << "a prompt of " << length << " tokens and " << options.max_new_tokens
                              << " new tokens need " << needed << " cache rows; the cache capacity is " << capacity
                              << " tokens (export with a larger capacity)";
  }
}

void GenerationSession::Start(const std::vector<int64_t>& prompt, const GenerationOptions& options) {
  ExclusiveUse use(this);
  finished_ = true;  // until the prefill has succeeded
  CheckRequest(prompt, options);
  sampler_.Reset(options.sampling);
  const std::vector<int32_t>& stops = options.stop_tokens ? *options.stop_tokens : model_->shape().eos_token_ids;
  stop_tokens_.assign(stops.begin(), stops.end());
  prompt_.assign(prompt.begin(), prompt.end());
  max_new_tokens_ = options.max_new_tokens;
  produced_ = 0;
  times_ = GenerationTimes();
  times_.prompt_tokens = static_cast<int64_t>(prompt_.size());
  auto start = std::chrono::steady_clock::now();
  const float* logits = Prefill(prompt_.data(), static_cast<int64_t>(prompt_.size()));
  last_token_ = sampler_.Choose(logits);
  times_.prefill_seconds = SecondsSince(start);
  finished_ = false;
}

std::optional<int32_t> GenerationSession::Next() {
  ExclusiveUse use(this);
  if (finished_) return std::nullopt;
  if (produced_ > 0) {  // the previous token goes in; the next comes out
    auto start = std::chrono::steady_clock::now();
    last_token_ = sampler_.Choose(Decode(last_token_));
    times_.decode_seconds += SecondsSince(start);
    ++times_.decode_steps;
  }
  ++produced_;
  bool stop = std::find(stop_tokens_.begin(), stop_tokens_.end(), last_token_) != stop_tokens_.end();
  finished_ = stop || produced_ == max_new_tokens_;
  return last_token_;
}

std::vector<int32_t> GenerationSession::Generate(const std::vector<int64_t>& prompt, const GenerationOptions& options,
                                                 const TokenCallback& on_token) {
  Start(prompt, options);
  std::vector<int32_t> tokens;
  tokens.reserve(options.max_new_tokens);
  while (std::optional<int32_t> token = Next()) {
    tokens.push_back(*token);
    if (on_token) on_token(*token);
  }
  return tokens;
}

}  // namespace llm
}  // namespace tvm_hetero
