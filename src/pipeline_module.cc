/*!
 * \file pipeline_module.cc
 * \brief The pipeline executor as a TVM module, and the global `tvm_hetero.pipeline.create`.
 *
 * create(stages: Array<Module>, config_json: str) -> Module
 *   `stages` are modules made by `tvm_hetero.graph_runtime.create`, one per stage, in order; the
 *   pipeline shares them (keep them out of other use while it lives). `config_json` is the wiring
 *   (docs/pipeline.md):
 *     {"inputs": ["x", ...],                         pipeline inputs, in run() order
 *      "stages": [{"name": "front",                  optional, default "stage<i>"
 *                  "inputs": {"A": "x",              stage input <- pipeline input
 *                             "B": {"stage": 0, "output": 1}},   <- an earlier stage's output
 *                  "params": ["W"],                  inputs set once with set_params/load_params
 *                  "cores": [0, 1],                  optional worker affinity
 *                  "num_threads": 1}, ...],          optional TVM threads for the stage, 0: default
 *      "outputs": [{"stage": 1, "output": 0}, ...],  what get_output returns, in order
 *      "queue_capacity": 2}                          optional, frames per queue
 *
 * Module functions:
 *   run(t0, t1, ...)            submit one inference, tensors in pipeline-input order; blocks while full
 *   try_run(t0, t1, ...) -> bool  the same, but returns false instead of blocking
 *   get_output(block) -> Array<Tensor> | None   outputs of the oldest unreturned inference
 *   set_input_param(stage, name, tensor); set_params(stage, Map); load_params(stage, bytes)
 *                               stage -1: every stage that declares the parameter
 *   stats() -> str (JSON); shutdown(); get_input_names(); get_num_outputs(); get_stage_names()
 */
#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm_hetero/graph_runtime_module.h>
#include <tvm_hetero/pipeline_executor.h>

#include <memory>
#include <string>
#include <vector>

namespace tvm_hetero {

namespace ffi = tvm::ffi;

namespace {

/*! \brief The run arguments as DLTensors. */
std::vector<const DLTensor*> InputTensors(ffi::PackedArgs args) {
  std::vector<const DLTensor*> inputs;
  for (int i = 0; i < args.size(); ++i) inputs.push_back(args[i].cast<DLTensor*>());
  return inputs;
}

ffi::Array<ffi::String> Strings(const std::vector<std::string>& values) {
  ffi::Array<ffi::String> out;
  for (const std::string& v : values) out.push_back(ffi::String(v));
  return out;
}

}  // namespace

/*! \brief Exposes a PipelineExecutor through GetFunction. */
class PipelineModule : public ffi::ModuleObj {
 public:
  /*! \brief The executor this module drives. */
  PipelineExecutor executor;

  const char* kind() const final { return "tvm_hetero.PipelineExecutor"; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    // The closures hold a reference so the module outlives the functions taken from it.
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
    PipelineExecutor* ex = &executor;
    std::string n(name);
    if (n == "run") {
      return ffi::Function::FromPacked(
          [self, ex](ffi::PackedArgs args, ffi::Any* rv) { ex->Run(InputTensors(args), /*block=*/true); });
    }
    if (n == "try_run") {
      return ffi::Function::FromPacked(
          [self, ex](ffi::PackedArgs args, ffi::Any* rv) { *rv = ex->Run(InputTensors(args), /*block=*/false); });
    }
    if (n == "get_output") {
      return ffi::Function::FromTyped([self, ex](bool block) -> ffi::Optional<ffi::Array<ffi::Tensor>> {
        auto outputs = ex->GetOutput(block);
        if (!outputs) return std::nullopt;
        return ffi::Array<ffi::Tensor>(outputs->begin(), outputs->end());
      });
    }
    if (n == "set_input_param") {
      return ffi::Function::FromTyped([self, ex](int stage, ffi::String param, DLTensor* value) {
        ex->SetParam(stage, std::string(param), value);
      });
    }
    if (n == "set_params") {
      return ffi::Function::FromTyped(
          [self, ex](int stage, ffi::Map<ffi::String, ffi::Tensor> params) { ex->SetParams(stage, params); });
    }
    if (n == "load_params") {
      return ffi::Function::FromTyped(
          [self, ex](int stage, ffi::Bytes bytes) { ex->LoadParams(stage, std::string(bytes)); });
    }
    if (n == "stats") return ffi::Function::FromTyped([self, ex]() { return ffi::String(ex->StatsJSON()); });
    if (n == "shutdown") return ffi::Function::FromTyped([self, ex]() { ex->Shutdown(); });
    if (n == "get_input_names") return ffi::Function::FromTyped([self, ex]() { return Strings(ex->input_names()); });
    if (n == "get_num_outputs") return ffi::Function::FromTyped([self, ex]() { return ex->NumOutputs(); });
    if (n == "get_stage_names") {
      return ffi::Function::FromTyped([self, ex]() {
        std::vector<std::string> names;
        for (int s = 0; s < ex->NumStages(); ++s) names.push_back(ex->stage_name(s));
        return Strings(names);
      });
    }
    return std::nullopt;
  }
};

/*! \brief Build a pipeline over runtime modules made by `tvm_hetero.graph_runtime.create`. */
ffi::Module CreatePipeline(const ffi::Array<ffi::Module>& stage_modules, const std::string& config_json) {
  PipelineConfig config = ParsePipelineConfig(config_json);
  if (config.stages.size() != stage_modules.size()) {
    TVM_FFI_THROW(ValueError) << "the config describes " << config.stages.size() << " stages, but "
                              << stage_modules.size() << " runtime modules were given";
  }
  for (size_t s = 0; s < stage_modules.size(); ++s) {
    ffi::Module module = stage_modules[s];
    auto* graph_module = dynamic_cast<GraphRuntimeModule*>(module.operator->());
    if (graph_module == nullptr) {
      TVM_FFI_THROW(TypeError) << "stage " << s << ": expected a tvm-hetero graph runtime module, got a '"
                               << module->kind() << "' module";
    }
    // Shares ownership of the module while pointing at its runtime.
    config.stages[s].runtime =
        std::shared_ptr<GraphRuntime>(std::make_shared<ffi::Module>(module), &graph_module->runtime);
  }
  auto pipeline = ffi::make_object<PipelineModule>();
  pipeline->executor.Init(std::move(config));
  return ffi::Module(pipeline);
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def("tvm_hetero.pipeline.create", [](ffi::Array<ffi::Module> stages, ffi::String config) {
    return CreatePipeline(stages, std::string(config));
  });
}

}  // namespace tvm_hetero
