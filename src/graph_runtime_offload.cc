/*!
 * \file graph_runtime_offload.cc
 * \brief Offload behind the remote-device seam: the runtime's remote steps are cut into segments per
 *        device (SetupOffloadSegments), described as a plan for the remote runner (OffloadPlanJSON,
 *        src/offload_runner.cc builds it in the remote process), and, once a runner is attached,
 *        each segment runs as one remote call (a kRemoteGroup step) that carries its data both ways.
 *
 * Segments and the transfers they carry. A segment is a run of consecutive steps of one group on a
 * remote device D, each a kernel on D or a copy host -> D; copies D -> host after it may join it as
 * outputs. The call applies the inputs (in step order), runs the kernels (in step order), then reads
 * the outputs, all at the position of the segment's first step. That moves an input copy from step c
 * back to the segment's start b, and an output copy from step c forward to the segment's end e.
 *
 * Guarantee: the moves never change a result. An input copy joins only if no step in [b, c) touches
 * the bytes it writes (the steps there are D's kernels and earlier inputs; none can write its host
 * source); an output copy joins only if no step in [e, c) writes its source or touches the bytes it
 * writes. Every other step keeps its serial position, so the serial program with the moved copies
 * computes what the original does, and the concurrent schedule, derived from the moved accesses
 * (graph_runtime.cc, SetupExecution), stays bit-identical to it. Copies that would need a host
 * staging buffer (remote to remote) stay separate round trips.
 */
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/graph_runtime.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "concurrency/step_schedule.h"
#include "graph_runtime_steps.h"
#include "support/device.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;

namespace {

bool Overlaps(const MemoryRegion& a, const MemoryRegion& b) {
  return a.slot == b.slot && a.begin < b.end && b.begin < a.end;
}

bool AnyOverlaps(const std::vector<MemoryRegion>& regions, const MemoryRegion& r) {
  return std::any_of(regions.begin(), regions.end(), [&](const MemoryRegion& x) { return Overlaps(x, r); });
}

/*! \brief Whether step `s` reads or writes bytes of `r`. */
bool Touches(const StepAccess& s, const MemoryRegion& r) { return AnyOverlaps(s.reads, r) || AnyOverlaps(s.writes, r); }

enum class Transfer { kNone, kIn, kOut };

/*! \brief Whether `step` is a copy between the host and `device` that a segment call can carry. */
Transfer TransferOf(const OpExec& step, DLDevice device) {
  if (step.kind != OpExec::Kind::kCopy || step.staging.defined()) return Transfer::kNone;
  if (support::IsHost(step.copy_from->device) && support::SameDevice(step.copy_to->device, device)) return Transfer::kIn;
  if (support::SameDevice(step.copy_from->device, device) && support::IsHost(step.copy_to->device)) return Transfer::kOut;
  return Transfer::kNone;
}

}  // namespace

void GraphRuntime::SetupOffloadSegments() {
  steps_->segments.clear();
  const std::vector<OpExec>& steps = steps_->op_execs;
  const std::vector<StepAccess>& access = StepAccesses();
  std::vector<int64_t> per_device(devices_.size(), 0);
  std::vector<uint8_t> joined(steps.size(), 0);  // a step a segment call carries
  // Inputs and kernels: runs of one group (see the file comment for when an input may join).
  for (const ExecGroup& group : groups_) {
    const DLDevice device = devices_[group.device];
    if (!support::IsRemote(device)) continue;
    OffloadSegment open;  // the segment being formed, while is_open
    bool is_open = false;
    auto close = [&]() {
      bool has_kernel = is_open && std::any_of(steps.begin() + open.begin, steps.begin() + open.end,
                                               [](const OpExec& s) { return s.kind == OpExec::Kind::kKernel; });
      if (has_kernel) {
        open.index = per_device[open.device]++;
        for (uint32_t i = open.begin; i < open.end; ++i) joined[i] = 1;
        steps_->segments.push_back(std::move(open));
      }
      open = OffloadSegment();
      is_open = false;
    };
    for (uint32_t i = group.begin; i < group.end; ++i) {
      const OpExec& step = steps[i];
      Transfer transfer = TransferOf(step, device);
      if (step.kind != OpExec::Kind::kKernel && transfer != Transfer::kIn) {
        close();
        continue;
      }
      if (is_open && transfer == Transfer::kIn) {
        const MemoryRegion& written = access[i].writes.front();
        bool clobbers = false;  // would writing it at the segment's start overwrite what an earlier step reads?
        for (uint32_t j = open.begin; j < i && !clobbers; ++j) clobbers = Touches(access[j], written);
        if (clobbers) close();
      }
      if (!is_open) {
        is_open = true;
        open.device = group.device;
        open.begin = i;
      }
      open.end = i + 1;
      if (transfer == Transfer::kIn) open.inputs.push_back(i);
    }
    close();
  }
  // Outputs: a copy from a remote device joins the latest segment of that device before it.
  for (uint32_t c = 0; c < steps.size(); ++c) {
    if (joined[c]) continue;
    for (auto segment = steps_->segments.rbegin(); segment != steps_->segments.rend(); ++segment) {
      if (segment->end > c) continue;
      if (TransferOf(steps[c], devices_[segment->device]) != Transfer::kOut) continue;
      const MemoryRegion& source = access[c].reads.front();
      const MemoryRegion& written = access[c].writes.front();
      bool moves = true;
      for (uint32_t j = segment->end; j < c && moves; ++j) {
        moves = !AnyOverlaps(access[j].writes, source) && !Touches(access[j], written);
      }
      if (moves) {
        segment->outputs.push_back(c);
        joined[c] = 1;
      }
      break;  // only the latest segment of the copy's device may carry it
    }
  }
}

