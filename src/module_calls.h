/*!
 * \file module_calls.h
 * \brief What the runtime's module and a frame's module answer alike: an input key (name or index)
 *        to an index, and get_output (a view, or a copy into the caller's tensor).
 */
#ifndef TVM_HETERO_MODULE_CALLS_H_
#define TVM_HETERO_MODULE_CALLS_H_

#include <tvm/ffi/function.h>
#include <tvm_hetero/graph_runtime.h>

#include <string>

namespace tvm_hetero {

/*! \brief Input index of `key` (a name or an index); throws KeyError naming an unknown name. */
inline int InputIndexOf(const GraphRuntime& rt, const tvm::ffi::AnyView& key) {
  if (auto name = key.try_cast<tvm::ffi::String>()) {
    int index = rt.GetInputIndex(std::string(*name));
    if (index < 0) TVM_FFI_THROW(KeyError) << "the graph has no input named '" << *name << "'";
    return index;
  }
  return key.cast<int>();
}

/*! \brief get_output(index[, out]) over `target` (a GraphRuntime or a RunFrame); `keep` keeps the
 *         module alive while the function lives. */
template <typename Target>
tvm::ffi::Function GetOutputFunction(tvm::ffi::ObjectPtr<tvm::ffi::Object> keep, Target* target) {
  return tvm::ffi::Function::FromPacked([keep, target](tvm::ffi::PackedArgs args, tvm::ffi::Any* rv) {
    int index = args[0].cast<int>();
    if (args.size() > 1) {
      target->CopyOutputTo(index, args[1].cast<DLTensor*>());
      *rv = args[1];
    } else {
      *rv = target->GetOutput(index);
    }
  });
}

}  // namespace tvm_hetero

#endif  // TVM_HETERO_MODULE_CALLS_H_
