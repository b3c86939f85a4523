/*!
 * \file tvm_hetero/llm/language_model.h
 * \brief An exported language model (format `tvm-hetero-llm/1`, python/tvm_hetero/llm/export.py)
 *        loaded without Python: one GraphRuntime per entry graph, the weights loaded once and shared
 *        by every graph (GraphRuntime::ShareParams), and the chunk plan of every prompt length.
 *
 * Loading checks what export.py's read_exported checks, before anything is parsed: the manifest's
 * format and its own SHA-256, the SHA-256 of every file it lists; then, before any library is
 * loaded, that this CPU has the features the kernels were compiled for (the manifest's
 * "compiled_for", support/cpu_features.h); then that every graph's weights are in params.bin and its
 * data inputs are those of the contract (python/tvm_hetero/llm/graph_io.py).
 * Each error names the file. The model is immutable once loaded; sessions (generation_session.h)
 * run it from several threads at once.
 */
#ifndef TVM_HETERO_LLM_LANGUAGE_MODEL_H_
#define TVM_HETERO_LLM_LANGUAGE_MODEL_H_

#include <tvm_hetero/graph_runtime.h>
#include <tvm_hetero/llm/chunk_plan.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace tvm_hetero {
namespace llm {

/*! \brief The manifest's format this loader reads. */
inline constexpr const char* kExportFormat = "tvm-hetero-llm/1";

/*! \brief What the loop needs of a decoder's configuration (the manifest's "config"). */
struct DecoderShape {
  /*! \brief The Hugging Face model_type ("llama", "qwen2", "gpt2"). */
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t num_layers = 0;
  /*! \brief Key/value heads per layer (the cache's second axis). */
  int64_t num_kv_heads = 0;
  /*! \brief Elements per head. */
  int64_t head_dim = 0;
  /*! \brief Token ids that end a generation by default. */
  std::vector<int32_t> eos_token_ids;
};

/*! \brief One static entry graph: its chunk size and the runtime that runs it. */
struct EntryGraph {
  /*! \brief Rows per call (1: the decode graph). */
  int64_t size = 0;
  /*! \brief "prefill" or "decode". */
  std::string phase;
  /*! \brief Whether its outputs are packed into one [1, total] tensor (a graph with accelerator regions:
   *         the logits, then each layer's new keys and values, flattened; packed_outputs.py). */
  bool packed = false;
  /*! \brief The runtime, its weights loaded or shared with the first graph's. */
  std::unique_ptr<GraphRuntime> runtime;
};

/*! \brief What an export records of the CPU its kernels need (this_cpu.py's compiled_for). */
struct CompiledFor {
  /*! \brief LLVM's name of the CPU they were compiled for ("znver4"). */
  std::string cpu;
  /*! \brief LLVM's names of its features the compilation used. */
  std::vector<std::string> features;
};

/*! \brief An exported language model, loaded (see the file comment). */
class LanguageModel {
 public:
  /*!
   * \brief Load and check the directory `directory` (errors name the file); `num_threads` > 0: the
   *        threads every graph's kernels run on (TVM's pool and oneDNN's OpenMP team), else the defaults.
   *        `cpu_features`: the LLVM feature names of the CPU to check the export's record against, as
   *        if this CPU had exactly those (none: this CPU's, read from the hardware).
   */
  static std::shared_ptr<const LanguageModel> Load(const std::string& directory, int num_threads = 0,
                                                   const std::optional<std::set<std::string>>& cpu_features =
                                                       std::nullopt);

  const DecoderShape& shape() const { return shape_; }
  /*! \brief Tokens the KV cache holds: the prompt plus the new tokens but the last. */
  int64_t capacity() const { return capacity_; }
  /*! \brief The entry graphs, smallest chunk first (the decode graph, size 1, is first). */
  const std::vector<EntryGraph>& graphs() const { return graphs_; }
  /*! \brief The prefill plan of every prompt length up to the capacity. */
  const ChunkPlanner& planner() const { return *planner_; }
  /*! \brief The directory it was loaded from. */
  const std::string& directory() const { return directory_; }
  /*! \brief The device every graph's inputs live on (the host: the loop writes the cache). */
  DLDevice device() const { return device_; }
  /*! \brief Bytes of the weights, held once. */
  int64_t weight_bytes() const { return weight_bytes_; }
  /*! \brief The CPU its kernels were compiled for; none: its architecture's baseline. */
  const std::optional<CompiledFor>& compiled_for() const { return compiled_for_; }

 private:
  LanguageModel() = default;
  /*! \brief Read the configuration, capacity and graph list of the checked manifest. */
  void ReadManifest(const std::string& manifest_text);
  /*! \brief Throw naming the features of compiled_for_ that a CPU with `has` lacks. */
  void CheckRunsOn(const std::set<std::string>& has, bool stated) const;
  /*! \brief Create every graph's runtime and load the weights once, sharing them. */
  void CreateRuntimes(int num_threads);

  /*! \brief The directory it was loaded from. */
  std::string directory_;
  /*! \brief The decoder's shape. */
  DecoderShape shape_;
  /*! \brief KV cache rows. */
  int64_t capacity_ = 0;
  /*! \brief Bytes of the weights. */
  int64_t weight_bytes_ = 0;
  /*! \brief The CPU the kernels need (none recorded: the baseline). */
  std::optional<CompiledFor> compiled_for_;
  /*! \brief One graph's files and devices, as the manifest lists them. */
  struct GraphFiles {
    std::string graph, lib;
    /*! \brief Its parameters beside the weights (those an accelerator's preparation lifted out); "" if none. */
    std::string constants;
    std::vector<DLDevice> devices;
  };
  /*! \brief Per graph in the manifest's order (used while loading). */
  std::vector<GraphFiles> files_;
  /*! \brief The entry graphs, ascending size. */
  std::vector<EntryGraph> graphs_;
  /*! \brief The prefill plans. */
  std::unique_ptr<ChunkPlanner> planner_;
  /*! \brief Where the loop's tensors live. */
  DLDevice device_{kDLCPU, 0};
};

/*!
 * \brief (offset, shape) of each output inside a packed output of `rows` rows: the logits [1, 1, vocab],
 *        then per layer the new keys [1, KV, D, rows] and values [1, KV, rows, D] (packed_outputs.py).
 */
std::vector<std::pair<int64_t, std::vector<int64_t>>> PackedLayout(const DecoderShape& shape, int64_t rows);
/*! \brief Elements of a packed output of `rows` rows. */
int64_t PackedSize(const DecoderShape& shape, int64_t rows);
/*! \brief The whole file `path`; a missing or unreadable file is an error naming it. */
std::string ReadWholeFile(const std::string& path);

}  // namespace llm
}  // namespace tvm_hetero

#endif  // TVM_HETERO_LLM_LANGUAGE_MODEL_H_
