/*!
 * \file llm/language_model.cc
 * \brief Loading an exported language model (tvm_hetero/llm/language_model.h): checks first, then one
 *        runtime per entry graph with the weights held once.
 */
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm_hetero/llm/language_model.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "llm/python_json.h"
#include "llm/sha256.h"
#include "support/cpu_features.h"
#include "support/device.h"
#include "support/json_reader.h"

namespace tvm_hetero {
namespace llm {

namespace ffi = tvm::ffi;
namespace json = tvm::ffi::json;

namespace {

constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kParamsFile = "params.bin";
/*! \brief The manifest's checksum of itself (artifact.py's MANIFEST_DIGEST_KEY). */
constexpr const char* kManifestDigestKey = "manifest_sha256";

/*! \brief Whether `name` is a data input of the contract (graph_io.py's data_inputs). */
bool IsDataInput(const std::string& name) {
  static const std::set<std::string> fixed = {"tokens", "positions", "logit_row", "cache_mask", "chunk_mask"};
  if (fixed.count(name)) return true;
  return name.rfind("cache.", 0) == 0 && (name.size() > 2 && (name.substr(name.size() - 2) == ".k" ||
                                                              name.substr(name.size() - 2) == ".v"));
}

/*! \brief The manifest's own checksum and every listed file's, as artifact.py verifies them. */
void VerifyChecksums(const std::string& directory, const json::Object& manifest, const support::JsonReader& reader) {
  json::Object body;
  for (const auto& [key, value] : manifest) {
    if (key.cast<ffi::String>() != kManifestDigestKey) body.Set(key, value);
  }
  auto recorded = support::JsonReader::Find(manifest, kManifestDigestKey);
  if (!recorded || recorded->try_cast<ffi::String>().value_or("") != Sha256Hex(PythonJsonDumps(body))) {
    TVM_FFI_THROW(ValueError) << directory << "/" << kManifestFile
                              << ": checksum mismatch: the manifest is damaged or was edited after export";
  }
  json::Object files = reader.Object(reader.Require(manifest, "files", "manifest"), "files");
  for (const auto& [name, digest] : files) {
    std::string path = directory + "/" + std::string(name.cast<ffi::String>());
    std::string expected = reader.String(digest, "files['" + std::string(name.cast<ffi::String>()) + "']");
    if (Sha256Hex(ReadWholeFile(path)) != expected) {
      TVM_FFI_THROW(ValueError) << path << ": checksum mismatch: the file is damaged or was changed after export";
    }
  }
}

/*! \brief Check a graph's recorded packed-output layout ([[offset, shape]...]) against the shape's. */
void CheckPackedLayout(const ffi::Any& recorded, const DecoderShape& shape, int64_t rows,
                       const support::JsonReader& reader, const std::string& where) {
  json::Array items = reader.Array(recorded, where);
  auto expected = PackedLayout(shape, rows);
  bool same = items.size() == expected.size();
  for (size_t i = 0; same && i < items.size(); ++i) {
    json::Array pair = reader.Array(items[i], where + "[" + std::to_string(i) + "]");
    same = pair.size() == 2 && reader.Int(pair[0], where) == expected[i].first &&
           reader.IntList(pair[1], where) == expected[i].second;
  }
  if (!same) {
    reader.Fail(where, "the packed-output layout differs from the one the configuration gives (logits, then each "
                       "layer's new keys and values, flattened)");
  }
}

}  // namespace

std::vector<std::pair<int64_t, std::vector<int64_t>>> PackedLayout(const DecoderShape& shape, int64_t rows) {
  std::vector<std::vector<int64_t>> shapes = {{1, 1, shape.vocab_size}};
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    shapes.push_back({1, shape.num_kv_heads, shape.head_dim, rows});
    shapes.push_back({1, shape.num_kv_heads, rows, shape.head_dim});
  }
  std::vector<std::pair<int64_t, std::vector<int64_t>>> layout;
  int64_t offset = 0;
  for (auto& s : shapes) {
    int64_t elements = 1;
    for (int64_t d : s) elements *= d;
    layout.emplace_back(offset, std::move(s));
    offset += elements;
  }
  return layout;
}

int64_t PackedSize(const DecoderShape& shape, int64_t rows) {
  return 1 * shape.vocab_size + 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * rows;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TVM_FFI_THROW(ValueError) << path << ": missing or unreadable";
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::shared_ptr<const LanguageModel> LanguageModel::Load(const std::string& directory, int num_threads,
                                                         const std::optional<std::set<std::string>>& cpu_features) {
  if (num_threads < 0) {
    TVM_FFI_THROW(ValueError) << directory << ": num_threads must be positive (0: the defaults), got " << num_threads;
  }
  std::shared_ptr<LanguageModel> model(new LanguageModel());
  model->directory_ = directory;
  std::ifstream probe(directory + "/" + kManifestFile);
  if (!probe) {
    TVM_FFI_THROW(ValueError) << directory << ": not an exported language model (no " << kManifestFile << ")";
  }
  model->ReadManifest(ReadWholeFile(directory + "/" + kManifestFile));
  model->CheckRunsOn(cpu_features ? *cpu_features : support::ThisCpuFeatures(), cpu_features.has_value());
  model->CreateRuntimes(num_threads);
  model->planner_ = std::make_unique<ChunkPlanner>(
      [&] {
        std::vector<int64_t> sizes;
        for (const EntryGraph& g : model->graphs_) sizes.push_back(g.size);
        return sizes;
      }(),
      model->capacity_);
  return model;
}

void LanguageModel::ReadManifest(const std::string& manifest_text) {
  std::string path = directory_ + "/" + kManifestFile;
  support::JsonReader reader(path);
  json::Object manifest = reader.Object(reader.Parse(manifest_text), "manifest");
  auto format = support::JsonReader::Find(manifest, "format");
  std::string found = format && format->try_cast<ffi::String>() ? std::string(format->cast<ffi::String>()) : "none";
  if (found != kExportFormat) {
    TVM_FFI_THROW(ValueError) << path << ": format '" << found << "'; this tvm-hetero reads " << kExportFormat;
  }
  VerifyChecksums(directory_, manifest, reader);

  json::Object config = reader.Object(reader.Require(manifest, "config", "manifest"), "config");
  shape_.model_type = reader.String(reader.Require(config, "model_type", "config"), "config.model_type");
  shape_.vocab_size = reader.Int(reader.Require(config, "vocab_size", "config"), "config.vocab_size");
  shape_.num_layers = reader.Int(reader.Require(config, "num_layers", "config"), "config.num_layers");
  shape_.num_kv_heads = reader.Int(reader.Require(config, "num_kv_heads", "config"), "config.num_kv_heads");
  shape_.head_dim = reader.Int(reader.Require(config, "head_dim", "config"), "config.head_dim");
  if (auto eos = support::JsonReader::Find(config, "eos_token_ids")) {
    for (int64_t id : reader.IntList(*eos, "config.eos_token_ids")) shape_.eos_token_ids.push_back(static_cast<int32_t>(id));
  }
  auto compiled_for = support::JsonReader::Find(manifest, "compiled_for");
  if (compiled_for && compiled_for->type_index() != ffi::TypeIndex::kTVMFFINone) {
    json::Object record = reader.Object(*compiled_for, "compiled_for");
    CompiledFor cpu;
    cpu.cpu = reader.String(reader.Require(record, "cpu", "compiled_for"), "compiled_for.cpu");
    json::Array features = reader.Array(reader.Require(record, "features", "compiled_for"), "compiled_for.features");
    for (size_t i = 0; i < features.size(); ++i) {
      cpu.features.push_back(reader.String(features[i], "compiled_for.features[" + std::to_string(i) + "]"));
    }
    compiled_for_ = std::move(cpu);
  }
  capacity_ = reader.Int(reader.Require(manifest, "capacity", "manifest"), "capacity");
  weight_bytes_ = reader.Int(reader.Require(manifest, "weight_bytes", "manifest"), "weight_bytes");
  if (shape_.vocab_size < 1 || shape_.num_layers < 1 || shape_.num_kv_heads < 1 || shape_.head_dim < 1 || capacity_ < 1) {
    reader.Fail("config", "sizes must be positive");
  }
  json::Array graphs = reader.Array(reader.Require(manifest, "graphs", "manifest"), "graphs");
  if (graphs.empty()) reader.Fail("graphs", "no entry graph");
  for (size_t i = 0; i < graphs.size(); ++i) {
    std::string where = "graphs[" + std::to_string(i) + "]";
    json::Object entry = reader.Object(graphs[i], where);
    EntryGraph graph;
    graph.size = reader.Int(reader.Require(entry, "size", where), where + ".size");
    graph.phase = reader.String(reader.Require(entry, "phase", where), where + ".phase");
    if (graph.size < 1 || graph.size > capacity_) {
      reader.Fail(where + ".size", "chunk size " + std::to_string(graph.size) + " is outside 1.." + std::to_string(capacity_));
    }
    GraphFiles files;
    files.graph = reader.String(reader.Require(entry, "graph", where), where + ".graph");
    files.lib = reader.String(reader.Require(entry, "lib", where), where + ".lib");
    json::Array devices = reader.Array(reader.Require(entry, "devices", where), where + ".devices");
    for (size_t d = 0; d < devices.size(); ++d) {
      std::vector<int64_t> pair = reader.IntList(devices[d], where + ".devices[" + std::to_string(d) + "]");
      if (pair.size() != 2) reader.Fail(where + ".devices", "each device is [type, index]");
      files.devices.push_back(DLDevice{static_cast<DLDeviceType>(pair[0]), static_cast<int32_t>(pair[1])});
    }
    if (files.devices.empty()) reader.Fail(where + ".devices", "no device");
    // Graphs built for an accelerator (accelerator_export.py): one packed output, constants of their own.
    auto layout = support::JsonReader::Find(entry, "packed_layout");
    if (layout && layout->type_index() != ffi::TypeIndex::kTVMFFINone) {
      CheckPackedLayout(*layout, shape_, graph.size, reader, where + ".packed_layout");
      graph.packed = true;
    }
    auto constants = support::JsonReader::Find(entry, "constants");
    if (constants && constants->type_index() != ffi::TypeIndex::kTVMFFINone) {
      files.constants = reader.String(*constants, where + ".constants");
    }
    graphs_.push_back(std::move(graph));
    files_.push_back(std::move(files));
  }
  bool has_decode = false;
  for (const EntryGraph& g : graphs_) has_decode |= g.size == 1;
  if (!has_decode) reader.Fail("graphs", "no decode graph (chunk size 1)");
}

void LanguageModel::CheckRunsOn(const std::set<std::string>& has, bool stated) const {
  if (!compiled_for_) return;
  std::vector<std::string> missing = support::MissingFeatures(compiled_for_->features, has);
  if (missing.empty()) return;
  std::ostringstream names;
  for (size_t i = 0; i < missing.size(); ++i) {
    names << (i ? ", " : "") << missing[i];
    if (!stated && !support::IsReadableFeature(missing[i])) names << " (which this loader cannot read from the CPU)";
  }
  TVM_FFI_THROW(RuntimeError) << directory_ << ": its kernels were compiled for CPU '" << compiled_for_->cpu
                              << "', and " << (stated ? "the stated CPU" : "this CPU") << " lacks " << names.str()
                              << "; build it again here (tvm_hetero.llm.build), or build it with the target "
                                 "tvm.target.Target('llvm') (a Target, not the string) for any CPU of the architecture";
}

namespace {

/*!
 * \brief A parameter blob naming `owner`'s parameters, each with a one-element value: ShareParams
 *        reads only the names. Giving it params.bin would decode every weight again for each graph
 *        (a transient copy of all of them, whose memory the allocator then keeps).
 */
std::string NamesOnlyBlob(const GraphRuntime& owner) {
  ffi::Map<ffi::String, ffi::Tensor> params;
  for (int i = 0; i < owner.NumInputs(); ++i) {
    if (owner.InputIsParam(i)) {
      params.Set(owner.GetInputName(i), support::AllocTensor(ffi::Shape({1}), DLDataType{kDLFloat, 32, 1},
                                                             DLDevice{kDLCPU, 0}));
    }
  }
  return std::string(ffi::Function::GetGlobalRequired("runtime.SaveParams")(params).cast<ffi::Bytes>());
}

}  // namespace

void LanguageModel::CreateRuntimes(int num_threads) {
  std::string params_path = directory_ + "/" + kParamsFile;
  std::string params = ReadWholeFile(params_path);
  device_ = files_[0].devices[0];
  const GraphRuntime* owner = nullptr;
  std::string names_only;
  for (size_t i = 0; i < graphs_.size(); ++i) {
    std::string graph_path = directory_ + "/" + files_[i].graph;
    if (!support::IsHost(files_[i].devices[0]) || !support::SameDevice(files_[i].devices[0], device_)) {
      TVM_FFI_THROW(ValueError) << graph_path << ": its primary device " << support::DeviceName(files_[i].devices[0])
                                << " is not " << support::DeviceName(device_)
                                << " (the loop keeps the KV cache on one host device)";
    }
    auto runtime = std::make_unique<GraphRuntime>();
    try {
      runtime->Init(ReadWholeFile(graph_path), ffi::Module::LoadFromFile(directory_ + "/" + files_[i].lib),
                    files_[i].devices);
    } catch (const ffi::Error& err) {  // e.g. an accelerator region with no runner in this process: name the graph
      throw ffi::Error(err.kind(), graph_path + ": " + err.message(), err.backtrace());
    }
    if (num_threads > 0) {
      ExecutorOptions threads;
      threads.num_threads = num_threads;
      runtime->SetExecution(ExecutionMode::kSerial, std::vector<ExecutorOptions>(files_[i].devices.size(), threads));
    }
    if (owner == nullptr) {
      runtime->LoadParams(params, params_path);
      owner = runtime.get();
      names_only = NamesOnlyBlob(*owner);  // the weights alone: before any graph's own constants
      std::string().swap(params);  // params.bin is in the weights now: its bytes go
    } else {
      runtime->ShareParams(*owner, names_only);
    }
    if (!files_[i].constants.empty()) {
      std::string path = directory_ + "/" + files_[i].constants;
      runtime->LoadParams(ReadWholeFile(path), path);
    }
    for (int input = 0; input < runtime->NumInputs(); ++input) {
      const std::string& name = runtime->GetInputName(input);
      if (!runtime->InputIsParam(input) && !IsDataInput(name)) {
        TVM_FFI_THROW(ValueError) << graph_path << ": input '" << name
                                  << "' is neither a weight in params.bin nor an input of the generation loop";
      }
    }
    graphs_[i].runtime = std::move(runtime);
  }
  // Smallest chunk first: the decode graph leads.
  std::vector<size_t> order(graphs_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return graphs_[a].size < graphs_[b].size; });
  std::vector<EntryGraph> sorted;
  for (size_t i : order) sorted.push_back(std::move(graphs_[i]));
  graphs_ = std::move(sorted);
  for (size_t i = 1; i < graphs_.size(); ++i) {
    if (graphs_[i].size == graphs_[i - 1].size) {
      TVM_FFI_THROW(ValueError) << directory_ << "/" << kManifestFile << ": two graphs of chunk size " << graphs_[i].size;
    }
  }
}

}  // namespace llm
}  // namespace tvm_hetero
