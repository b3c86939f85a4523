/*!
 * \file plan/run_frame.cc
 * \brief A frame's memory and bindings: the pool (parameter-only slots taken from the default frame),
 *        one tensor per plan tensor id, the DLTensors every argument points at, the packed calls;
 *        SetInput copies, BindInput / BindOutput re-point DLTensors at the caller's memory.
 *
 * Why binding costs nothing per run: every packed argument points at the frame's DLTensor of its
 * tensor id, so binding changes that DLTensor's data pointer (and its shared views'), never the
 * packed calls. An input or output entry is live for the whole run (VerifyStoragePlan), so no other
 * entry shares its bytes and moving it elsewhere changes no other tensor.
 */
#include <tvm_hetero/run_frame.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "plan/execution_plan.h"
#include "plan/frame_executor.h"
#include "plan/prepared_call.h"
#include "plan/run_frame_use.h"
#include "support/device.h"
#include "support/tensor_check.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;
using support::Mutable;

namespace {

/*! \brief The alignment TVM's kernels assume of every tensor (its allocator's). */
constexpr uintptr_t kKernelAlignment = 64;

/*! \brief Output `index` is written by a step (not an input's or a __nop's entry). */
bool ComputedByAStep(const Graph& graph, int index) {
  const GraphNode& node = graph.nodes[graph.heads[index].node_id];
  return !node.is_input() && node.func_name != "__nop";
}

/*! \brief Another output naming output `index`'s tensor, or -1. */
int OtherOutputOfItsTensor(const Graph& graph, int index) {
  const uint32_t eid = graph.entry_id(graph.heads[index]);
  for (size_t k = 0; k < graph.heads.size(); ++k) {
    if (static_cast<int>(k) != index && graph.entry_id(graph.heads[k]) == eid) return static_cast<int>(k);
  }
  return -1;
}

/*! \brief Where a slot starts in a scratch: every slot on a 64-byte boundary (TVM's kernels assume it). */
constexpr size_t kScratchAlignment = 64;

size_t ScratchSpan(size_t nbytes) {
  return (std::max<size_t>(nbytes, 1) + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

/*!
 * \brief Per pool slot: it holds only values a Run computes (no graph input, which must keep its
 *        value from one Run to the next) on a device sharing memory with `device`, so frames that
 *        never run at once may give it the same memory. An output in such a slot is valid until any
 *        of those frames runs again (bound outputs are written where they are bound).
 */
std::vector<uint8_t> TransientSlots(const PlanInputs& model, DLDevice device) {
  const Graph& graph = *model.graph;
  const StoragePlan& storage = *model.storage;
  std::vector<uint8_t> transient(storage.slots.size(), 0);
  for (size_t s = 0; s < storage.slots.size(); ++s) {
    const DLDevice d = model.devices[storage.slots[s].device];
    transient[s] = support::SameDevice(d, device) || support::SharesMemory(d, device);
  }
  for (uint32_t node : graph.arg_nodes) transient[storage.entry_slot[graph.entry_id(node, 0)]] = 0;
  return transient;
}

}  // namespace

int64_t RunFrame::ScratchBytes(const PlanInputs& model, const ExecutionPlan& /*plan*/, DLDevice device) {
  const std::vector<uint8_t> transient = TransientSlots(model, device);
  size_t total = 0;
  for (size_t s = 0; s < transient.size(); ++s) {
    if (transient[s]) total += ScratchSpan(model.storage->slots[s].nbytes);
  }
  return static_cast<int64_t>(total);
}

RunFrame::RunFrame(const PlanInputs& model, std::shared_ptr<const ExecutionPlan> plan, const FrameSharing& sharing)
    : model_(model), plan_(std::move(plan)), prepared_(std::make_unique<PreparedSteps>()) {
  const size_t num_inputs = model_.graph->arg_nodes.size();
  input_set_.assign(num_inputs, 0);
  input_shared_.assign(num_inputs, 0);
  num_inputs_unset_ = static_cast<int>(num_inputs);
  bound_inputs_.resize(num_inputs);
  bound_outputs_.resize(model_.graph->heads.size());
  AllocateTensors(sharing);
  if (sharing.own_call_sites) {
    // A call site of its own per kernel: a library may keep per-call-site state (oneDNN regions).
    own_kernels_.resize(plan_->steps.size());
    for (size_t i = 0; i < plan_->steps.size(); ++i) {
      if (plan_->steps[i].kind == PlanStep::Kind::kKernel) own_kernels_[i] = FindKernel(model_, plan_->steps[i].node);
    }
  }
  PrepareCalls();
}

RunFrame::~RunFrame() {
  // The executor's threads run steps of this frame: stop them before any member goes away.
  executor_.reset();
}

int64_t RunFrame::allocated_bytes() const { return allocated_bytes_ + prepared_->staging_bytes; }

uint32_t RunFrame::InputEntry(int index) const { return model_.graph->entry_id(model_.graph->arg_nodes[index], 0); }

void RunFrame::UseExecutor(std::unique_ptr<FrameExecutor> executor) { executor_ = std::move(executor); }

void RunFrame::UsePlan(std::shared_ptr<const ExecutionPlan> plan) {
  executor_.reset();  // it runs the old plan's calls
  plan_ = std::move(plan);
  PrepareCalls();
}

void RunFrame::AllocateTensors(const FrameSharing& sharing) {
  const Graph& graph = *model_.graph;
  const StoragePlan& storage = *model_.storage;
  const std::vector<DLDevice>& devices = model_.devices;
  // Inputs shared with `sharing.from`: their entries come from there, and a slot holding nothing
  // else is not allocated (weights once, whatever the number of frames).
  std::vector<uint8_t> shared_entry(plan_->num_entries, 0);
  const RunFrame* shared = sharing.from;
  if (shared != nullptr) {
    if (sharing.wait_for_inputs) params_from_ = shared;
    for (size_t i = 0; i < sharing.inputs.size(); ++i) {
      if (!sharing.inputs[i]) continue;
      shared_entry[InputEntry(static_cast<int>(i))] = 1;
      input_shared_[i] = 1;
      input_set_[i] = 1;
      --num_inputs_unset_;
    }
  }
  std::vector<uint8_t> slot_needed(storage.slots.size(), 0);
  for (uint32_t eid = 0; eid < plan_->num_entries; ++eid) {
    if (!shared_entry[eid]) slot_needed[storage.entry_slot[eid]] = 1;
  }
  pool_.assign(storage.slots.size(), ffi::Tensor());
  if (sharing.scratch.defined()) {
    // The transient slots are carved from the scratch, one after another.
    const ffi::Tensor& scratch = sharing.scratch;
    const int64_t needed = ScratchBytes(model_, *plan_, scratch.device());
    const int64_t given = static_cast<int64_t>(ffi::GetDataSize(*scratch.GetDLTensorPtr()));
    if (given < needed || reinterpret_cast<uintptr_t>(scratch.data_ptr()) % kScratchAlignment != 0) {
      TVM_FFI_THROW(ValueError) << "frame: the scratch (" << given << " bytes on " << support::DeviceName(scratch.device())
                                << ") must hold " << needed << " bytes, " << kScratchAlignment
                                << "-byte aligned: the graph's intermediate values (scratch_bytes)";
    }
    const std::vector<uint8_t> transient = TransientSlots(model_, scratch.device());
    size_t offset = 0;
    for (size_t s = 0; s < storage.slots.size(); ++s) {
      if (!transient[s] || !slot_needed[s]) continue;
      const size_t nbytes = std::max<size_t>(storage.slots[s].nbytes, 1);
      pool_[s] = support::ViewOf(scratch, offset, ffi::Shape({static_cast<int64_t>(nbytes)}), DLDataType{kDLUInt, 8, 1},
                                 devices[storage.slots[s].device]);
      offset += ScratchSpan(nbytes);
    }
  }
  for (size_t s = 0; s < storage.slots.size(); ++s) {
    if (!slot_needed[s] || pool_[s].defined()) continue;
    int64_t nbytes = static_cast<int64_t>(std::max<size_t>(storage.slots[s].nbytes, 1));
    pool_[s] = support::AllocTensor(ffi::Shape({nbytes}), DLDataType{kDLUInt, 8, 1}, devices[storage.slots[s].device]);
    allocated_bytes_ += nbytes;
  }
  tensors_.clear();
  for (const PlanTensor& t : plan_->tensors) {
    const uint32_t eid = t.entry;
    ffi::Shape shape(graph.shapes[eid]);
    switch (t.source) {
      case PlanTensor::Source::kEntry:
        if (shared_entry[eid]) {
          tensors_.push_back(shared->tensors_[eid]);
        } else {
          const ffi::Tensor& base = pool_[storage.entry_slot[eid]];
          tensors_.push_back(support::ViewOf(base, storage.entry_offset[eid], shape, graph.dtypes[eid], base.device()));
        }
        break;
      case PlanTensor::Source::kSharedView:
        // Same bytes, the reader's device: the edge costs a wait, not a copy.
        tensors_.push_back(support::ViewOf(tensors_[eid], 0, shape, graph.dtypes[eid], devices[t.device]));
        break;
      case PlanTensor::Source::kCopyBuffer:
        tensors_.push_back(support::AllocTensor(shape, graph.dtypes[eid], devices[t.device]));
        allocated_bytes_ += static_cast<int64_t>(EntryBytes(graph.shapes[eid], graph.dtypes[eid]));
        break;
    }
  }
  dl_.clear();
  for (const ffi::Tensor& t : tensors_) dl_.push_back(*t.GetDLTensorPtr());
  // Outputs are read on the primary device; one made on a device sharing its memory is shown there.
  output_views_.clear();
  output_input_.clear();
  for (const EntryRef& head : graph.heads) {
    const ffi::Tensor& entry = tensors_[graph.entry_id(head)];
    bool view = !support::SameDevice(entry.device(), devices[0]) && support::SharesMemory(entry.device(), devices[0]);
    output_views_.push_back(view ? support::ViewOf(entry, 0, entry.shape(), entry.dtype(), devices[0]) : entry);
    auto input = std::find(graph.arg_nodes.begin(), graph.arg_nodes.end(), head.node_id);
    output_input_.push_back(input == graph.arg_nodes.end() ? -1 : static_cast<int>(input - graph.arg_nodes.begin()));
  }
}

void RunFrame::PrepareCalls() {
  const ExecutionPlan& plan = *plan_;
  size_t num_args = 0;
  for (const PlanStep& step : plan.steps) num_args += step.kind == PlanStep::Kind::kKernel ? step.args.size() : 0;
  PreparedSteps& prepared = *prepared_;
  prepared.args.clear();
  prepared.args.reserve(num_args);  // calls point into args: it must not move once filled
  prepared.staging.assign(plan.steps.size(), ffi::Tensor());
  prepared.staging_bytes = 0;
  prepared.calls.assign(plan.steps.size(), PreparedCall());
  prepared.groups.clear();
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const PlanStep& step = plan.steps[i];
    PreparedCall& call = prepared.calls[i];
    switch (step.kind) {
      case PlanStep::Kind::kKernel:
        call.mode = step.remote ? PreparedCall::Mode::kRemoteCall : PreparedCall::Mode::kCall;
        call.function = static_cast<const ffi::FunctionObj*>(own_kernels_.empty() ? step.function.get()
                                                                                  : own_kernels_[i].get());
        call.args = prepared.args.data() + prepared.args.size();
        call.num_args = static_cast<int32_t>(step.args.size());
        for (uint32_t t : step.args) prepared.args.emplace_back(&dl_[t]);
        break;
      case PlanStep::Kind::kCopy:
        call.mode = step.remote ? PreparedCall::Mode::kRemoteCopy : PreparedCall::Mode::kCopy;
        call.from = &dl_[step.args[0]];
        call.to = &dl_[step.args[1]];
        if (step.staged) {
          prepared.staging[i] = support::StagingBuffer(call.from->device, call.to->device,
                                                       ffi::ShapeView(call.to->shape, call.to->ndim), call.to->dtype);
          prepared.staging_bytes += static_cast<int64_t>(ffi::GetDataSize(*call.to));
          call.staging = Mutable(prepared.staging[i]);
        }
        break;
      case PlanStep::Kind::kNop:
        call.mode = PreparedCall::Mode::kNop;
        break;
      case PlanStep::Kind::kOffloadGroup: {
        const OffloadSegment& segment = plan.segments[step.segment];
        GroupCall group;
        group.device = segment.device;
        group.index = segment.index;
        for (uint32_t k = 0; k < segment.sub_steps.size(); ++k) {
          const PlanStep& sub = segment.sub_steps[k];
          if (sub.kind != PlanStep::Kind::kCopy) continue;
          if (k < segment.num_body_steps) {
            const DLTensor& from = dl_[sub.args[0]];
            group.input_bytes.push_back(
                TVMFFIByteArray{static_cast<const char*>(from.data) + from.byte_offset, ffi::GetDataSize(from)});
          } else {
            group.outputs.push_back(&dl_[sub.args[1]]);
          }
        }
        group.call_args.emplace_back(group.index);
        for (TVMFFIByteArray& bytes : group.input_bytes) group.call_args.emplace_back(&bytes);
        call.mode = PreparedCall::Mode::kRemoteGroup;
        call.function = static_cast<const ffi::FunctionObj*>(step.function.get());
        call.num_args = static_cast<int32_t>(prepared.groups.size());
        prepared.groups.push_back(std::move(group));
        break;
      }
    }
  }
  // groups is complete: point each group step at its packed call (stable from now on).
  for (PreparedCall& call : prepared.calls) {
    if (call.mode == PreparedCall::Mode::kRemoteGroup) call.args = prepared.groups[call.num_args].call_args.data();
  }
}

int RunFrame::CheckedIndex(int index, bool output) const {
  const Graph& graph = *model_.graph;
  int limit = static_cast<int>(output ? graph.heads.size() : graph.arg_nodes.size());
  const char* what = output ? "output" : "input";
  if (index < 0 || index >= limit) {
    TVM_FFI_THROW(IndexError) << what << " index " << index << " is out of range: the graph has " << limit << " "
                              << what << "(s)";
  }
  return index;
}

void RunFrame::MarkInputSet(int index) {
  CheckedIndex(index, false);
  if (!input_set_[index]) {
    input_set_[index] = 1;
    --num_inputs_unset_;
  }
}

void RunFrame::Repoint(uint32_t entry, const DLTensor* value) {
  auto point = [&](uint32_t t) {
    if (value == nullptr) {
      dl_[t].data = tensors_[t].GetDLTensorPtr()->data;
      dl_[t].byte_offset = tensors_[t].GetDLTensorPtr()->byte_offset;
    } else {
      // Kernels reject a nonzero byte_offset: fold it into the pointer (CheckBindable allowed it).
      dl_[t].data = static_cast<char*>(value->data) + value->byte_offset;
      dl_[t].byte_offset = 0;
    }
  };
  for (uint32_t t = 0; t < plan_->tensors.size(); ++t) {
    const PlanTensor& pt = plan_->tensors[t];
    if (pt.entry == entry && pt.source != PlanTensor::Source::kCopyBuffer) point(t);
  }
  // Remote groups send input bytes from pointers taken at preparation: refresh them.
  if (!prepared_->groups.empty()) PrepareCalls();
}

void RunFrame::CheckBindable(uint32_t eid, const DLTensor* value, const std::string& what) const {
  const Graph& graph = *model_.graph;
  support::CheckTensor(value, graph.shapes[eid], graph.dtypes[eid], what);
  const DLDevice want = tensors_[eid].device();
  if (!support::ReadableInPlace(value->device, want)) {
    TVM_FFI_THROW(ValueError) << what << ": bound without a copy, it must be on " << support::DeviceName(want)
                              << ", got a tensor on " << support::DeviceName(value->device)
                              << " (pass copy=True to copy it there)";
  }
  if (value->byte_offset != 0 && !support::OffsetsUsable(want)) {
    TVM_FFI_THROW(ValueError) << what << ": a tensor with a byte offset cannot be bound on "
                              << support::DeviceName(want);
  }
  uintptr_t address = reinterpret_cast<uintptr_t>(value->data) + value->byte_offset;
  if (address % kKernelAlignment != 0) {
    TVM_FFI_THROW(ValueError) << what << ": bound without a copy, its data must be " << kKernelAlignment
                              << "-byte aligned (kernels assume it); address " << reinterpret_cast<void*>(address)
                              << " is not (allocate it with tvm.runtime.empty, or pass copy=True)";
  }
}

std::string RunFrame::OwnInputName(int index) const {
  CheckedIndex(index, false);
  const std::string what = "input '" + model_.graph->nodes[model_.graph->arg_nodes[index]].name + "'";
  if (input_shared_[index]) {
    TVM_FFI_THROW(ValueError) << what << " is a parameter shared by every frame of the runtime; set it on the "
                              << "runtime (set_params), not on one frame";
  }
  return what;
}

void RunFrame::SetInput(int index, const DLTensor* value) {
  ExclusiveUse use(this, "set_input");
  WriteInput(index, value, OwnInputName(index));
}

void RunFrame::WriteInput(int index, const DLTensor* value, const std::string& what) {
  const uint32_t eid = InputEntry(index);
  support::CheckTensor(value, model_.graph->shapes[eid], model_.graph->dtypes[eid], what);
  if (bound_inputs_[index].defined()) {
    Repoint(eid, nullptr);
    bound_inputs_[index] = ffi::Tensor();
  }
  support::CopyOnce(value, Mutable(tensors_[eid]));
  io_bytes_copied_ += static_cast<int64_t>(ffi::GetDataSize(*value));
  MarkInputSet(index);
}

void RunFrame::ShareInput(int index, ffi::Tensor memory) {
  const uint32_t eid = InputEntry(CheckedIndex(index, false));
  tensors_[eid] = memory;
  dl_[eid] = *memory.GetDLTensorPtr();
  // Shared views of the input read the other runtime's bytes too.
  for (uint32_t t = plan_->num_entries; t < plan_->tensors.size(); ++t) {
    const PlanTensor& pt = plan_->tensors[t];
    if (pt.entry != eid || pt.source != PlanTensor::Source::kSharedView) continue;
    tensors_[t] = support::ViewOf(memory, 0, memory.shape(), memory.dtype(), model_.devices[pt.device]);
    dl_[t] = *tensors_[t].GetDLTensorPtr();
  }
  MarkInputSet(index);
  // Remote groups send input bytes from pointers taken at preparation: refresh them.
  if (!prepared_->groups.empty()) PrepareCalls();
}

void RunFrame::BindInput(int index, ffi::Tensor value) {
  ExclusiveUse use(this, "set_input");
  const std::string what = OwnInputName(index);
  const uint32_t eid = InputEntry(index);
  CheckBindable(eid, value.GetDLTensorPtr(), what);
  Repoint(eid, value.GetDLTensorPtr());
  bound_inputs_[index] = std::move(value);
  MarkInputSet(index);
}

void RunFrame::BindOutput(int index, ffi::Tensor out) {
  ExclusiveUse use(this, "bind_output");
  CheckedIndex(index, true);
  const Graph& graph = *model_.graph;
  const EntryRef& head = graph.heads[index];
  const std::string what = "output " + std::to_string(index) + " (" + graph.describe_node(head.node_id) + ")";
  if (!ComputedByAStep(graph, index)) {
    TVM_FFI_THROW(ValueError) << what << " is not computed by a step (an input or a __nop's): it cannot be bound";
  }
  if (int other = OtherOutputOfItsTensor(graph, index); other >= 0) {
    TVM_FFI_THROW(ValueError) << what << " is also output " << other << ": one tensor cannot be bound to two";
  }
  const uint32_t eid = graph.entry_id(head);
  CheckBindable(eid, out.GetDLTensorPtr(), what + " destination");
  Repoint(eid, out.GetDLTensorPtr());
  bound_outputs_[index] = std::move(out);
}

bool RunFrame::OutputBindable(int index) const {
  CheckedIndex(index, true);
  return ComputedByAStep(*model_.graph, index) && OtherOutputOfItsTensor(*model_.graph, index) < 0;
}

ffi::Tensor RunFrame::GetInput(int index) const {
  CheckedIndex(index, false);
  if (bound_inputs_[index].defined()) return bound_inputs_[index];
  return tensors_[InputEntry(index)];
}

ffi::Tensor RunFrame::GetOutput(int index) const {
  CheckedIndex(index, true);
  if (bound_outputs_[index].defined()) return bound_outputs_[index];
  // An input passed through as an output reads where the input does (the caller's memory once bound).
  const int input = output_input_[index];
  if (input >= 0 && bound_inputs_[input].defined()) return bound_inputs_[input];
  return output_views_[index];
}

void RunFrame::CopyOutputTo(int index, DLTensor* out) {
  ExclusiveUse use(this, "get_output");
  CheckedIndex(index, true);
  const uint32_t eid = model_.graph->entry_id(model_.graph->heads[index]);
  support::CheckTensor(out, model_.graph->shapes[eid], model_.graph->dtypes[eid],
                       "output " + std::to_string(index) + " destination");
  support::CopyOnce(&dl_[eid], out);
  io_bytes_copied_ += static_cast<int64_t>(ffi::GetDataSize(*out));
}

void RunFrame::ThrowUnsetInputs() const {
  std::ostringstream names;
  int listed = 0;
  for (size_t i = 0; i < input_set_.size(); ++i) {
    if (input_set_[i]) continue;
    names << (listed++ ? ", " : "") << "'" << model_.graph->nodes[model_.graph->arg_nodes[i]].name << "'";
  }
  TVM_FFI_THROW(ValueError) << "run: " << num_inputs_unset_ << " input(s) never set: " << names.str()
                            << " (set inputs with set_input; parameters with set_params or load_params, or pass them to "
                               "create: graph_runtime.create(graph_json, lib, devices, params=artifact.params))";
}

void RunFrame::CheckInputsSet() const {
  if (num_inputs_unset_ != 0) ThrowUnsetInputs();
  if (params_from_ != nullptr && params_from_->num_inputs_unset_ != 0) params_from_->ThrowUnsetInputs();
}

void RunFrame::Run() {
  ExclusiveUse use(this, "run");
  CheckInputsSet();
  if (executor_ == nullptr) TVM_FFI_THROW(InternalError) << "run: the frame was given no executor";
  executor_->Run();
}

}  // namespace tvm_hetero