void GraphRuntime::SetupSegmentCalls() {
  steps_->segment_at.assign(steps_->op_execs.size(), -1);
  for (size_t s = 0; s < steps_->segments.size(); ++s) {
    OffloadSegment& segment = steps_->segments[s];
    segment.input_bytes.clear();
    for (uint32_t i : segment.inputs) {
      const DLTensor* from = steps_->op_execs[i].copy_from;
      segment.input_bytes.push_back(TVMFFIByteArray{static_cast<const char*>(from->data) + from->byte_offset,
                                                    ffi::GetDataSize(*from)});
    }
    segment.call_args.clear();
    segment.call_args.emplace_back(segment.index);
    for (TVMFFIByteArray& bytes : segment.input_bytes) segment.call_args.emplace_back(&bytes);
    if (segment.runner.has_value()) steps_->segment_at[segment.begin] = static_cast<int32_t>(s);
  }
}

void GraphRuntime::ReceiveSegmentOutputs(const OffloadSegment& segment, const ffi::Any& returned) const {
  if (segment.outputs.empty()) return;
  std::optional<ffi::Bytes> bytes = returned.try_cast<ffi::Bytes>();
  size_t expected = 0;
  for (uint32_t i : segment.outputs) expected += ffi::GetDataSize(*steps_->op_execs[i].copy_to);
  if (!bytes.has_value() || bytes->size() != expected) {
    TVM_FFI_THROW(RuntimeError) << "the remote runner returned " << (bytes ? std::to_string(bytes->size()) : "no")
                                << " bytes for segment " << segment.index << " of device " << segment.device
                                << ", expected " << expected
                                << " (is the server's libtvm_hetero older than this one?)";
  }
  const char* data = bytes->data();
  for (uint32_t i : segment.outputs) {
    DLTensor* to = steps_->op_execs[i].copy_to;
    size_t n = ffi::GetDataSize(*to);
    std::memcpy(static_cast<char*>(to->data) + to->byte_offset, data, n);
    data += n;
  }
}

std::string GraphRuntime::OffloadPlanJSON(int device) const {
  namespace json = ffi::json;
  if (device < 0 || device >= static_cast<int>(devices_.size())) {
    TVM_FFI_THROW(IndexError) << "device " << device << " is out of range";
  }
  std::unordered_map<uint32_t, int64_t> position;  // entry id -> index into "entries"
  json::Array entries, segments, transfers;
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
      if (step.kind != OpExec::Kind::kKernel) continue;  // an input: sent with the call
      json::Array args;
      for (const ffi::AnyView& arg : step.args) args.push_back(entry_index(arg.cast<DLTensor*>()));
      ops.push_back(json::Object{{ffi::String("func_name"), ffi::String(graph_.nodes[step.node_id].func_name)},
                                 {ffi::String("node"), ffi::String(graph_.describe_node(step.node_id))},
                                 {ffi::String("args"), args}});
    }
    segments.push_back(ops);
    json::Array inputs, outputs;
    for (uint32_t i : segment.inputs) inputs.push_back(entry_index(steps_->op_execs[i].copy_to));
    for (uint32_t i : segment.outputs) outputs.push_back(entry_index(steps_->op_execs[i].copy_from));
    transfers.push_back(json::Object{{ffi::String("inputs"), inputs}, {ffi::String("outputs"), outputs}});
  }
  return std::string(json::Stringify(json::Object{{ffi::String("entries"), entries},
                                                  {ffi::String("segments"), segments},
                                                  {ffi::String("transfers"), transfers}}));
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
