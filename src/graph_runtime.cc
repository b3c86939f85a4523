/*!
 * \file graph_runtime.cc
 * \brief The runtime over its three pieces: Init builds the plan (BuildPlan, then the crossing and
 *        offload passes) and the default frame; frames hold per-run memory; the executors in
 *        plan/step_execution.cc run (plan, frame). Parameters, stats, trace and profile live here.
 */
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/device_assignment.h>
#include <tvm_hetero/graph_runtime.h>
#include <tvm_hetero/param_blob.h>

#include "concurrency/device_executors.h"
#include "plan/execution_plan.h"
#include "plan/execution_schedule.h"
#include "plan/prepared_call.h"
#include "plan/run_frame_use.h"
#include "support/device.h"
#include "support/tensor_check.h"

#include <algorithm>
#include <sstream>

namespace tvm_hetero {

namespace ffi = tvm::ffi;
using support::DeviceName;

GraphRuntime::GraphRuntime() = default;

GraphRuntime::~GraphRuntime() = default;

void GraphRuntime::Init(const std::string& graph_json, ffi::Module lib, std::vector<DLDevice> devices,
                        DeviceIndexKind kind, std::vector<ffi::Optional<ffi::Module>> device_libs) {
  graph_ = ParseGraphJSON(graph_json);
  lib_ = std::move(lib);
  devices_ = std::move(devices);
  if (device_libs.size() > devices_.size()) {
    TVM_FFI_THROW(ValueError) << "got " << device_libs.size() << " per-device libraries for " << devices_.size()
                              << " devices";
  }
  device_libs_ = std::move(device_libs);
  node_device_ = AssignDevices(graph_, devices_, kind);
  for (uint32_t nid : graph_.arg_nodes) {
    const std::string& name = graph_.nodes[nid].name;
    if (!input_index_.emplace(name, static_cast<int>(input_nodes_.size())).second) {
      TVM_FFI_THROW(ValueError) << graph_.describe_node(nid) << ": another input has the name '" << name
                                << "'";
    }
    input_nodes_.push_back(nid);
  }
  input_is_param_.assign(input_nodes_.size(), 0);
  std::vector<bool> offsets_usable;
  for (const DLDevice& dev : devices_) offsets_usable.push_back(support::OffsetsUsable(dev));
  storage_plan_ = PlanStorage(graph_, node_device_, offsets_usable);
  PlanInputs in = Inputs();
  plan_ = std::make_shared<const ExecutionPlan>(FormOffloadSegments(InsertDeviceCrossings(BuildPlan(in), in), devices_));
  default_frame_.reset(new RunFrame(this, plan_, nullptr));
  SetupExecution();
  SetupCacheHooks();
  InvalidateCaches();  // a library reused after another runtime may hold caches of freed memory
}

PlanInputs GraphRuntime::Inputs() const {
  PlanInputs in;
  in.graph = &graph_;
  in.devices = devices_;
  in.node_device = node_device_;
  in.storage = &storage_plan_;
  in.lib = lib_;
  in.device_libs = device_libs_;
  return in;
}

void GraphRuntime::SetupCacheHooks() {
  invalidate_caches_.clear();
  std::vector<const ffi::ModuleObj*> seen;
  auto visit = [&](const ffi::Module& root) {
    std::vector<ffi::Module> stack{root};
    while (!stack.empty()) {
      ffi::Module mod = stack.back();
      stack.pop_back();
      if (std::find(seen.begin(), seen.end(), mod.get()) != seen.end()) continue;
      seen.push_back(mod.get());
      if (auto hook = mod->GetFunction(kInvalidateCachesFunction, /*query_imports=*/false)) {
        invalidate_caches_.push_back(*hook);
      }
      for (const ffi::Any& imported : mod->imports()) stack.push_back(imported.cast<ffi::Module>());
    }
  };
  if (lib_.has_value()) visit(*lib_);
  for (const auto& lib : device_libs_) {
    if (lib.has_value()) visit(*lib);
  }
}

void GraphRuntime::InvalidateCaches() const {
  for (const ffi::Function& hook : invalidate_caches_) hook();
}

void GraphRuntime::UsePlan(ExecutionPlan plan) {
  plan_ = std::make_shared<const ExecutionPlan>(std::move(plan));
  default_frame_->executors_->Stop();
  default_frame_->plan_ = plan_;
  default_frame_->PrepareCalls();
  SetupExecution();
}

void GraphRuntime::SetupExecution() {
  schedule_ = std::make_shared<const ExecutionSchedule>(ScheduleFor(*plan_, devices_, execution_, executor_options_));
  default_frame_->StartExecutors(schedule_);
}

void GraphRuntime::SetExecution(ExecutionMode mode, std::vector<ExecutorOptions> options) {
  RunFrame::ExclusiveUse use(default_frame_.get(), "set_execution");
  if (options.size() > devices_.size()) {
    TVM_FFI_THROW(ValueError) << "got executor options for " << options.size() << " devices, the runtime has "
                              << devices_.size();
  }
  execution_ = mode;
  executor_options_ = std::move(options);
  SetupExecution();
}

std::unique_ptr<RunFrame> GraphRuntime::Frame(const FrameOptions& options) const {
  for (const DLDevice& dev : devices_) {
    if (support::IsRemote(dev)) {
      TVM_FFI_THROW(ValueError) << "frame: device " << DeviceName(dev)
                                << " is remote; frames need local devices (a remote runner serves the runtime's "
                                   "own memory): use one runtime per thread there";
    }
  }
  std::unique_ptr<RunFrame> frame(new RunFrame(this, plan_, default_frame_.get(), options));
  frame->StartExecutors(schedule_);
  return frame;
}

std::string GraphRuntime::PlanText() const { return plan_->ToString(graph_); }

const std::vector<ExecGroup>& GraphRuntime::groups() const { return plan_->groups; }

void GraphRuntime::Run() { default_frame_->Run(); }

int GraphRuntime::GetInputIndex(const std::string& name) const {
  auto it = input_index_.find(name);
  return it == input_index_.end() ? -1 : it->second;
}

const std::string& GraphRuntime::GetInputName(int index) const {
  return graph_.nodes[input_nodes_[CheckedInputIndex(index, "input")]].name;
}

int GraphRuntime::CheckedInputIndex(int index, const char* what) const {
  int limit = std::string(what) == "output" ? NumOutputs() : NumInputs();
  if (index < 0 || index >= limit) {
    TVM_FFI_THROW(IndexError) << what << " index " << index << " is out of range: the graph has " << limit
                              << " " << what << "(s)";
  }
  return index;
}

void GraphRuntime::CheckInputValue(int index, const DLTensor* value, const std::string& what) const {
  CheckedInputIndex(index, "input");
  uint32_t eid = graph_.entry_id(input_nodes_[index], 0);
  support::CheckTensor(value, graph_.shapes[eid], graph_.dtypes[eid], what);
}

void GraphRuntime::SetInput(int index, const DLTensor* value) {
  RunFrame::ExclusiveUse use(default_frame_.get(), "set_input");
  CheckedInputIndex(index, "input");
  default_frame_->WriteInput(index, value, "input '" + GetInputName(index) + "'");
  // A parameter written through set_input must not leave weights derived from its old value.
  if (input_is_param_[index]) InvalidateCaches();
}

void GraphRuntime::MarkInputSet(int index) { default_frame_->MarkInputSet(index); }

ffi::Tensor GraphRuntime::GetInput(int index) const { return default_frame_->GetInput(index); }

ffi::Tensor GraphRuntime::GetOutput(int index) const { return default_frame_->GetOutput(index); }

void GraphRuntime::CopyOutputTo(int index, DLTensor* out) const { default_frame_->CopyOutputTo(index, out); }

void GraphRuntime::BindParams(const std::vector<std::pair<int, const DLTensor*>>& params) {
  for (const auto& [index, value] : params) {
    default_frame_->WriteInput(index, value, "parameter '" + GetInputName(index) + "'");
    input_is_param_[index] = 1;
  }
  InvalidateCaches();
}

void GraphRuntime::SetParam(int index, const DLTensor* value) {
  RunFrame::ExclusiveUse use(default_frame_.get(), "set_params");
  CheckInputValue(index, value, "parameter '" + GetInputName(index) + "'");
  BindParams({{index, value}});
}

void GraphRuntime::SetParams(const ffi::Map<ffi::String, ffi::Tensor>& params) {
  RunFrame::ExclusiveUse use(default_frame_.get(), "set_params");
  std::vector<std::pair<int, const DLTensor*>> checked;
  for (const auto& [name, value] : params) {
    int index = GetInputIndex(std::string(name));
    if (index < 0) TVM_FFI_THROW(KeyError) << "set_params: parameter '" << name << "' is not an input of the graph";
    CheckInputValue(index, value.GetDLTensorPtr(), "set_params: parameter '" + std::string(name) + "'");
    checked.emplace_back(index, value.GetDLTensorPtr());
  }
  BindParams(checked);
}

void GraphRuntime::LoadParams(const std::string& param_bytes, const std::string& what) {
  RunFrame::ExclusiveUse use(default_frame_.get(), "load_params");
  std::vector<NamedParam> params = ReadParamBlob(param_bytes, what);
  std::vector<std::pair<int, const DLTensor*>> checked;
  for (const NamedParam& p : params) {
    int index = GetInputIndex(p.name);
    if (index < 0) {
      TVM_FFI_THROW(KeyError) << what << ": parameter '" << p.name << "' is not an input of the graph";
    }
    CheckInputValue(index, p.value.GetDLTensorPtr(), what + ": parameter '" + p.name + "'");
    checked.emplace_back(index, p.value.GetDLTensorPtr());
  }
  BindParams(checked);
}

void GraphRuntime::ShareParams(const GraphRuntime& other, const std::string& param_bytes) {
  RunFrame::ExclusiveUse use(default_frame_.get(), "share_params");
  std::vector<std::pair<int, ffi::Tensor>> shares;  // (input, the other runtime's tensor)
  for (const NamedParam& p : ReadParamBlob(param_bytes, "share_params")) {
    const std::string& name = p.name;
    int index = GetInputIndex(name);
    int other_index = other.GetInputIndex(name);
    if (index < 0 || other_index < 0) {
      TVM_FFI_THROW(KeyError) << "share_params: parameter '" << name << "' is not an input of both graphs";
    }
    uint32_t eid = graph_.entry_id(input_nodes_[index], 0);
    const ffi::Tensor& shared = other.GetInput(other_index);
    CheckInputValue(index, shared.GetDLTensorPtr(), "share_params '" + name + "'");
    DLDevice have = shared.device(), need = default_frame_->tensors_[eid].device();
    if (!support::SameDevice(have, need) && !support::SharesMemory(have, need)) {
      TVM_FFI_THROW(ValueError) << "share_params '" << name << "': the other runtime holds it on "
                                << DeviceName(have) << ", this one needs it on " << DeviceName(need);
    }
    if (!other.default_frame_->input_set_[other_index]) {
      TVM_FFI_THROW(ValueError) << "share_params '" << name << "': the other runtime never set it";
    }
    // Two devices of host memory (a CPU and an accelerator reading host buffers) read the same bytes:
    // the tensor is aliased as a view naming this runtime's device.
    shares.emplace_back(index, support::SameDevice(have, need)
                                   ? shared
                                   : support::ViewOf(shared, 0, shared.shape(), shared.dtype(), need));
  }
  RunFrame& frame = *default_frame_;
  for (const auto& [index, shared] : shares) {
    uint32_t eid = graph_.entry_id(input_nodes_[index], 0);
    frame.tensors_[eid] = shared;
    frame.dl_[eid] = *shared.GetDLTensorPtr();
    // Shared views of the parameter read the other runtime's bytes too.
    for (uint32_t t = plan_->num_entries; t < plan_->tensors.size(); ++t) {
      const PlanTensor& pt = plan_->tensors[t];
      if (pt.entry != eid || pt.source != PlanTensor::Source::kSharedView) continue;
      frame.tensors_[t] = support::ViewOf(shared, 0, shared.shape(), shared.dtype(), devices_[pt.device]);
      frame.dl_[t] = *frame.tensors_[t].GetDLTensorPtr();
    }
    frame.MarkInputSet(index);
    input_is_param_[index] = 1;
  }
  frame.PrepareCalls();  // remote groups send bytes from pointers taken at preparation
  InvalidateCaches();
}

std::string GraphRuntime::StatsJSON() const {
  namespace json = ffi::json;
  const ExecutionPlan& plan = *plan_;
  int copies = 0;
  // Graph executions of devices driven through a vendor runtime (an NPU): one per kernel step there.
  int64_t vendor_graphs = 0;
  int64_t carried = 0;  // copies travelling inside a remote group's call
  auto count = [&](const PlanStep& step, bool in_group) {
    copies += step.kind == PlanStep::Kind::kCopy;
    carried += in_group && step.kind == PlanStep::Kind::kCopy;
    vendor_graphs += step.kind == PlanStep::Kind::kKernel &&
                     !support::TraitsOf(devices_[node_device_[step.node]]).runs_tvm_kernels;
  };
  int64_t num_steps = 0;
  for (const PlanStep& step : plan.steps) {
    if (step.kind != PlanStep::Kind::kOffloadGroup) {
      count(step, false);
      ++num_steps;
      continue;
    }
    for (const PlanStep& sub : plan.segments[step.segment].sub_steps) {
      count(sub, true);
      ++num_steps;
    }
  }
  json::Array storage_bytes, device_names, group_devices;
  for (size_t bytes : storage_plan_.BytesPerDevice(devices_.size())) storage_bytes.push_back(int64_t(bytes));
  for (const DLDevice& dev : devices_) device_names.push_back(ffi::String(DeviceName(dev)));
  for (const ExecGroup& g : plan.groups) group_devices.push_back(int64_t(g.device));
  const RunFrame& frame = *default_frame_;
  const int64_t remote_calls = frame.remote_compute_calls.load(), remote_copies = frame.remote_copies.load();
  json::Object stats{
      {ffi::String("num_nodes"), int64_t(graph_.nodes.size())},
      {ffi::String("num_ops"), num_steps},
      {ffi::String("num_groups"), int64_t(plan.groups.size())},
      {ffi::String("num_copies"), int64_t(copies)},
      {ffi::String("device_switches"), int64_t(plan.groups.empty() ? 0 : plan.groups.size() - 1)},
      {ffi::String("storage_bytes"), storage_bytes},
      {ffi::String("num_storage_slots"), int64_t(storage_plan_.slots.size())},
      {ffi::String("devices"), device_names},
      {ffi::String("group_devices"), group_devices},
      {ffi::String("offload_segments"), int64_t(plan.segments.size())},
      {ffi::String("remote_compute_calls"), remote_calls},
      {ffi::String("remote_copies"), remote_copies},
      {ffi::String("cross_process_calls"), remote_calls + remote_copies},
      {ffi::String("round_trips"), remote_calls + remote_copies},
      {ffi::String("copies_in_remote_calls"), carried},
      {ffi::String("execution"), ffi::String(execution_ == ExecutionMode::kConcurrent ? "concurrent" : "serial")},
      {ffi::String("shared_edges"), plan.num_shared_views},
      {ffi::String("implicit_copies"), int64_t(plan.copy_buffers.size())},
      {ffi::String("bytes_copied"), plan.bytes_copied_per_run},
      {ffi::String("cross_device_waits"), int64_t(schedule_->num_waits)},
      {ffi::String("accelerator_graph_executions"), vendor_graphs},
      {ffi::String("io_bytes_copied"), frame.io_bytes_copied()},
      {ffi::String("frame_bytes"), frame.allocated_bytes()},
  };
  return std::string(json::Stringify(stats));
}

std::string GraphRuntime::TraceJSON(int runs) {
  namespace json = ffi::json;
  RunFrame& frame = *default_frame_;
  RunFrame::ExclusiveUse use(&frame, "trace");
  json::Array all_runs;
  for (const auto& run : frame.TimedRuns(runs, /*serial=*/false)) {
    json::Array spans;
    for (uint32_t i = 0; i < run.size(); ++i) {
      if (run[i].first < 0) continue;
      const PlanStep& step = plan_->steps[i];
      static const char* kKinds[] = {"kernel", "copy", "nop", "group"};
      spans.push_back(json::Object{{ffi::String("step"), int64_t(i)},
                                   {ffi::String("node"), int64_t(step.node)},
                                   {ffi::String("name"), ffi::String(graph_.nodes[step.node].name)},
                                   {ffi::String("kind"), ffi::String(kKinds[static_cast<int>(step.kind)])},
                                   {ffi::String("device"), int64_t(step.device)},
                                   {ffi::String("start_us"), run[i].first},
                                   {ffi::String("end_us"), run[i].second}});
    }
    all_runs.push_back(spans);
  }
  json::Array names;
  for (const DLDevice& dev : devices_) names.push_back(ffi::String(DeviceName(dev)));
  return std::string(json::Stringify(json::Object{{ffi::String("devices"), names}, {ffi::String("runs"), all_runs}}));
}

std::string GraphRuntime::ProfileJSON(int repeat) {
  namespace json = ffi::json;
  RunFrame& frame = *default_frame_;
  RunFrame::ExclusiveUse use(&frame, "profile");
  repeat = std::max(repeat, 1);
  const ExecutionPlan& plan = *plan_;
  std::vector<double> step_us(plan.steps.size(), 0.0);
  for (const auto& run : frame.TimedRuns(repeat, /*serial=*/true)) {
    for (size_t i = 0; i < run.size(); ++i) step_us[i] += (run[i].second - run[i].first) / repeat;
  }
  json::Array nodes, groups;
  std::vector<double> group_us(plan.groups.size(), 0.0);
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    uint32_t nid = plan.steps[i].node;
    nodes.push_back(json::Object{{ffi::String("node_id"), int64_t(nid)},
                                 {ffi::String("name"), ffi::String(graph_.nodes[nid].name)},
                                 {ffi::String("func_name"), ffi::String(graph_.nodes[nid].func_name)},
                                 {ffi::String("device"), int64_t(node_device_[nid])},
                                 {ffi::String("time_us"), step_us[i]}});
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      if (plan.groups[g].begin <= plan.steps[i].origin && plan.steps[i].origin < plan.groups[g].end) group_us[g] += step_us[i];
    }
  }
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const ExecGroup& group = plan.groups[g];
    groups.push_back(json::Object{{ffi::String("device"), int64_t(group.device)},
                                  {ffi::String("num_nodes"), int64_t(group.end - group.begin)},
                                  {ffi::String("time_us"), group_us[g]}});
  }
  return std::string(json::Stringify(json::Object{{ffi::String("nodes"), nodes}, {ffi::String("groups"), groups}}));
}

}  // namespace tvm_hetero
