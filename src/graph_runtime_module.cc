/*!
 * \file graph_runtime_module.cc
 * \brief The runtime as a TVM module (the GraphModule API) and the global
 *        `tvm_hetero.graph_runtime.create`.
 */
#include <tvm/ffi/cast.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm_hetero/graph_runtime.h>

#include <memory>
#include <string>

namespace tvm_hetero {

namespace ffi = tvm::ffi;

/*! \brief Exposes a GraphRuntime through GetFunction, like TVM's GraphExecutor. */
class GraphRuntimeModule : public ffi::ModuleObj {
 public:
  /*! \brief The runtime this module drives. */
  GraphRuntime runtime;

  const char* kind() const final { return "tvm_hetero.GraphRuntime"; }
  int GetPropertyMask() const final { return ffi::Module::kRunnable; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    // The closures hold a reference so the module outlives the functions taken from it.
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
    GraphRuntime* rt = &runtime;
    auto input_index = [rt](const ffi::AnyView& key) -> int {
      if (auto name = key.try_cast<ffi::String>()) {
        int index = rt->GetInputIndex(std::string(*name));
        if (index < 0) TVM_FFI_THROW(KeyError) << "the graph has no input named '" << *name << "'";
        return index;
      }
      return key.cast<int>();
    };
    std::string n(name);
    if (n == "set_input") {
      return ffi::Function::FromTyped([self, rt, input_index](ffi::AnyView key, DLTensor* value) {
        // DLTensor* rather than Tensor: that is what arrives through an RPC session.
        rt->SetInput(input_index(key), value);
      });
    }
    if (n == "run") return ffi::Function::FromTyped([self, rt]() { rt->Run(); });
    if (n == "get_output") {
      return ffi::Function::FromPacked([self, rt](ffi::PackedArgs args, ffi::Any* rv) {
        int index = args[0].cast<int>();
        if (args.size() > 1) {
          rt->CopyOutputTo(index, args[1].cast<DLTensor*>());
          *rv = args[1];
        } else {
          *rv = rt->GetOutput(index);
        }
      });
    }
    if (n == "get_input") {
      return ffi::Function::FromTyped([self, rt, input_index](ffi::AnyView key) { return rt->GetInput(input_index(key)); });
    }
    if (n == "get_input_index") {
      return ffi::Function::FromTyped([self, rt](ffi::String name) { return rt->GetInputIndex(std::string(name)); });
    }
    if (n == "get_input_name") {
      return ffi::Function::FromTyped([self, rt](int index) { return ffi::String(rt->GetInputName(index)); });
    }
    if (n == "get_num_inputs") return ffi::Function::FromTyped([self, rt]() { return rt->NumInputs(); });
    if (n == "get_num_outputs") return ffi::Function::FromTyped([self, rt]() { return rt->NumOutputs(); });
    if (n == "load_params") {
      return ffi::Function::FromTyped([self, rt](ffi::Bytes bytes) { rt->LoadParams(std::string(bytes)); });
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
    if (n == "stats") return ffi::Function::FromTyped([self, rt]() { return ffi::String(rt->StatsJSON()); });
    if (n == "profile") {
      return ffi::Function::FromTyped([self, rt](int repeat) { return ffi::String(rt->ProfileJSON(repeat)); });
    }
    return std::nullopt;
  }
};

/*!
 * \brief Create a runtime module.
 * \param graph_json The graph.
 * \param lib The kernel library.
 * \param kind "position" or "device_type": how to read device_index when the graph does not say.
 * \param devices The devices, primary first.
 */
ffi::Module CreateGraphRuntime(const std::string& graph_json, ffi::Module lib, const std::string& kind,
                               std::vector<DLDevice> devices) {
  DeviceIndexKind index_kind;
  if (kind == "position") {
    index_kind = DeviceIndexKind::kPosition;
  } else if (kind == "device_type") {
    index_kind = DeviceIndexKind::kDeviceType;
  } else {
    TVM_FFI_THROW(ValueError) << "device_index_kind must be 'position' or 'device_type', got '" << kind << "'";
  }
  auto module = ffi::make_object<GraphRuntimeModule>();
  module->runtime.Init(graph_json, std::move(lib), std::move(devices), index_kind);
  return ffi::Module(module);
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  // create(graph_json, lib, device_index_kind, dev0, dev1, ...)
  refl::GlobalDef().def_packed("tvm_hetero.graph_runtime.create", [](ffi::PackedArgs args, ffi::Any* rv) {
    if (args.size() < 4) {
      TVM_FFI_THROW(TypeError) << "create(graph_json, lib, device_index_kind, dev0, ...) needs at least one device";
    }
    std::vector<DLDevice> devices;
    for (int i = 3; i < args.size(); ++i) devices.push_back(args[i].cast<DLDevice>());
    *rv = CreateGraphRuntime(args[0].cast<std::string>(), args[1].cast<ffi::Module>(),
                             args[2].cast<std::string>(), std::move(devices));
  });
}

}  // namespace tvm_hetero
