/*!
 * \file graph_runtime_module.cc
 * \brief The runtime as a TVM module (the GraphModule API) and the global
 *        `tvm_hetero.graph_runtime.create`.
 */
#include <tvm/ffi/cast.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm_hetero/graph_runtime_module.h>

#include "concurrency/device_executors.h"
#include "module_calls.h"

#include <memory>
#include <string>

namespace tvm_hetero {

namespace ffi = tvm::ffi;

ffi::Optional<ffi::Function> GraphRuntimeModule::GetFunction(const ffi::String& name) {
  // The closures hold a reference so the module outlives the functions taken from it.
  ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
  GraphRuntime* rt = &runtime;
  auto input_index = [rt](const ffi::AnyView& key) { return InputIndexOf(*rt, key); };
  std::string n(name);
  if (n == "set_input") {
    return ffi::Function::FromTyped([self, rt, input_index](ffi::AnyView key, DLTensor* value) {
      // DLTensor* rather than Tensor: that is what arrives through an RPC session.
      rt->SetInput(input_index(key), value);
    });
  }
  if (n == "bind_input") {
    // Zero copy: the default frame reads the input from `value` (checked; see RunFrame::BindInput).
    return ffi::Function::FromTyped([self, rt, input_index](ffi::AnyView key, ffi::Tensor value) {
      rt->default_frame().BindInput(input_index(key), std::move(value));
    });
  }
  if (n == "bind_output") {
    return ffi::Function::FromTyped(
        [self, rt](int index, ffi::Tensor out) { rt->default_frame().BindOutput(index, std::move(out)); });
  }
  if (n == "frame") {
    ffi::ObjectPtr<ffi::ModuleObj> me = ffi::GetObjectPtr<ffi::ModuleObj>(static_cast<ffi::ModuleObj*>(this));
    return ffi::Function::FromTyped([me, rt](ffi::Optional<ffi::Tensor> scratch) {
      FrameOptions options;
      if (scratch.has_value()) options.scratch = scratch.value();
      return CreateFrameModule(ffi::Module(me), rt->Frame(options));
    });
  }
  if (n == "scratch_bytes") {
    return ffi::Function::FromTyped([self, rt](DLDevice device) { return rt->ScratchBytes(device); });
  }
  if (n == "plan") return ffi::Function::FromTyped([self, rt]() { return ffi::String(rt->PlanText()); });
  if (n == "run") return ffi::Function::FromTyped([self, rt]() { rt->Run(); });
  if (n == "get_output") return GetOutputFunction(self, rt);
  if (n == "get_input") {
    return ffi::Function::FromTyped([self, rt, input_index](ffi::AnyView key) { return rt->GetInput(input_index(key)); });
  }
  if (n == "get_input_index") {
    return ffi::Function::FromTyped([self, rt](ffi::String name) { return rt->GetInputIndex(std::string(name)); });
  }
  if (n == "get_input_name") {
    return ffi::Function::FromTyped([self, rt](int index) { return ffi::String(rt->GetInputName(index)); });
  }
  if (n == "get_input_is_param") {
    return ffi::Function::FromTyped([self, rt](int index) { return rt->InputIsParam(index); });
  }
  if (n == "get_num_inputs") return ffi::Function::FromTyped([self, rt]() { return rt->NumInputs(); });
  if (n == "get_num_outputs") return ffi::Function::FromTyped([self, rt]() { return rt->NumOutputs(); });
  if (n == "load_params") {
    // load_params(bytes[, what]): `what` (e.g. the file) is named in errors.
    return ffi::Function::FromPacked([self, rt](ffi::PackedArgs args, ffi::Any*) {
      std::string what = args.size() > 1 ? args[1].cast<std::string>() : "load_params";
      rt->LoadParams(std::string(args[0].cast<ffi::Bytes>()), what);
    });
  }
  if (n == "set_params") {
    return ffi::Function::FromTyped(
        [self, rt](ffi::Map<ffi::String, ffi::Tensor> params) { rt->SetParams(params); });
  }
  if (n == "share_params") {
    return ffi::Function::FromTyped([self, rt](ffi::Module other, ffi::Bytes bytes) {
      auto* source = dynamic_cast<GraphRuntimeModule*>(other.operator->());
      if (source == nullptr) TVM_FFI_THROW(TypeError) << "share_params needs another tvm-hetero runtime";
      rt->ShareParams(source->runtime, std::string(bytes));
    });
  }
  if (n == "offload_plan") {
      return ffi::Function::FromTyped([self, rt](int device) { return ffi::String(rt->OffloadPlanJSON(device)); });
    }
    if (n == "get_entry") {
      return ffi::Function::FromTyped([self, rt](int64_t eid) { return rt->GetEntry(static_cast<uint32_t>(eid)); });
    }
    if (n == "attach_offload_runner") {
      return ffi::Function::FromTyped(
          [self, rt](int device, ffi::Function run_segment) { rt->AttachOffloadRunner(device, run_segment); });
    }
  if (n == "set_execution") {
    // set_execution("concurrent" | "serial", device_options_json)
    return ffi::Function::FromTyped([self, rt](ffi::String mode, ffi::String options) {
      rt->SetExecution(ParseExecutionMode(std::string(mode)),
                       ParseExecutorOptions(std::string(options), static_cast<int>(rt->devices().size())));
    });
  }
  if (n == "trace") {
    return ffi::Function::FromTyped([self, rt](int runs) { return ffi::String(rt->TraceJSON(runs)); });
  }
  if (n == "stats") return ffi::Function::FromTyped([self, rt]() { return ffi::String(rt->StatsJSON()); });
  if (n == "profile") {
    return ffi::Function::FromTyped([self, rt](int repeat) { return ffi::String(rt->ProfileJSON(repeat)); });
  }
  return std::nullopt;
}

/*!
 * \brief Create a runtime module.
 * \param graph_json The graph.
 * \param lib The kernel library.
 * \param kind "position" or "device_type": how to read device_index when the graph does not say.
 * \param devices The devices, primary first.
 */
ffi::Module CreateGraphRuntime(const std::string& graph_json, ffi::Module lib, const std::string& kind,
                               std::vector<DLDevice> devices,
                               std::vector<ffi::Optional<ffi::Module>> device_libs = {}) {
  DeviceIndexKind index_kind;
  if (kind == "position") {
    index_kind = DeviceIndexKind::kPosition;
  } else if (kind == "device_type") {
    index_kind = DeviceIndexKind::kDeviceType;
  } else {
    TVM_FFI_THROW(ValueError) << "device_index_kind must be 'position' or 'device_type', got '" << kind << "'";
  }
  auto module = ffi::make_object<GraphRuntimeModule>();
  module->runtime.Init(graph_json, std::move(lib), std::move(devices), index_kind, std::move(device_libs));
  return ffi::Module(module);
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def("tvm_hetero.concurrency.spin_window_seconds", [] { return SpinWindowSeconds(); });
  // create(graph_json, lib, device_index_kind, dev0, dev1, ...)
  refl::GlobalDef().def_packed("tvm_hetero.graph_runtime.create", [](ffi::PackedArgs args, ffi::Any* rv) {
    if (args.size() < 4) {
      TVM_FFI_THROW(TypeError) << "create(graph_json, lib, device_index_kind, dev0, ...) needs at least one device";
    }
    std::vector<DLDevice> devices;
    for (int i = 3; i < args.size(); ++i) devices.push_back(args[i].cast<DLDevice>());
    // lib: one module, or a list with one entry per device (None: use the first).
    std::vector<ffi::Optional<ffi::Module>> device_libs;
    ffi::Optional<ffi::Module> lib;
    if (auto list = args[1].try_cast<ffi::Array<ffi::Any>>()) {
      for (const ffi::Any& item : *list) device_libs.push_back(item.cast<ffi::Optional<ffi::Module>>());
      if (device_libs.empty() || !device_libs[0].has_value()) {
        TVM_FFI_THROW(ValueError) << "lib: the first entry of a per-device library list must be a module";
      }
      lib = device_libs[0];
    } else {
      lib = args[1].cast<ffi::Module>();
    }
    *rv = CreateGraphRuntime(args[0].cast<std::string>(), *lib, args[2].cast<std::string>(), std::move(devices),
                             std::move(device_libs));
  });
}

}  // namespace tvm_hetero
