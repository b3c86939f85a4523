/*!
 * \file graph_runtime_offload.cc
 * \brief Offload behind the remote-device seam: the runtime's remote kernel steps are cut into
 *        maximal segments per device (SetupOffloadSegments), described as a plan for the remote
 *        runner (OffloadPlanJSON, src/offload_runner.cc builds it in the remote process), and,
 *        once a runner is attached, each segment runs as one remote call (a kRemoteGroup step).
 */
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/graph_runtime.h>

#include <unordered_map>

#include "graph_runtime_steps.h"
#include "support/device.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;

void GraphRuntime::SetupOffloadSegments() {
  steps_->segments.clear();
  std::vector<int64_t> per_device(devices_.size(), 0);
  for (const ExecGroup& group : groups_) {
    if (!support::IsRemote(devices_[group.device])) continue;
    for (uint32_t i = group.begin; i < group.end; ++i) {
      if (steps_->op_execs[i].kind != OpExec::Kind::kKernel) continue;
      bool extends = !steps_->segments.empty() && steps_->segments.back().end == i && steps_->segments.back().device == group.device;
      if (extends) {
        steps_->segments.back().end = i + 1;
      } else {
        OffloadSegment segment;
        segment.device = group.device;
        segment.begin = i;
        segment.end = i + 1;
        segment.index_arg = ffi::AnyView(per_device[group.device]++);
        steps_->segments.push_back(std::move(segment));
      }
    }
  }
}

std::string GraphRuntime::OffloadPlanJSON(int device) const {
  namespace json = ffi::json;
  if (device < 0 || device >= static_cast<int>(devices_.size())) {
    TVM_FFI_THROW(IndexError) << "device " << device << " is out of range";
  }
  std::unordered_map<uint32_t, int64_t> position;  // entry id -> index into "entries"
  json::Array entries, segments;
  std::unordered_map<const DLTensor*, uint32_t> eid_of;  // kernel args point at data entries
  for (uint32_t eid = 0; eid < data_entry_.size() + implicit_copies_.size(); ++eid) {
    eid_of.emplace(GetEntry(eid).GetDLTensorPtr(), eid);
  }
  auto entry_index = [&](const DLTensor* tensor) -> int64_t {
    auto found = eid_of.find(tensor);
    if (found == eid_of.end()) TVM_FFI_THROW(InternalError) << "argument is not a data entry";
    auto [it, inserted] = position.emplace(found->second, static_cast<int64_t>(entries.size()));
    if (inserted) entries.push_back(int64_t(found->second));
    return it->second;
  };
  for (const OffloadSegment& segment : steps_->segments) {
    if (segment.device != device) continue;
    json::Array ops;
    for (uint32_t i = segment.begin; i < segment.end; ++i) {
      const OpExec& step = steps_->op_execs[i];
      json::Array args;
      for (const ffi::AnyView& arg : step.args) args.push_back(entry_index(arg.cast<DLTensor*>()));
      ops.push_back(json::Object{{ffi::String("func_name"), ffi::String(graph_.nodes[step.node_id].func_name)},
                                 {ffi::String("node"), ffi::String(graph_.describe_node(step.node_id))},
                                 {ffi::String("args"), args}});
    }
    segments.push_back(ops);
  }
  return std::string(json::Stringify(json::Object{{ffi::String("entries"), entries},
                                                  {ffi::String("segments"), segments}}));
}

ffi::Tensor GraphRuntime::GetEntry(uint32_t eid) const {
  if (eid < data_entry_.size()) return data_entry_[eid];
  if (eid - data_entry_.size() < implicit_copies_.size()) return implicit_copies_[eid - data_entry_.size()];
  TVM_FFI_THROW(IndexError) << "entry " << eid << " is out of range";
}

void GraphRuntime::AttachOffloadRunner(int device, ffi::Function run_segment) {
  ExclusiveUse use(this, "attach_offload_runner");
  bool any = false;
  for (OffloadSegment& segment : steps_->segments) {
    if (segment.device != device) continue;
    segment.runner = run_segment;
    any = true;
  }
  if (!any) TVM_FFI_THROW(ValueError) << "device " << device << " has no offload segments";
  SetupPreparedCalls();
}

}  // namespace tvm_hetero
