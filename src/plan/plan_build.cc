/*!
 * \file plan/plan_build.cc
 * \brief BuildPlan: the graph as written, one step per non-input node in node order; and the plan's
 *        printed form. Pure: reads the graph, devices, libraries and storage plan, allocates nothing.
 */
#include <tvm_hetero/storage_plan.h>

#include <sstream>

#include "plan/execution_plan.h"
#include "plan/plan_regions.h"
#include "support/device.h"
#include "support/tensor_check.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;

namespace {

/*! \brief Throw naming the copy node unless its source and destination entries have one type. */
void CheckCopyTypes(const Graph& graph, uint32_t nid, uint32_t from, uint32_t to) {
  DLTensor source{nullptr, DLDevice{kDLCPU, 0}, static_cast<int32_t>(graph.shapes[from].size()), graph.dtypes[from],
                  const_cast<int64_t*>(graph.shapes[from].data()), nullptr, 0};
  support::CheckTensor(&source, graph.shapes[to], graph.dtypes[to], graph.describe_node(nid) + " (__copy input)");
}

}  // namespace

ffi::Function FindKernel(const PlanInputs& in, uint32_t nid) {
  const GraphNode& node = in.graph->nodes[nid];
  const int device = in.node_device[nid];
  const bool own_lib = device < static_cast<int>(in.device_libs.size()) && in.device_libs[device].has_value();
  const ffi::Module& lib = own_lib ? *in.device_libs[device] : *in.lib;
  ffi::Optional<ffi::Function> kernel = lib->GetFunction(node.func_name, /*query_imports=*/true);
  if (!kernel.has_value()) {
    TVM_FFI_THROW(ValueError) << in.graph->describe_node(nid) << ": kernel '" << node.func_name
                              << "' is not in the library (nor its imports) of device " << device << " ("
                              << support::DeviceName(in.devices[device]) << ")";
  }
  return *kernel;
}

ExecutionPlan BuildPlan(const PlanInputs& in) {
  const Graph& graph = *in.graph;
  const StoragePlan& storage = *in.storage;
  ExecutionPlan plan;
  plan.num_entries = static_cast<uint32_t>(graph.num_entries());
  plan.num_pool_slots = static_cast<uint32_t>(storage.slots.size());
  for (uint32_t eid = 0; eid < plan.num_entries; ++eid) {
    plan.tensors.push_back(PlanTensor{PlanTensor::Source::kEntry, eid, storage.slots[storage.entry_slot[eid]].device});
  }
  for (uint32_t nid = 0; nid < graph.nodes.size(); ++nid) {
    const GraphNode& node = graph.nodes[nid];
    if (node.is_input()) continue;
    PlanStep step;
    step.node = nid;
    step.device = in.node_device[nid];
    if (node.func_name == "__nop") {
      step.kind = PlanStep::Kind::kNop;
    } else if (node.func_name == "__copy") {
      step.kind = PlanStep::Kind::kCopy;
      uint32_t from = graph.entry_id(node.inputs[0]), to = graph.entry_id(nid, 0);
      CheckCopyTypes(graph, nid, from, to);
      step.args = {from, to};
      DLDevice from_dev = in.devices[plan.tensors[from].device], to_dev = in.devices[plan.tensors[to].device];
      step.staged = support::NeedsStaging(from_dev, to_dev);
      step.remote = support::IsRemote(from_dev) || support::IsRemote(to_dev);
      // One thread per RPC session: a copy from a remote device runs on that device's executor.
      if (support::IsRemote(from_dev)) step.device = storage.entry_device[from];
      step.reads.push_back(EntryRegion(graph, storage, from));
      plan.bytes_copied_per_run += static_cast<int64_t>(EntryBytes(graph.shapes[to], graph.dtypes[to]));
    } else {
      step.kind = PlanStep::Kind::kKernel;
      step.function = FindKernel(in, nid);
      step.remote = support::IsRemote(in.devices[step.device]);
      for (const EntryRef& e : node.inputs) {
        step.args.push_back(graph.entry_id(e));
        step.reads.push_back(EntryRegion(graph, storage, graph.entry_id(e)));
      }
      for (uint32_t k = 0; k < node.num_outputs; ++k) step.args.push_back(graph.entry_id(nid, k));
    }
    for (uint32_t k = 0; k < node.num_outputs; ++k) step.writes.push_back(EntryRegion(graph, storage, graph.entry_id(nid, k)));
    step.origin = static_cast<uint32_t>(plan.steps.size());
    plan.steps.push_back(std::move(step));
  }
  return plan;
}

int64_t EntryNumber(const ExecutionPlan& plan, uint32_t tensor) {
  if (tensor < plan.num_entries) return tensor;
  for (size_t k = 0; k < plan.copy_buffers.size(); ++k) {
    if (plan.copy_buffers[k] == tensor) return plan.num_entries + static_cast<int64_t>(k);
  }
  return -1;
}

std::string ExecutionPlan::ToString(const Graph& graph) const {
  static const char* kKinds[] = {"kernel", "copy", "nop", "group"};
  std::ostringstream out;
  auto regions = [&](const std::vector<MemoryRegion>& list) {
    for (const MemoryRegion& r : list) out << " s" << r.slot << "[" << r.begin << "," << r.end << ")";
  };
  auto tensor = [&](uint32_t t) {
    const PlanTensor& pt = tensors[t];
    out << " t" << t;
    if (pt.source == PlanTensor::Source::kSharedView) out << "(view of e" << pt.entry << " on " << pt.device << ")";
    if (pt.source == PlanTensor::Source::kCopyBuffer) out << "(copy of e" << pt.entry << " on " << pt.device << ")";
  };
  auto line = [&](size_t i, const PlanStep& s, const char* indent) {
    out << indent << i << ": " << kKinds[static_cast<int>(s.kind)] << " " << graph.describe_node(s.node) << " on device "
        << s.device << (s.remote ? " (remote)" : "") << (s.staged ? " (staged)" : "");
    if (!s.args.empty()) out << " args";
    for (uint32_t t : s.args) tensor(t);
    out << " reads";
    regions(s.reads);
    out << " writes";
    regions(s.writes);
    out << "\n";
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    line(i, steps[i], "");
    if (steps[i].kind != PlanStep::Kind::kOffloadGroup) continue;
    const OffloadSegment& segment = segments[steps[i].segment];
    for (size_t k = 0; k < segment.sub_steps.size(); ++k) line(k, segment.sub_steps[k], k < segment.num_body_steps ? "  | " : "  > ");
  }
  return out.str();
}

}  // namespace tvm_hetero
