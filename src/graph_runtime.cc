/*!
 * \file graph_runtime.cc
 * \brief Init prepares everything (storage, views, packed calls, groups) through the device layer
 *        (support/device.h); Run is one flat loop, or one submit to the device executors.
 */
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/device_assignment.h>
#include <tvm_hetero/graph_runtime.h>
#include <tvm_hetero/param_blob.h>

#include "concurrency/device_executors.h"
#include "concurrency/step_schedule.h"
#include "graph_runtime_steps.h"
#include "support/device.h"
#include "support/tensor_check.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <sstream>

namespace tvm_hetero {

namespace ffi = tvm::ffi;
using support::AllocTensor;
using support::CopyAcrossDevices;
using support::DeviceName;
using support::IsHost;
using support::IsRemote;
using support::Mutable;
using support::SameDevice;
using support::SharesMemory;
using support::StagingBuffer;
using support::ViewOf;

/*! \brief What concurrent execution and tracing need beside the steps themselves. */
struct GraphRuntime::Concurrency {
  /*! \brief One executor per device with steps. */
  DeviceExecutors executors;
  /*! \brief Memory read and written by each step, and the device whose executor runs it. */
  std::vector<StepAccess> access;
  /*! \brief Implicit copy of (entry, device) -> index into implicit_copies_ (setup only). */
  std::map<std::pair<uint32_t, int>, uint32_t> implicit_copy_of;
  /*! \brief Cross-device waits of the current schedule. */
  size_t num_waits = 0;
  /*! \brief Set by TraceJSON while its runs record step times (read between runs only). */
  bool tracing = false;
  std::chrono::steady_clock::time_point run_start;
  std::vector<double> span_start_us, span_end_us;
  /*! \brief Per step: the accelerator whose stream must drain before other devices may read
   *         the step's results (a kernel launch returns before the work is done), or none. */
  std::vector<std::optional<DLDevice>> sync_before_publish;
};

GraphRuntime::GraphRuntime()
    : steps_(std::make_unique<RuntimeSteps>()), concurrency_(std::make_unique<Concurrency>()) {}

GraphRuntime::~GraphRuntime() {
  // The executor threads run steps of this object: stop them before any member goes away.
  concurrency_->executors.Stop();
}

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
  input_set_.assign(input_nodes_.size(), 0);
  input_is_param_.assign(input_nodes_.size(), 0);
  num_inputs_unset_ = static_cast<int>(input_nodes_.size());
  for (const DLDevice& dev : devices_) {
    if (support::NeedsDrain(dev)) support::AddUnique(&devices_to_sync_, dev);
  }
  SetupStorage();
  SetupOpExecs();
  SetupGroups();
  SetupOffloadSegments();
  SetupPreparedCalls();
  SetupCacheHooks();
  InvalidateCaches();  // a library reused after another runtime may hold caches of freed memory
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

void GraphRuntime::SetupPreparedCalls() {
  steps_->calls.clear();
  for (const OpExec& step : steps_->op_execs) {
    PreparedCall call;
    if (step.kind == OpExec::Kind::kKernel) {
      bool remote = IsRemote(devices_[node_device_[step.node_id]]);
      call.mode = remote ? PreparedCall::Mode::kRemoteCall : PreparedCall::Mode::kCall;
      call.function = static_cast<const ffi::FunctionObj*>(step.kernel.get());
      call.args = step.args.data();
      call.num_args = static_cast<int32_t>(step.args.size());
    } else if (step.kind == OpExec::Kind::kCopy &&
               (IsRemote(step.copy_from->device) || IsRemote(step.copy_to->device))) {
      call.mode = PreparedCall::Mode::kRemoteStep;
    }
    steps_->calls.push_back(call);
  }
  // An offload segment with a runner is one call carrying its inputs and outputs; the steps it
  // covers are skipped.
  SetupSegmentCalls();
  for (const OffloadSegment& segment : steps_->segments) {
    if (!segment.runner.has_value()) continue;
    PreparedCall& first = steps_->calls[segment.begin];
    first.mode = PreparedCall::Mode::kRemoteGroup;
    first.function = static_cast<const ffi::FunctionObj*>(segment.runner.value().get());
    first.args = segment.call_args.data();
    first.num_args = static_cast<int32_t>(segment.call_args.size());
    for (uint32_t i = segment.begin + 1; i < segment.end; ++i) steps_->calls[i].mode = PreparedCall::Mode::kSkip;
    for (uint32_t i : segment.outputs) steps_->calls[i].mode = PreparedCall::Mode::kSkip;
  }
  SetupExecution();  // the steps changed: derive the schedule again
}

void GraphRuntime::SetupStorage() {
  std::vector<bool> offsets_usable;
  for (const DLDevice& dev : devices_) offsets_usable.push_back(support::OffsetsUsable(dev));
  storage_plan_ = PlanStorage(graph_, node_device_, offsets_usable);
  pool_.clear();
  for (const StorageSlot& slot : storage_plan_.slots) {
    int64_t nbytes = static_cast<int64_t>(std::max<size_t>(slot.nbytes, 1));
    pool_.push_back(AllocTensor(ffi::Shape({nbytes}), DLDataType{kDLUInt, 8, 1}, devices_[slot.device]));
  }
  data_entry_.clear();
  for (size_t eid = 0; eid < graph_.num_entries(); ++eid) {
    const ffi::Tensor& base = pool_[storage_plan_.entry_slot[eid]];
    data_entry_.push_back(ViewOf(base, storage_plan_.entry_offset[eid], ffi::Shape(graph_.shapes[eid]),
                                 graph_.dtypes[eid], base.device()));
  }
}

void GraphRuntime::SetupOpExecs() {
  steps_->op_execs.clear();
  shared_views_.clear();
  implicit_copies_.clear();
  concurrency_->implicit_copy_of.clear();
  concurrency_->access.clear();
  bytes_copied_per_run_ = 0;
  for (uint32_t nid = 0; nid < graph_.nodes.size(); ++nid) {
    const GraphNode& node = graph_.nodes[nid];
    if (node.is_input()) continue;
    OpExec step;
    step.node_id = nid;
    if (node.func_name == "__nop") {
      step.kind = OpExec::Kind::kNop;
    } else if (node.func_name == "__copy") {
      step.kind = OpExec::Kind::kCopy;
      step.copy_from = Mutable(data_entry_[graph_.entry_id(node.inputs[0])]);
      step.copy_to = Mutable(data_entry_[graph_.entry_id(nid, 0)]);
      CheckCompatible(graph_.entry_id(nid, 0), step.copy_from, graph_.describe_node(nid) + " (__copy input)");
      step.staging = StagingBuffer(step.copy_from->device, step.copy_to->device,
                                   ffi::Shape(graph_.shapes[graph_.entry_id(nid, 0)]), step.copy_to->dtype);
    } else {
      step.kind = OpExec::Kind::kKernel;
      int device = node_device_[nid];
      const ffi::Module& lib = device < static_cast<int>(device_libs_.size()) && device_libs_[device].has_value()
                                   ? *device_libs_[device]
                                   : *lib_;
      ffi::Optional<ffi::Function> kernel = lib->GetFunction(node.func_name, /*query_imports=*/true);
      if (!kernel.has_value()) {
        TVM_FFI_THROW(ValueError) << graph_.describe_node(nid) << ": kernel '" << node.func_name
                                  << "' is not in the library (nor its imports) of device " << device << " ("
                                  << DeviceName(devices_[device]) << ")";
      }
      step.kernel = *kernel;
      for (const EntryRef& e : node.inputs) step.args.emplace_back(KernelInput(nid, graph_.entry_id(e)));
      for (uint32_t k = 0; k < node.num_outputs; ++k) {
        step.args.emplace_back(Mutable(data_entry_[graph_.entry_id(nid, k)]));
      }
    }
    StepAccess access{node_device_[nid], {}, {}};
    if (step.kind == OpExec::Kind::kCopy) {
      uint32_t from = graph_.entry_id(node.inputs[0]);
      access.reads.push_back(EntryRegion(from));
      bytes_copied_per_run_ += static_cast<int64_t>(ffi::GetDataSize(*step.copy_to));
      // One thread per RPC session: a copy touching a remote device runs on that device's executor.
      if (IsRemote(step.copy_from->device)) access.device = storage_plan_.entry_device[from];
    } else {
      for (const EntryRef& e : node.inputs) access.reads.push_back(InputRegion(nid, graph_.entry_id(e)));
    }
    for (uint32_t k = 0; k < node.num_outputs && !node.is_input(); ++k) {
      access.writes.push_back(EntryRegion(graph_.entry_id(nid, k)));
    }
    steps_->op_execs.push_back(std::move(step));
    concurrency_->access.push_back(std::move(access));
  }
  // Outputs are read on the primary device; one made on a device sharing its memory is shown there.
  output_views_.clear();
  for (const EntryRef& head : graph_.heads) {
    const ffi::Tensor& entry = data_entry_[graph_.entry_id(head)];
    bool view = !SameDevice(entry.device(), devices_[0]) && SharesMemory(entry.device(), devices_[0]);
    output_views_.push_back(view ? ViewOf(entry, 0, entry.shape(), entry.dtype(),
                                                            devices_[0])
                                 : entry);
  }
}

void GraphRuntime::SetupGroups() {
  groups_.clear();
  for (uint32_t i = 0; i < steps_->op_execs.size(); ++i) {
    int device = node_device_[steps_->op_execs[i].node_id];
    if (groups_.empty() || groups_.back().device != device) groups_.push_back(ExecGroup{device, i, i});
    groups_.back().end = i + 1;
  }
}

void GraphRuntime::RunStep(const OpExec& step, ffi::Any* rv) const {
  switch (step.kind) {
    case OpExec::Kind::kKernel:
      step.kernel.CallPacked(step.args.data(), static_cast<int32_t>(step.args.size()), rv);
      break;
    case OpExec::Kind::kCopy:
      CopyAcrossDevices(step.copy_from, step.copy_to,
                        step.staging.defined() ? Mutable(step.staging) : nullptr);
      break;
    case OpExec::Kind::kNop:
      break;
  }
}

DLTensor* GraphRuntime::KernelInput(uint32_t nid, uint32_t eid) {
  const ffi::Tensor& entry = data_entry_[eid];
  const int device = node_device_[nid];
  DLDevice want = devices_[device];
  if (SameDevice(entry.device(), want)) return Mutable(entry);
  if (SharesMemory(entry.device(), want)) {
    // Same bytes, the reader's device: the edge costs a wait, not a copy.
    shared_views_.push_back(
        ViewOf(entry, 0, ffi::Shape(graph_.shapes[eid]), graph_.dtypes[eid], want));
    return Mutable(shared_views_.back());
  }
  // Separate memory and no copy in the graph: copy once per (entry, device), before the first reader.
  auto [it, inserted] =
      concurrency_->implicit_copy_of.emplace(std::make_pair(eid, device), static_cast<uint32_t>(implicit_copies_.size()));
  if (!inserted) return Mutable(implicit_copies_[it->second]);
  implicit_copies_.push_back(AllocTensor(ffi::Shape(graph_.shapes[eid]), graph_.dtypes[eid], want));
  OpExec copy;
  copy.kind = OpExec::Kind::kCopy;
  copy.node_id = nid;
  copy.copy_from = Mutable(entry);
  copy.copy_to = Mutable(implicit_copies_.back());
  copy.staging = StagingBuffer(copy.copy_from->device, want, ffi::Shape(graph_.shapes[eid]), graph_.dtypes[eid]);
  bytes_copied_per_run_ += static_cast<int64_t>(ffi::GetDataSize(*copy.copy_to));
  StepAccess access{device, {EntryRegion(eid)}, {InputRegion(nid, eid)}};
  if (IsRemote(entry.device())) access.device = storage_plan_.entry_device[eid];
  steps_->op_execs.push_back(std::move(copy));
  concurrency_->access.push_back(std::move(access));
  return Mutable(implicit_copies_.back());
}

const std::vector<StepAccess>& GraphRuntime::StepAccesses() const { return concurrency_->access; }

MemoryRegion GraphRuntime::EntryRegion(uint32_t eid) const {
  size_t begin = storage_plan_.entry_offset[eid];
  return MemoryRegion{storage_plan_.entry_slot[eid], begin, begin + EntryBytes(graph_.shapes[eid], graph_.dtypes[eid])};
}

MemoryRegion GraphRuntime::InputRegion(uint32_t nid, uint32_t eid) const {
  auto found = concurrency_->implicit_copy_of.find(std::make_pair(eid, node_device_[nid]));
  if (found == concurrency_->implicit_copy_of.end()) return EntryRegion(eid);
  // Implicit copies are slots of their own, numbered after the pool's.
  uint32_t slot = static_cast<uint32_t>(storage_plan_.slots.size()) + found->second;
  return MemoryRegion{slot, 0, EntryBytes(graph_.shapes[eid], graph_.dtypes[eid])};
}

void GraphRuntime::SetExecution(ExecutionMode mode, std::vector<ExecutorOptions> options) {
  ExclusiveUse use(this, "set_execution");
  if (options.size() > devices_.size()) {
    TVM_FFI_THROW(ValueError) << "got executor options for " << options.size() << " devices, the runtime has "
                              << devices_.size();
  }
  execution_ = mode;
  executor_options_ = std::move(options);
  SetupExecution();
}

void GraphRuntime::SetupExecution() {
  Concurrency& c = *concurrency_;
  c.executors.Stop();
  c.num_waits = 0;
  // Serial execution without options is the flat loop on the caller; with options, each device's
  // steps run on its configured executor, one device at a time (SerialStepSchedule).
  if (execution_ != ExecutionMode::kConcurrent && !HasExecutorOptions(executor_options_)) return;
  // An offloaded segment is one call at its first step, on its device's executor: that step touches
  // all the segment's steps and carried outputs touch.
  std::vector<StepAccess> access = c.access;
  for (const OffloadSegment& segment : steps_->segments) {
    if (!segment.runner.has_value()) continue;
    StepAccess& first = access[segment.begin];
    first.device = segment.device;
    auto absorb = [&](uint32_t i) {
      first.reads.insert(first.reads.end(), access[i].reads.begin(), access[i].reads.end());
      first.writes.insert(first.writes.end(), access[i].writes.begin(), access[i].writes.end());
      access[i].reads.clear();
      access[i].writes.clear();
    };
    for (uint32_t i = segment.begin + 1; i < segment.end; ++i) absorb(i);
    for (uint32_t i : segment.outputs) absorb(i);
  }
  const int num_devices = static_cast<int>(devices_.size());
  StepSchedule schedule = execution_ == ExecutionMode::kConcurrent ? DeriveStepSchedule(access, num_devices)
                                                                   : SerialStepSchedule(access, num_devices);
  c.num_waits = schedule.NumWaits();
  c.sync_before_publish.assign(steps_->op_execs.size(), std::nullopt);
  for (uint32_t i = 0; i < steps_->op_execs.size(); ++i) {
    DLDevice dev = devices_[access[i].device];
    if (schedule.awaited[i] && support::IsAsynchronous(dev)) c.sync_before_publish[i] = dev;
  }
  // One device with steps and no options of its own: the serial loop on the caller is the same
  // schedule without the executors' per-step indirection.
  int busy_devices = 0, last_busy = 0;
  for (int d = 0; d < static_cast<int>(schedule.device_steps.size()); ++d) {
    if (schedule.device_steps[d].empty()) continue;
    ++busy_devices;
    last_busy = d;
  }
  bool has_options = last_busy < static_cast<int>(executor_options_.size()) && !executor_options_[last_busy].empty();
  if (busy_devices <= 1 && !has_options) return;
  c.executors.Start(std::move(schedule), &GraphRuntime::RunStepOnExecutor, this, executor_options_);
}

void GraphRuntime::RunStepOnExecutor(void* self, uint32_t i) {
  auto* rt = static_cast<GraphRuntime*>(self);
  Concurrency& c = *rt->concurrency_;
  using Clock = std::chrono::steady_clock;
  if (c.tracing) c.span_start_us[i] = std::chrono::duration<double, std::micro>(Clock::now() - c.run_start).count();
  ffi::Any rv;
  try {
    const PreparedCall& call = rt->steps_->calls[i];
    if (call.mode == PreparedCall::Mode::kCall) {
      call.function->CallPacked(call.args, call.num_args, &rv);
    } else {
      rt->RunOtherStep(i, &rv);
    }
    if (const std::optional<DLDevice>& dev = c.sync_before_publish[i]) {
      support::SyncDevice(*dev);
    } else if (c.tracing) {
      // The kind's completion hook: a span is the device's work, not its launch.
      support::WaitForCompletion(rt->devices_[rt->node_device_[rt->steps_->op_execs[i].node_id]]);
    }
  } catch (const ffi::Error& err) {
    throw rt->ErrorAt(i, err);
  }
  if (c.tracing) c.span_end_us[i] = std::chrono::duration<double, std::micro>(Clock::now() - c.run_start).count();
}

ffi::Error GraphRuntime::ErrorAt(uint32_t i, const ffi::Error& err) const {
  std::ostringstream where;
  bool remote = false;  // the failing step talks to another process
  if (i < steps_->op_execs.size()) {
    uint32_t nid = steps_->op_execs[i].node_id;
    PreparedCall::Mode mode = steps_->calls[i].mode;
    remote = mode == PreparedCall::Mode::kRemoteCall || mode == PreparedCall::Mode::kRemoteGroup ||
             mode == PreparedCall::Mode::kRemoteStep;
    where << "while running " << (mode == PreparedCall::Mode::kRemoteGroup ? "the offloaded group starting at " : "")
          << graph_.describe_node(nid) << " on device " << node_device_[nid] << " ("
          << DeviceName(devices_[node_device_[nid]]) << "): ";
  } else {
    remote = std::any_of(devices_to_sync_.begin(), devices_to_sync_.end(), IsRemote);
    where << "while synchronising devices: ";
  }
  std::string message = err.message();
  // Errors raised in the remote process come back as RPCError; any other error of a remote step
  // comes from the transport itself.
  if (remote && err.kind() != "RPCError") {
    message = "the connection to the remote device was lost (server gone or connection closed): " + message;
  }
  return ffi::Error(err.kind(), where.str() + message, err.backtrace());
}

void GraphRuntime::Run() {
  ExclusiveUse use(this, "run");
  if (num_inputs_unset_ != 0) ThrowUnsetInputs();
  RunOnce();
}

void GraphRuntime::RunOnce() {
  remote_compute_calls_ = 0;
  remote_copies_ = 0;
  if (concurrency_->executors.started()) {
    concurrency_->executors.Run();  // step errors already name their node and device
  } else {
    RunSerial();
  }
  try {
    for (const DLDevice& dev : devices_to_sync_) support::SyncDevice(dev);
  } catch (const ffi::Error& err) {
    throw ErrorAt(static_cast<uint32_t>(steps_->op_execs.size()), err);
  }
}

void GraphRuntime::RunSerial() {
  ffi::Any rv;     // kernels return nothing; one slot serves every call
  uint32_t i = 0;  // the step in flight, named in the error if it fails
  const Concurrency& c = *concurrency_;
  try {
    // Groups partition the steps in order, so one flat loop runs them group by group; a remote
    // group's segment is a single kRemoteGroup step (see SetupPreparedCalls).
    const PreparedCall* calls = steps_->calls.data();
    const uint32_t num_steps = static_cast<uint32_t>(steps_->calls.size());
    if (c.tracing) {
      for (i = 0; i < num_steps; ++i) RunStepOnExecutor(this, i);
      return;
    }
    for (i = 0; i < num_steps; ++i) {
      const PreparedCall& call = calls[i];
      if (call.mode == PreparedCall::Mode::kCall) {
        call.function->CallPacked(call.args, call.num_args, &rv);
      } else {
        RunOtherStep(i, &rv);
      }
    }
  } catch (const ffi::Error& err) {
    if (c.tracing) throw;  // RunStepOnExecutor named the step already
    throw ErrorAt(i, err);
  }
}

std::string GraphRuntime::TraceJSON(int runs) {
  namespace json = ffi::json;
  using Clock = std::chrono::steady_clock;
  ExclusiveUse use(this, "trace");
  if (num_inputs_unset_ != 0) ThrowUnsetInputs();
  Concurrency& c = *concurrency_;
  c.span_start_us.assign(steps_->op_execs.size(), -1.0);
  c.span_end_us.assign(steps_->op_execs.size(), -1.0);
  json::Array all_runs;
  c.tracing = true;
  try {
    for (int r = 0; r < std::max(runs, 1); ++r) {
      std::fill(c.span_start_us.begin(), c.span_start_us.end(), -1.0);
      c.run_start = Clock::now();
      RunOnce();
      json::Array spans;
      for (uint32_t i = 0; i < steps_->op_execs.size(); ++i) {
        if (c.span_start_us[i] < 0) continue;  // folded into an offloaded segment's call
        const OpExec& step = steps_->op_execs[i];
        const char* kind = step.kind == OpExec::Kind::kKernel ? "kernel" : step.kind == OpExec::Kind::kCopy ? "copy" : "nop";
        if (steps_->calls[i].mode == PreparedCall::Mode::kRemoteGroup) kind = "group";
        spans.push_back(json::Object{{ffi::String("step"), int64_t(i)},
                                     {ffi::String("node"), int64_t(step.node_id)},
                                     {ffi::String("name"), ffi::String(graph_.nodes[step.node_id].name)},
                                     {ffi::String("kind"), ffi::String(kind)},
                                     {ffi::String("device"), int64_t(c.access[i].device)},
                                     {ffi::String("start_us"), c.span_start_us[i]},
                                     {ffi::String("end_us"), c.span_end_us[i]}});
      }
      all_runs.push_back(spans);
    }
  } catch (...) {
    c.tracing = false;
    throw;
  }
  c.tracing = false;
  json::Array names;
  for (const DLDevice& dev : devices_) names.push_back(ffi::String(DeviceName(dev)));
  return std::string(json::Stringify(json::Object{{ffi::String("devices"), names}, {ffi::String("runs"), all_runs}}));
}

void GraphRuntime::ThrowUnsetInputs() const {
  std::ostringstream names;
  int listed = 0;
  for (size_t i = 0; i < input_set_.size(); ++i) {
    if (input_set_[i]) continue;
    names << (listed++ ? ", " : "") << "'" << graph_.nodes[input_nodes_[i]].name << "'";
  }
  TVM_FFI_THROW(ValueError) << "run: " << num_inputs_unset_ << " input(s) never set: " << names.str()
                            << " (set them with set_input, or load the parameters, before run)";
}

void GraphRuntime::RunOtherStep(uint32_t index, ffi::Any* rv) {
  const PreparedCall& call = steps_->calls[index];
  switch (call.mode) {
    case PreparedCall::Mode::kCall:
    case PreparedCall::Mode::kRemoteCall:
      remote_compute_calls_ += call.mode != PreparedCall::Mode::kCall;
      call.function->CallPacked(call.args, call.num_args, rv);
      break;
    case PreparedCall::Mode::kRemoteGroup:
      ++remote_compute_calls_;
      call.function->CallPacked(call.args, call.num_args, rv);
      ReceiveSegmentOutputs(steps_->segments[steps_->segment_at[index]], *rv);
      *rv = nullptr;  // kernels that reuse the slot expect it empty, not holding the bytes object
      break;
    case PreparedCall::Mode::kRemoteStep:
      ++remote_copies_;
      RunStep(steps_->op_execs[index], rv);
      break;
    case PreparedCall::Mode::kStep:
      RunStep(steps_->op_execs[index], rv);
      break;
    case PreparedCall::Mode::kSkip:
      break;
  }
}

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

void GraphRuntime::CheckCompatible(uint32_t eid, const DLTensor* value, const std::string& what) const {
  support::CheckTensor(value, graph_.shapes[eid], graph_.dtypes[eid], what);
}

void GraphRuntime::CheckInputValue(int index, const DLTensor* value, const std::string& what) const {
  CheckedInputIndex(index, "input");
  CheckCompatible(graph_.entry_id(input_nodes_[index], 0), value, what);
}

void GraphRuntime::WriteInput(int index, const DLTensor* value, const std::string& what) {
  CheckInputValue(index, value, what);
  uint32_t eid = graph_.entry_id(input_nodes_[index], 0);
  DLTensor* dst = Mutable(data_entry_[eid]);
  support::CopyOnce(value, dst);
  MarkInputSet(index);
}

void GraphRuntime::MarkInputSet(int index) {
  CheckedInputIndex(index, "input");
  if (!input_set_[index]) {
    input_set_[index] = 1;
    --num_inputs_unset_;
  }
}

void GraphRuntime::SetInput(int index, const DLTensor* value) {
  ExclusiveUse use(this, "set_input");
  CheckedInputIndex(index, "input");
  WriteInput(index, value, "input '" + GetInputName(index) + "'");
  // A parameter written through set_input must not leave weights derived from its old value.
  if (input_is_param_[index]) InvalidateCaches();
}

ffi::Tensor GraphRuntime::GetInput(int index) const {
  CheckedInputIndex(index, "input");
  return data_entry_[graph_.entry_id(input_nodes_[index], 0)];
}

ffi::Tensor GraphRuntime::GetOutput(int index) const {
  CheckedInputIndex(index, "output");
  return output_views_[index];
}

void GraphRuntime::CopyOutputTo(int index, DLTensor* out) const {
  ExclusiveUse use(this, "get_output");
  CheckedInputIndex(index, "output");
  uint32_t eid = graph_.entry_id(graph_.heads[index]);
  CheckCompatible(eid, out, "output " + std::to_string(index) + " destination");
  const DLTensor* src = data_entry_[eid].GetDLTensorPtr();
  support::CopyOnce(src, out);

}

void GraphRuntime::BindParams(const std::vector<std::pair<int, const DLTensor*>>& params) {
  for (const auto& [index, value] : params) {
    WriteInput(index, value, "parameter '" + GetInputName(index) + "'");
    input_is_param_[index] = 1;
  }
  InvalidateCaches();
}

void GraphRuntime::SetParam(int index, const DLTensor* value) {
  ExclusiveUse use(this, "set_params");
  CheckInputValue(index, value, "parameter '" + GetInputName(index) + "'");
  BindParams({{index, value}});
}

void GraphRuntime::SetParams(const ffi::Map<ffi::String, ffi::Tensor>& params) {
  ExclusiveUse use(this, "set_params");
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
  ExclusiveUse use(this, "load_params");
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
  ExclusiveUse use(this, "share_params");
  std::vector<std::pair<uint32_t, ffi::Tensor>> shares;  // (entry, the other runtime's tensor)
  std::vector<int> indices;
  for (const NamedParam& p : ReadParamBlob(param_bytes, "share_params")) {
    const std::string& name = p.name;
    int index = GetInputIndex(name);
    int other_index = other.GetInputIndex(name);
    if (index < 0 || other_index < 0) {
      TVM_FFI_THROW(KeyError) << "share_params: parameter '" << name << "' is not an input of both graphs";
    }
    uint32_t eid = graph_.entry_id(input_nodes_[index], 0);
    const ffi::Tensor& shared = other.GetInput(other_index);
    CheckCompatible(eid, shared.GetDLTensorPtr(), "share_params '" + name + "'");
    DLDevice have = shared.device(), need = data_entry_[eid].device();
    if (!SameDevice(have, need)) {
      TVM_FFI_THROW(ValueError) << "share_params '" << name << "': the other runtime holds it on "
                                << DeviceName(have) << ", this one needs it on " << DeviceName(need);
    }
    if (!other.input_set_[other_index]) {
      TVM_FFI_THROW(ValueError) << "share_params '" << name << "': the other runtime never set it";
    }
    shares.emplace_back(eid, shared);
    indices.push_back(index);
  }
  for (const auto& [eid, shared] : shares) data_entry_[eid] = shared;
  for (int index : indices) {
    MarkInputSet(index);
    input_is_param_[index] = 1;
  }
  SetupOpExecs();  // re-pack argument pointers to the shared tensors
  SetupPreparedCalls();
  InvalidateCaches();
}

std::string GraphRuntime::StatsJSON() const {
  namespace json = ffi::json;
  int copies = 0;
  // Graph executions of devices driven through a vendor runtime (a QNN HTP): one per kernel step there.
  int64_t vendor_graphs = 0;
  for (const OpExec& step : steps_->op_execs) {
    copies += step.kind == OpExec::Kind::kCopy;
    vendor_graphs += step.kind == OpExec::Kind::kKernel &&
                     !support::TraitsOf(devices_[node_device_[step.node_id]]).runs_tvm_kernels;
  }
  int64_t carried = 0;  // copies travelling inside a remote group's call
  for (const OffloadSegment& segment : steps_->segments) {
    if (segment.runner.has_value()) carried += static_cast<int64_t>(segment.inputs.size() + segment.outputs.size());
  }
  json::Array storage_bytes, device_names, group_devices;
  for (size_t bytes : storage_plan_.BytesPerDevice(devices_.size())) storage_bytes.push_back(int64_t(bytes));
  for (const DLDevice& dev : devices_) device_names.push_back(ffi::String(DeviceName(dev)));
  for (const ExecGroup& g : groups_) group_devices.push_back(int64_t(g.device));
  json::Object stats{
      {ffi::String("num_nodes"), int64_t(graph_.nodes.size())},
      {ffi::String("num_ops"), int64_t(steps_->op_execs.size())},
      {ffi::String("num_groups"), int64_t(groups_.size())},
      {ffi::String("num_copies"), int64_t(copies)},
      {ffi::String("device_switches"), int64_t(groups_.empty() ? 0 : groups_.size() - 1)},
      {ffi::String("storage_bytes"), storage_bytes},
      {ffi::String("num_storage_slots"), int64_t(pool_.size())},
      {ffi::String("devices"), device_names},
      {ffi::String("group_devices"), group_devices},
      {ffi::String("offload_segments"), int64_t(steps_->segments.size())},
      {ffi::String("remote_compute_calls"), remote_compute_calls_.load()},
      {ffi::String("remote_copies"), remote_copies_.load()},
      {ffi::String("cross_process_calls"), remote_compute_calls_.load() + remote_copies_.load()},
      {ffi::String("round_trips"), remote_compute_calls_.load() + remote_copies_.load()},
      {ffi::String("copies_in_remote_calls"), carried},
      {ffi::String("execution"), ffi::String(execution_ == ExecutionMode::kConcurrent ? "concurrent" : "serial")},
      {ffi::String("shared_edges"), int64_t(shared_views_.size())},
      {ffi::String("implicit_copies"), int64_t(implicit_copies_.size())},
      {ffi::String("bytes_copied"), bytes_copied_per_run_},
      {ffi::String("cross_device_waits"), int64_t(concurrency_->num_waits)},
      {ffi::String("qnn_graph_executions"), vendor_graphs},
  };
  return std::string(json::Stringify(stats));
}

std::string GraphRuntime::ProfileJSON(int repeat) {
  namespace json = ffi::json;
  using Clock = std::chrono::steady_clock;
  ExclusiveUse use(this, "profile");
  if (num_inputs_unset_ != 0) ThrowUnsetInputs();
  repeat = std::max(repeat, 1);
  std::vector<double> node_us(steps_->op_execs.size(), 0.0);
  for (int r = 0; r < repeat; ++r) {
    for (size_t i = 0; i < steps_->op_execs.size(); ++i) {
      DLDevice dev = devices_[node_device_[steps_->op_execs[i].node_id]];
      auto start = Clock::now();
      ffi::Any rv;
      RunStep(steps_->op_execs[i], &rv);
      support::WaitForCompletion(dev);  // the device's work, not its launch
      node_us[i] += std::chrono::duration<double, std::micro>(Clock::now() - start).count() / repeat;
    }
  }
  json::Array nodes, groups;
  for (size_t i = 0; i < steps_->op_execs.size(); ++i) {
    uint32_t nid = steps_->op_execs[i].node_id;
    nodes.push_back(json::Object{{ffi::String("node_id"), int64_t(nid)},
                                 {ffi::String("name"), ffi::String(graph_.nodes[nid].name)},
                                 {ffi::String("func_name"), ffi::String(graph_.nodes[nid].func_name)},
                                 {ffi::String("device"), int64_t(node_device_[nid])},
                                 {ffi::String("time_us"), node_us[i]}});
  }
  for (const ExecGroup& g : groups_) {
    double total = 0;
    for (uint32_t i = g.begin; i < g.end; ++i) total += node_us[i];
    groups.push_back(json::Object{{ffi::String("device"), int64_t(g.device)},
                                  {ffi::String("num_nodes"), int64_t(g.end - g.begin)},
                                  {ffi::String("time_us"), total}});
  }
  return std::string(json::Stringify(json::Object{{ffi::String("nodes"), nodes}, {ffi::String("groups"), groups}}));
}

}  // namespace tvm_hetero
