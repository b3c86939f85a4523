/*!
 * \file graph_runtime.cc
 * \brief The runtime over its three pieces: Init builds the plan (BuildPlan, then the crossing and
 *        offload passes) and the default frame; frames hold per-run memory; the executors of
 *        plan/frame_executor.h run (plan, frame), the one the execution mode calls for chosen here.
 *        Parameters, stats, trace and profile live here too.
 */
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/device_assignment.h>
#include <tvm_hetero/graph_runtime.h>
#include <tvm_hetero/param_blob.h>

#include "plan/execution_plan.h"
#include "plan/execution_schedule.h"
#include "plan/frame_executor.h"
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
  if (device_libs.size() > devices.size()) {
    TVM_FFI_THROW(ValueError) << "got " << device_libs.size() << " per-device libraries for " << devices.size()
                              << " devices";
  }
  model_ = std::make_unique<PlanInputs>();
  PlanInputs& model = *model_;
  model.graph = &graph_;
  model.storage = &storage_plan_;
  model.lib = std::move(lib);
  model.device_libs = std::move(device_libs);
  model.devices = std::move(devices);
  model.node_device = AssignDevices(graph_, model.devices, kind);
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
  for (const DLDevice& dev : model.devices) offsets_usable.push_back(support::OffsetsUsable(dev));
  storage_plan_ = PlanStorage(graph_, model.node_device, offsets_usable);
  plan_ = std::make_shared<const ExecutionPlan>(
      FormOffloadSegments(InsertDeviceCrossings(BuildPlan(model), model), model.devices));
  default_frame_ = std::make_unique<RunFrame>(model, plan_, FrameSharing());
  SetupExecution();
  SetupCacheHooks();
  InvalidateCaches();  // a library reused after another runtime may hold caches of freed memory
}

const std::vector<DLDevice>& GraphRuntime::devices() const { return model_->devices; }

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
  if (model_->lib.has_value()) visit(*model_->lib);
  for (const auto& lib : model_->device_libs) {
    if (lib.has_value()) visit(*lib);
  }
}

void GraphRuntime::InvalidateCaches() const {
  for (const ffi::Function& hook : invalidate_caches_) hook();
}

void GraphRuntime::UsePlan(ExecutionPlan plan) {
  plan_ = std::make_shared<const ExecutionPlan>(std::move(plan));
  default_frame_->UsePlan(plan_);
  SetupExecution();
}

void GraphRuntime::SetupExecution() {
  schedule_ = std::make_shared<const ExecutionSchedule>(
      ScheduleFor(*plan_, model_->devices, execution_, executor_options_));
  default_frame_->UseExecutor(nullptr);  // its threads stop before the next executor's start
  default_frame_->UseExecutor(ExecutorFor(*default_frame_));
}

std::unique_ptr<FrameExecutor> GraphRuntime::ExecutorFor(RunFrame& frame) const {
  if (schedule_->use_executors) return std::make_unique<ConcurrentExecutor>(*model_, plan_, frame, schedule_);
  return std::make_unique<SerialExecutor>(*model_, plan_, frame);
}

void GraphRuntime::SetExecution(ExecutionMode mode, std::vector<ExecutorOptions> options) {
  RunFrame::ExclusiveUse use(default_frame_.get(), "set_execution");
  if (options.size() > model_->devices.size()) {
    TVM_FFI_THROW(ValueError) << "got executor options for " << options.size() << " devices, the runtime has "
                              << model_->devices.size();
  }
  execution_ = mode;
  executor_options_ = std::move(options);
  SetupExecution();
}

bool GraphRuntime::FramesSupported() const {
  return std::none_of(model_->devices.begin(), model_->devices.end(), support::IsRemote);
}

