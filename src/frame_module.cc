/*!
 * \file frame_module.cc
 * \brief A RunFrame as a TVM module (what `GraphModule.frame()` wraps in Python): the per-request
 *        half of the GraphModule API, plus zero-copy bindings.
 */
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/cast.h>
#include <tvm/ffi/function.h>
#include <tvm_hetero/graph_runtime_module.h>

#include <memory>
#include <string>

#include "module_calls.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;

namespace {

class FrameModule : public ffi::ModuleObj {
 public:
  FrameModule(ffi::Module runtime_module, std::unique_ptr<RunFrame> frame)
      : runtime_module_(std::move(runtime_module)), frame_(std::move(frame)) {}
  const char* kind() const final { return "tvm_hetero.RunFrame"; }
  int GetPropertyMask() const final { return ffi::Module::kRunnable; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
    RunFrame* frame = frame_.get();
    const GraphRuntime* rt = &static_cast<GraphRuntimeModule*>(runtime_module_.operator->())->runtime;
    auto input_index = [rt](const ffi::AnyView& key) { return InputIndexOf(*rt, key); };
    std::string n(name);
    if (n == "set_input") {
      return ffi::Function::FromTyped(
          [self, frame, input_index](ffi::AnyView key, DLTensor* value) { frame->SetInput(input_index(key), value); });
    }
    if (n == "bind_input") {
      return ffi::Function::FromTyped([self, frame, input_index](ffi::AnyView key, ffi::Tensor value) {
        frame->BindInput(input_index(key), std::move(value));
      });
    }
    if (n == "bind_output") {
      return ffi::Function::FromTyped(
          [self, frame](int index, ffi::Tensor out) { frame->BindOutput(index, std::move(out)); });
    }
    if (n == "run") return ffi::Function::FromTyped([self, frame]() { frame->Run(); });
    if (n == "get_output") return GetOutputFunction(self, frame);
    if (n == "get_input") {
      return ffi::Function::FromTyped([self, frame, input_index](ffi::AnyView key) { return frame->GetInput(input_index(key)); });
    }
    if (n == "io_bytes_copied") return ffi::Function::FromTyped([self, frame]() { return frame->io_bytes_copied(); });
    if (n == "allocated_bytes") return ffi::Function::FromTyped([self, frame]() { return frame->allocated_bytes(); });
    return std::nullopt;
  }

 private:
  /*! \brief The runtime whose plan and parameters the frame uses (kept alive). */
  ffi::Module runtime_module_;
  std::unique_ptr<RunFrame> frame_;
};

}  // namespace

ffi::Module CreateFrameModule(ffi::Module runtime_module, std::unique_ptr<RunFrame> frame) {
  return ffi::Module(ffi::make_object<FrameModule>(std::move(runtime_module), std::move(frame)));
}

}  // namespace tvm_hetero
