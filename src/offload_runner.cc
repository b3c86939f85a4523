/*!
 * \file offload_runner.cc
 * \brief The device side of offload: lives in the remote process (loaded into tvm.exec.rpc_server),
 *        holds each segment's kernels and packed arguments after setup, and runs a whole segment
 *        per call, so a run sends nothing across but `run_segment(index)`.
 *
 * The tensors arrive once, at creation, as DLTensors on this process's devices (the RPC layer
 * translates the host's handles); they alias memory the host runtime allocated here and owns.
 */
#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include "support/json_reader.h"

#include <memory>
#include <string>
#include <vector>

namespace tvm_hetero {

namespace ffi = tvm::ffi;
namespace json = ffi::json;

namespace {

/*! \brief A view of memory this runner does not own. */
struct BorrowedAlloc {
  void* data;
  void AllocData(DLTensor* t) { t->data = data; }
  void FreeData(DLTensor*) {}
};

/*! \brief One kernel call of a segment. */
struct SegmentCall {
  /*! \brief The kernel. */
  ffi::Function kernel;
  /*! \brief Packed DLTensor arguments. */
  std::vector<ffi::AnyView> args;
  /*! \brief "node 12 'conv3'", for errors. */
  std::string node;
};

/*! \brief Runs prepared segments of kernels. */
class OffloadRunner : public ffi::ModuleObj {
 public:
  OffloadRunner(const ffi::Module& lib, const std::string& plan_json, std::vector<DLTensor*> tensors) {
    for (DLTensor* t : tensors) {
      tensors_.push_back(ffi::Tensor::FromNDAlloc(BorrowedAlloc{static_cast<char*>(t->data) + t->byte_offset},
                                                  ffi::ShapeView(t->shape, t->ndim), t->dtype, t->device));
    }
    const support::JsonReader reader("invalid offload plan");
    json::Object plan = reader.Object(reader.Parse(plan_json), "document");
    json::Array segments = reader.Array(reader.Require(plan, "segments", "document"), "field 'segments'");
    for (size_t s = 0; s < segments.size(); ++s) {
      std::string where = "segments[" + std::to_string(s) + "]";
      std::vector<SegmentCall> calls;
      json::Array ops = reader.Array(segments[s], where);
      for (size_t c = 0; c < ops.size(); ++c) {
        std::string at = where + "[" + std::to_string(c) + "]";
        json::Object op = reader.Object(ops[c], at);
        SegmentCall call;
        call.node = reader.String(reader.Require(op, "node", at), at + ".node");
        std::string name = reader.String(reader.Require(op, "func_name", at), at + ".func_name");
        auto kernel = lib->GetFunction(name, /*query_imports=*/true);
        if (!kernel.has_value()) {
          TVM_FFI_THROW(ValueError) << call.node << ": kernel '" << name << "' is not in the remote library";
        }
        call.kernel = *kernel;
        for (int64_t k : reader.IntList(reader.Require(op, "args", at), at + ".args")) {
          if (k < 0 || k >= static_cast<int64_t>(tensors_.size())) {
            TVM_FFI_THROW(IndexError) << call.node << ": argument " << k << " has no tensor";
          }
          call.args.emplace_back(const_cast<DLTensor*>(tensors_[k].GetDLTensorPtr()));
        }
        calls.push_back(std::move(call));
      }
      segments_.push_back(std::move(calls));
    }
  }

  const char* kind() const final { return "tvm_hetero.OffloadRunner"; }
  int GetPropertyMask() const final { return ffi::Module::kRunnable; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
    if (name == "run_segment") {
      return ffi::Function::FromTyped([self, this](int64_t index) { RunSegment(index); });
    }
    return std::nullopt;
  }

 private:
  void RunSegment(int64_t index) {
    if (index < 0 || index >= static_cast<int64_t>(segments_.size())) {
      TVM_FFI_THROW(IndexError) << "segment " << index << " is out of range";
    }
    ffi::Any rv;
    const SegmentCall* current = nullptr;
    try {
      for (const SegmentCall& call : segments_[index]) {
        current = &call;
        call.kernel.CallPacked(call.args.data(), static_cast<int32_t>(call.args.size()), &rv);
      }
    } catch (const ffi::Error& err) {
      throw ffi::Error(err.kind(), "on the offload device, " + current->node + ": " + err.message(),
                       err.backtrace());
    }
  }

  /*! \brief Views of the host runtime's entries on this device, by plan index. */
  std::vector<ffi::Tensor> tensors_;
  /*! \brief Prepared calls of each segment. */
  std::vector<std::vector<SegmentCall>> segments_;
};

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  // create_runner(lib, plan_json, tensor0, tensor1, ...) in the remote process
  refl::GlobalDef().def_packed("tvm_hetero.offload.create_runner", [](ffi::PackedArgs args, ffi::Any* rv) {
    std::vector<DLTensor*> tensors;
    for (int i = 2; i < args.size(); ++i) tensors.push_back(args[i].cast<DLTensor*>());
    *rv = ffi::Module(ffi::make_object<OffloadRunner>(args[0].cast<ffi::Module>(), args[1].cast<std::string>(),
                                                      std::move(tensors)));
  });
}

}  // namespace tvm_hetero