std::unique_ptr<RunFrame> GraphRuntime::Frame(const FrameOptions& options) const {
  if (!FramesSupported()) {
    const DLDevice remote = *std::find_if(model_->devices.begin(), model_->devices.end(), support::IsRemote);
    TVM_FFI_THROW(ValueError) << "frame: device " << DeviceName(remote)
                              << " is remote; frames need local devices (a remote runner serves the runtime's "
                                 "own memory): use one runtime per thread there";
  }
  // Parameters set so far are shared, and so are the inputs the options name even if not set yet.
  FrameSharing sharing;
  sharing.from = default_frame_.get();
  sharing.own_call_sites = !options.share_call_sites;
  sharing.scratch = options.scratch;
  sharing.inputs.assign(NumInputs(), 0);
  for (int index : options.shared_inputs) {
    sharing.inputs[CheckedInputIndex(index, "input")] = 1;
    sharing.wait_for_inputs |= !default_frame_->input_set(index);
  }
  for (int index = 0; index < NumInputs(); ++index) {
    sharing.inputs[index] |= input_is_param_[index] && default_frame_->input_set(index);
  }
  auto frame = std::make_unique<RunFrame>(*model_, plan_, sharing);
  frame->UseExecutor(ExecutorFor(*frame));
  return frame;
}

int64_t GraphRuntime::ScratchBytes(DLDevice device) const { return RunFrame::ScratchBytes(*model_, *plan_, device); }

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
    DLDevice have = shared.device(), need = default_frame_->tensor(eid).device();
    if (!support::SameDevice(have, need) && !support::SharesMemory(have, need)) {
      TVM_FFI_THROW(ValueError) << "share_params '" << name << "': the other runtime holds it on "
                                << DeviceName(have) << ", this one needs it on " << DeviceName(need);
    }
    if (!other.default_frame_->input_set(other_index)) {
      TVM_FFI_THROW(ValueError) << "share_params '" << name << "': the other runtime never set it";
    }
    // Two devices of host memory (a CPU and an accelerator reading host buffers) read the same bytes:
    // the tensor is aliased as a view naming this runtime's device.
    shares.emplace_back(index, support::SameDevice(have, need)
                                   ? shared
                                   : support::ViewOf(shared, 0, shared.shape(), shared.dtype(), need));
  }
  for (const auto& [index, shared] : shares) {
    default_frame_->ShareInput(index, shared);
    input_is_param_[index] = 1;
  }
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
                     !support::TraitsOf(model_->devices[model_->node_device[step.node]]).runs_tvm_kernels;
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
  for (size_t bytes : storage_plan_.BytesPerDevice(model_->devices.size())) storage_bytes.push_back(int64_t(bytes));
  for (const DLDevice& dev : model_->devices) device_names.push_back(ffi::String(DeviceName(dev)));
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
  frame.CheckInputsSet();
  json::Array all_runs;
  for (const StepSpans& run : frame.executor().TimedRuns(runs)) {
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
  for (const DLDevice& dev : model_->devices) names.push_back(ffi::String(DeviceName(dev)));
  return std::string(json::Stringify(json::Object{{ffi::String("devices"), names}, {ffi::String("runs"), all_runs}}));
}

std::string GraphRuntime::ProfileJSON(int repeat) {
  namespace json = ffi::json;
  RunFrame& frame = *default_frame_;
  RunFrame::ExclusiveUse use(&frame, "profile");
  frame.CheckInputsSet();
  repeat = std::max(repeat, 1);
  const ExecutionPlan& plan = *plan_;
  std::vector<double> step_us(plan.steps.size(), 0.0);
  // Every step on the caller, one after another, each waited for: per-step times that add up.
  SerialExecutor serial(*model_, plan_, frame);
  for (const StepSpans& run : serial.TimedRuns(repeat)) {
    for (size_t i = 0; i < run.size(); ++i) step_us[i] += (run[i].second - run[i].first) / repeat;
  }
  json::Array nodes, groups;
  std::vector<double> group_us(plan.groups.size(), 0.0);
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    uint32_t nid = plan.steps[i].node;
    nodes.push_back(json::Object{{ffi::String("node_id"), int64_t(nid)},
                                 {ffi::String("name"), ffi::String(graph_.nodes[nid].name)},
                                 {ffi::String("func_name"), ffi::String(graph_.nodes[nid].func_name)},
                                 {ffi::String("device"), int64_t(model_->node_device[nid])},
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
