/*!
 * \file offload_runner.cc
 * \brief The device side of offload: lives in the remote process (loaded into tvm.exec.rpc_server),
 *        holds each segment's kernels and packed arguments after setup, and runs a whole segment
 *        per call: `run_segment(index, input bytes...)` writes the inputs the host sent, runs the
 *        kernels, and returns the bytes of the segment's outputs, so a segment is one round trip.
 *
 * The tensors arrive once, at creation, as DLTensors on this process's devices (the RPC layer
 * translates the host's handles); they alias memory the host runtime allocated here and owns.
 * Plan: {"entries": [...], "segments": [[{"func_name", "node", "args"}...]...], "transfers":
 * [{"inputs": [k...], "outputs": [k...]}...]} (transfers optional; k indexes the tensors).
 */
#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include "support/device.h"
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

/*! \brief One prepared segment: its kernels and the tensors its call fills and returns. */
struct Segment {
  std::vector<SegmentCall> calls;
  /*! \brief Written from the call's byte arguments, in order, before the kernels. */
  std::vector<DLTensor*> inputs;
  /*! \brief Returned, concatenated, after the kernels. */
  std::vector<DLTensor*> outputs;
  /*! \brief Total bytes of the outputs. */
  size_t output_bytes = 0;
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
    json::Array transfers;
    if (auto found = plan.find(ffi::String("transfers")); found != plan.end()) {
      transfers = reader.Array((*found).second, "field 'transfers'");
      if (transfers.size() != segments.size()) {
        TVM_FFI_THROW(ValueError) << "invalid offload plan: " << transfers.size() << " transfers for "
                                  << segments.size() << " segments";
      }
    }
    for (size_t s = 0; s < segments.size(); ++s) {
      std::string where = "segments[" + std::to_string(s) + "]";
      Segment segment;
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
          call.args.emplace_back(Tensor(k, call.node));
        }
        segment.calls.push_back(std::move(call));
      }
      if (!transfers.empty()) {
        std::string at = "transfers[" + std::to_string(s) + "]";
        json::Object transfer = reader.Object(transfers[s], at);
        for (int64_t k : reader.IntList(reader.Require(transfer, "inputs", at), at + ".inputs")) {
          segment.inputs.push_back(Tensor(k, at));
        }
        for (int64_t k : reader.IntList(reader.Require(transfer, "outputs", at), at + ".outputs")) {
          segment.outputs.push_back(Tensor(k, at));
          segment.output_bytes += ffi::GetDataSize(*segment.outputs.back());
        }
      }
      segments_.push_back(std::move(segment));
    }
  }

  const char* kind() const final { return "tvm_hetero.OffloadRunner"; }
  int GetPropertyMask() const final { return ffi::Module::kRunnable; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
    if (name == "run_segment") {
      return ffi::Function::FromPacked([self, this](ffi::PackedArgs args, ffi::Any* rv) { RunSegment(args, rv); });
    }
    return std::nullopt;
  }

 private:
  /*! \brief Plan tensor `k`, for an argument or transfer of `what`. */
  DLTensor* Tensor(int64_t k, const std::string& what) const {
    if (k < 0 || k >= static_cast<int64_t>(tensors_.size())) {
      TVM_FFI_THROW(IndexError) << what << ": tensor " << k << " is not in the plan's entries";
    }
    return const_cast<DLTensor*>(tensors_[k].GetDLTensorPtr());
  }

  /*! \brief The bytes `data` as a host tensor shaped like `like`. */
  static DLTensor HostView(const DLTensor& like, const char* data) {
    DLTensor view = like;
    view.data = const_cast<char*>(data);
    view.device = DLDevice{kDLCPU, 0};
    view.strides = nullptr;
    view.byte_offset = 0;
    return view;
  }

  /*! \brief run_segment(index, input bytes...): inputs in, kernels, outputs back as one bytes value. */
  void RunSegment(ffi::PackedArgs args, ffi::Any* rv) {
    int64_t index = args.size() > 0 ? args[0].cast<int64_t>() : -1;
    if (index < 0 || index >= static_cast<int64_t>(segments_.size())) {
      TVM_FFI_THROW(IndexError) << "segment " << index << " is out of range";
    }
    Segment& segment = segments_[index];
    if (args.size() != static_cast<int>(segment.inputs.size()) + 1) {
      TVM_FFI_THROW(ValueError) << "segment " << index << " takes " << segment.inputs.size() << " inputs, got "
                                << args.size() - 1;
    }
    for (size_t k = 0; k < segment.inputs.size(); ++k) {
      ffi::Bytes bytes = args[static_cast<int>(k) + 1].cast<ffi::Bytes>();
      DLTensor* to = segment.inputs[k];
      if (bytes.size() != ffi::GetDataSize(*to)) {
        TVM_FFI_THROW(ValueError) << "segment " << index << ", input " << k << ": got " << bytes.size()
                                  << " bytes for a tensor of " << ffi::GetDataSize(*to);
      }
      DLTensor from = HostView(*to, bytes.data());
      support::CopyAcrossDevices(&from, to);
    }
    ffi::Any ignored;
    const SegmentCall* current = nullptr;
    try {
      for (const SegmentCall& call : segment.calls) {
        current = &call;
        call.kernel.CallPacked(call.args.data(), static_cast<int32_t>(call.args.size()), &ignored);
      }
    } catch (const ffi::Error& err) {
      throw ffi::Error(err.kind(), "on the offload device, " + current->node + ": " + err.message(),
                       err.backtrace());
    }
    if (segment.outputs.empty()) return;
    returned_.resize(segment.output_bytes);
    size_t at = 0;
    for (DLTensor* from : segment.outputs) {
      DLTensor to = HostView(*from, returned_.data() + at);
      support::CopyAcrossDevices(from, &to);  // a copy to the host is complete on return
      at += ffi::GetDataSize(*from);
    }
    *rv = ffi::Bytes(returned_.data(), returned_.size());
  }

  /*! \brief Views of the host runtime's entries on this device, by plan index. */
  std::vector<ffi::Tensor> tensors_;
  /*! \brief Prepared segments. */
  std::vector<Segment> segments_;
  /*! \brief Buffer the outputs are gathered in before they are returned. */
  std::string returned_;
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
