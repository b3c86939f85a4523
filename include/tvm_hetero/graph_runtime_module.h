/*!
 * \file tvm_hetero/graph_runtime_module.h
 * \brief The runtime as a TVM module (the GraphModule API), created by `tvm_hetero.graph_runtime.create`.
 *        Declared here so that other modules (the pipeline) can reach the runtime inside.
 */
#ifndef TVM_HETERO_GRAPH_RUNTIME_MODULE_H_
#define TVM_HETERO_GRAPH_RUNTIME_MODULE_H_

#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm_hetero/graph_runtime.h>

#include <memory>

namespace tvm_hetero {

/*! \brief Exposes a GraphRuntime through GetFunction, like TVM's GraphExecutor. */
class GraphRuntimeModule : public tvm::ffi::ModuleObj {
 public:
  /*! \brief The runtime this module drives. */
  GraphRuntime runtime;

  const char* kind() const final { return "tvm_hetero.GraphRuntime"; }
  int GetPropertyMask() const final { return tvm::ffi::Module::kRunnable; }
  tvm::ffi::Optional<tvm::ffi::Function> GetFunction(const tvm::ffi::String& name) final;
};

/*!
 * \brief A frame as a TVM module: set_input / bind_input / bind_output / run / get_output /
 *        get_input, for one thread's requests on a shared model (frame_module.cc). It keeps
 *        `runtime_module` alive.
 */
tvm::ffi::Module CreateFrameModule(tvm::ffi::Module runtime_module, std::unique_ptr<RunFrame> frame);

}  // namespace tvm_hetero

#endif  // TVM_HETERO_GRAPH_RUNTIME_MODULE_H_
