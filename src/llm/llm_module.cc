/*!
 * \file llm/llm_module.cc
 * \brief The C++ generation loop through tvm_ffi (what python/tvm_hetero/llm/native.py wraps):
 *        `tvm_hetero.llm.load(dir)` gives a model module whose `new_session()` gives session modules
 *        (start / next / generate / times); `tvm_hetero.llm.plan_chunks` exposes the chunk plan.
 */
#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm_hetero/llm/generation_session.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tvm_hetero {
namespace llm {

namespace ffi = tvm::ffi;

namespace {

/*! \brief GenerationOptions from the arguments every generation call takes. */
GenerationOptions OptionsFrom(int64_t max_new_tokens, double temperature, int64_t top_k, double top_p,
                              ffi::Optional<int64_t> seed, ffi::Optional<ffi::Array<int64_t>> stop_tokens) {
  GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  options.sampling.temperature = temperature;
  options.sampling.top_k = top_k;
  options.sampling.top_p = top_p;
  if (seed.has_value()) options.sampling.seed = static_cast<uint64_t>(*seed);
  if (stop_tokens.has_value()) {
    options.stop_tokens.emplace();
    for (int64_t id : *stop_tokens) options.stop_tokens->push_back(static_cast<int32_t>(id));
  }
  return options;
}

std::vector<int64_t> ToVector(const ffi::Array<int64_t>& values) { return {values.begin(), values.end()}; }

ffi::Array<int64_t> ToArray(const std::vector<int32_t>& values) {
  ffi::Array<int64_t> out;
  for (int32_t v : values) out.push_back(v);
  return out;
}

class SessionModule : public ffi::ModuleObj {
 public:
  explicit SessionModule(std::shared_ptr<const LanguageModel> model) : session_(std::move(model)) {}
  const char* kind() const final { return "tvm_hetero.llm.GenerationSession"; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
    GenerationSession* session = &session_;
    std::string n(name);
    if (n == "start") {
      return ffi::Function::FromTyped([self, session](ffi::Array<int64_t> prompt, int64_t max_new_tokens,
                                                      double temperature, int64_t top_k, double top_p,
                                                      ffi::Optional<int64_t> seed,
                                                      ffi::Optional<ffi::Array<int64_t>> stop_tokens) {
        session->Start(ToVector(prompt), OptionsFrom(max_new_tokens, temperature, top_k, top_p, seed, stop_tokens));
      });
    }
    // The next token, or -1 once the generation has ended.
    if (n == "next") {
      return ffi::Function::FromTyped([self, session]() -> int64_t { return session->Next().value_or(-1); });
    }
    if (n == "generate") {
      return ffi::Function::FromTyped([self, session](ffi::Array<int64_t> prompt, int64_t max_new_tokens,
                                                      double temperature, int64_t top_k, double top_p,
                                                      ffi::Optional<int64_t> seed,
                                                      ffi::Optional<ffi::Array<int64_t>> stop_tokens) {
        return ToArray(session->Generate(ToVector(prompt),
                                         OptionsFrom(max_new_tokens, temperature, top_k, top_p, seed, stop_tokens)));
      });
    }
    // [prompt tokens, prefill seconds, decode steps, decode seconds] of the last generation.
    if (n == "times") {
      return ffi::Function::FromTyped([self, session]() {
        const GenerationTimes& t = session->times();
        return ffi::Array<double>({static_cast<double>(t.prompt_tokens), t.prefill_seconds,
                                   static_cast<double>(t.decode_steps), t.decode_seconds});
      });
    }
    if (n == "filled") return ffi::Function::FromTyped([self, session]() { return session->filled(); });
    if (n == "cache_bytes_written") {
      return ffi::Function::FromTyped([self, session]() { return session->cache_bytes_written(); });
    }
    if (n == "calls") {
      return ffi::Function::FromTyped([self, session]() {
        return ffi::Array<int64_t>(session->calls().begin(), session->calls().end());
      });
    }
    return std::nullopt;
  }

 private:
  /*! \brief The session this module runs. */
  GenerationSession session_;
};

class ModelModule : public ffi::ModuleObj {
 public:
  explicit ModelModule(std::shared_ptr<const LanguageModel> model) : model_(std::move(model)) {}
  const char* kind() const final { return "tvm_hetero.llm.LanguageModel"; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
    std::shared_ptr<const LanguageModel> model = model_;
    std::string n(name);
    if (n == "new_session") {
      return ffi::Function::FromTyped(
          [self, model]() { return ffi::Module(ffi::make_object<SessionModule>(model)); });
    }
    if (n == "vocab_size") return ffi::Function::FromTyped([self, model]() { return model->shape().vocab_size; });
    if (n == "capacity") return ffi::Function::FromTyped([self, model]() { return model->capacity(); });
    if (n == "weight_bytes") return ffi::Function::FromTyped([self, model]() { return model->weight_bytes(); });
    if (n == "model_type") {
      return ffi::Function::FromTyped([self, model]() { return ffi::String(model->shape().model_type); });
    }
    if (n == "eos_token_ids") {
      return ffi::Function::FromTyped([self, model]() { return ToArray(model->shape().eos_token_ids); });
    }
    if (n == "chunk_sizes") {
      return ffi::Function::FromTyped([self, model]() {
        ffi::Array<int64_t> sizes;
        for (const EntryGraph& graph : model->graphs()) sizes.push_back(graph.size);
        return sizes;
      });
    }
    return std::nullopt;
  }

 private:
  /*! \brief The loaded model, shared with every session made from it. */
  std::shared_ptr<const LanguageModel> model_;
};

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      // cpu_features: the CPU to check the export's record against (None: this CPU).
      .def("tvm_hetero.llm.load",
           [](ffi::String directory, int num_threads, ffi::Optional<ffi::Array<ffi::String>> cpu_features) {
             std::optional<std::set<std::string>> stated;
             if (cpu_features.has_value()) {
               stated.emplace();
               for (const ffi::String& name : *cpu_features) stated->insert(std::string(name));
             }
             return ffi::Module(
                 ffi::make_object<ModelModule>(LanguageModel::Load(std::string(directory), num_threads, stated)));
           })
      .def("tvm_hetero.llm.plan_chunks", [](int64_t length, ffi::Array<int64_t> sizes) {
        ffi::Array<ffi::Array<int64_t>> plan;
        for (const Chunk& chunk : PlanChunks(length, ToVector(sizes))) plan.push_back({chunk.size, chunk.rows});
        return plan;
      });
}

}  // namespace llm
}  // namespace tvm_hetero
