/*!
 * \file graph_runtime_offload.cc
 * \brief The runtime's side of offload: the plan's remote segments described for the remote runner
 *        (OffloadPlanJSON; src/offload_runner.cc builds it in the remote process) and, once a runner
 *        is attached, the plan with each segment as one group step (AttachOffloadRunner, a plan pass
 *        in plan/plan_offload.cc, which also states why moving the carried copies is safe).
 */
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/graph_runtime.h>

#include <unordered_map>

#include "plan/execution_plan.h"
#include "plan/run_frame_use.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;

std::string GraphRuntime::OffloadPlanJSON(int device) const {
  namespace json = ffi::json;
  if (device < 0 || device >= static_cast<int>(devices().size())) {
    TVM_FFI_THROW(IndexError) << "device " << device << " is out of range";
  }
  const ExecutionPlan& plan = *plan_;
  std::unordered_map<int64_t, int64_t> position;  // GetEntry number -> index into "entries"
  json::Array entries, segments, transfers;
  auto entry_index = [&](uint32_t tensor) -> int64_t {
    int64_t number = EntryNumber(plan, tensor);
    if (number < 0) TVM_FFI_THROW(InternalError) << "argument is not a data entry";
    auto [it, inserted] = position.emplace(number, static_cast<int64_t>(entries.size()));
    if (inserted) entries.push_back(number);
    return it->second;
  };
  for (const OffloadSegment& segment : plan.segments) {
    if (segment.device != device) continue;
    // Before a runner is attached the segment's steps sit in the step list; after, in sub_steps.
    std::vector<const PlanStep*> body, outputs;
    if (segment.attached) {
      for (uint32_t k = 0; k < segment.sub_steps.size(); ++k) {
        (k < segment.num_body_steps ? body : outputs).push_back(&segment.sub_steps[k]);
      }
    } else {
      for (uint32_t i = segment.begin; i < segment.end; ++i) body.push_back(&plan.steps[i]);
      for (uint32_t i : segment.outputs) outputs.push_back(&plan.steps[i]);
    }
    json::Array ops, inputs, output_entries;
    for (const PlanStep* step : body) {
      if (step->kind != PlanStep::Kind::kKernel) {
        inputs.push_back(entry_index(step->args[1]));  // an input: sent with the call
        continue;
      }
      json::Array args;
      for (uint32_t t : step->args) args.push_back(entry_index(t));
      ops.push_back(json::Object{{ffi::String("func_name"), ffi::String(graph_.nodes[step->node].func_name)},
                                 {ffi::String("node"), ffi::String(graph_.describe_node(step->node))},
                                 {ffi::String("args"), args}});
    }
    for (const PlanStep* step : outputs) output_entries.push_back(entry_index(step->args[0]));
    segments.push_back(ops);
    transfers.push_back(json::Object{{ffi::String("inputs"), inputs}, {ffi::String("outputs"), output_entries}});
  }
  return std::string(json::Stringify(json::Object{{ffi::String("entries"), entries},
                                                  {ffi::String("segments"), segments},
                                                  {ffi::String("transfers"), transfers}}));
}

ffi::Tensor GraphRuntime::GetEntry(uint32_t eid) const {
  const ExecutionPlan& plan = *plan_;
  if (eid < plan.num_entries) return default_frame_->tensor(eid);
  if (eid - plan.num_entries < plan.copy_buffers.size()) return default_frame_->tensor(plan.copy_buffers[eid - plan.num_entries]);
  TVM_FFI_THROW(IndexError) << "entry " << eid << " is out of range";
}

void GraphRuntime::AttachOffloadRunner(int device, ffi::Function run_segment) {
  RunFrame::ExclusiveUse use(default_frame_.get(), "attach_offload_runner");
  UsePlan(tvm_hetero::AttachOffloadRunner(*plan_, device, std::move(run_segment)));
}

}  // namespace tvm_hetero
