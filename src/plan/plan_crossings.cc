/*!
 * \file plan/plan_crossings.cc
 * \brief InsertDeviceCrossings: a kernel argument living on another device becomes a shared view
 *        (devices sharing memory: a wait, no copy) or the buffer of one implicit copy per (entry,
 *        reader device), placed just before its first reader; then the device groups.
 *
 * Guarantee: afterwards every kernel argument is a tensor on the kernel's device, and every copy
 * buffer is written (by its copy) before any step reads it, since the copy sits before the first
 * reader and the entry it copies is written before that reader in the serial order already.
 * Graph `__copy` nodes are left as they are.
 */
#include <map>

#include "plan/execution_plan.h"
#include "plan/plan_regions.h"
#include "support/device.h"

namespace tvm_hetero {

ExecutionPlan InsertDeviceCrossings(ExecutionPlan plan, const PlanInputs& in) {
  const Graph& graph = *in.graph;
  std::map<std::pair<uint32_t, int>, uint32_t> buffer_of;  // (entry, device) -> copy buffer tensor id
  std::vector<PlanStep> steps;
  steps.reserve(plan.steps.size());
  for (PlanStep& step : plan.steps) {
    if (step.kind == PlanStep::Kind::kKernel) {
      const size_t num_inputs = graph.nodes[step.node].inputs.size();
      const DLDevice want = in.devices[step.device];
      for (size_t k = 0; k < num_inputs; ++k) {
        const uint32_t entry = step.args[k];
        const DLDevice have = in.devices[plan.tensors[entry].device];
        if (support::SameDevice(have, want)) continue;
        if (support::SharesMemory(have, want)) {
          step.args[k] = static_cast<uint32_t>(plan.tensors.size());
          plan.tensors.push_back(PlanTensor{PlanTensor::Source::kSharedView, entry, step.device});
          ++plan.num_shared_views;
          continue;
        }
        auto [it, inserted] = buffer_of.emplace(std::make_pair(entry, step.device), 0);
        if (inserted) {
          it->second = static_cast<uint32_t>(plan.tensors.size());
          plan.tensors.push_back(PlanTensor{PlanTensor::Source::kCopyBuffer, entry, step.device});
          const uint32_t slot = plan.num_pool_slots + static_cast<uint32_t>(plan.copy_buffers.size());
          plan.copy_buffers.push_back(it->second);
          const size_t bytes = EntryBytes(graph.shapes[entry], graph.dtypes[entry]);
          PlanStep copy;
          copy.kind = PlanStep::Kind::kCopy;
          copy.node = step.node;
          copy.device = support::IsRemote(have) ? plan.tensors[entry].device : step.device;
          copy.args = {entry, it->second};
          copy.staged = support::NeedsStaging(have, want);
          copy.remote = support::IsRemote(have) || support::IsRemote(want);
          copy.reads.push_back(EntryRegion(graph, *in.storage, entry));
          copy.writes.push_back(MemoryRegion{slot, 0, bytes});
          plan.bytes_copied_per_run += static_cast<int64_t>(bytes);
          steps.push_back(std::move(copy));
        }
        step.args[k] = it->second;
        const uint32_t slot = plan.num_pool_slots + static_cast<uint32_t>(EntryNumber(plan, it->second) - plan.num_entries);
        step.reads[k] = MemoryRegion{slot, 0, EntryBytes(graph.shapes[entry], graph.dtypes[entry])};
      }
    }
    steps.push_back(std::move(step));
  }
  plan.steps = std::move(steps);
  plan.groups.clear();
  for (uint32_t i = 0; i < plan.steps.size(); ++i) {
    plan.steps[i].origin = i;
    const int device = in.node_device[plan.steps[i].node];
    if (plan.groups.empty() || plan.groups.back().device != device) plan.groups.push_back(ExecGroup{device, i, i});
    plan.groups.back().end = i + 1;
  }
  return plan;
}

}  // namespace tvm_hetero
