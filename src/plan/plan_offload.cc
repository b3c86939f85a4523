/*!
 * \file plan/plan_offload.cc
 * \brief Offload grouping as plan -> plan passes: FormOffloadSegments finds the runs of steps on a
 *        remote device that one call can execute, and the copies that call may carry;
 *        AttachOffloadRunner replaces each segment of a device by one group step.
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
 * computes what the original does, and the concurrent schedule, derived from the group step's
 * accesses (the union of its sub-steps'), stays bit-identical to it. Copies that would need a host
 * staging buffer (remote to remote) stay separate round trips.
 */
#include <algorithm>

#include "plan/execution_plan.h"
#include "support/device.h"

namespace tvm_hetero {

namespace {

bool Overlaps(const MemoryRegion& a, const MemoryRegion& b) {
  return a.slot == b.slot && a.begin < b.end && b.begin < a.end;
}

bool AnyOverlaps(const std::vector<MemoryRegion>& regions, const MemoryRegion& r) {
  return std::any_of(regions.begin(), regions.end(), [&](const MemoryRegion& x) { return Overlaps(x, r); });
}

/*! \brief Whether step `s` reads or writes bytes of `r`. */
bool Touches(const PlanStep& s, const MemoryRegion& r) { return AnyOverlaps(s.reads, r) || AnyOverlaps(s.writes, r); }

enum class Transfer { kNone, kIn, kOut };

/*! \brief Whether `step` is a copy between the host and device `d` that a segment call can carry. */
Transfer TransferOf(const ExecutionPlan& plan, const std::vector<DLDevice>& devices, const PlanStep& step, int d) {
  if (step.kind != PlanStep::Kind::kCopy || step.staged) return Transfer::kNone;
  const DLDevice from = devices[plan.tensors[step.args[0]].device], to = devices[plan.tensors[step.args[1]].device];
  if (support::IsHost(from) && support::SameDevice(to, devices[d])) return Transfer::kIn;
  if (support::SameDevice(from, devices[d]) && support::IsHost(to)) return Transfer::kOut;
  return Transfer::kNone;
}

}  // namespace

ExecutionPlan FormOffloadSegments(ExecutionPlan plan, const std::vector<DLDevice>& devices) {
  plan.segments.clear();
  const std::vector<PlanStep>& steps = plan.steps;
  std::vector<int64_t> per_device(devices.size(), 0);
  std::vector<uint8_t> joined(steps.size(), 0);  // a step a segment call carries
  // Inputs and kernels: runs of one group (see the file comment for when an input may join).
  for (const ExecGroup& group : plan.groups) {
    if (!support::IsRemote(devices[group.device])) continue;
    OffloadSegment open;  // the segment being formed, while is_open
    bool is_open = false;
    auto close = [&]() {
      bool has_kernel = is_open && std::any_of(steps.begin() + open.begin, steps.begin() + open.end,
                                               [](const PlanStep& s) { return s.kind == PlanStep::Kind::kKernel; });
      if (has_kernel) {
        open.index = per_device[open.device]++;
        for (uint32_t i = open.begin; i < open.end; ++i) joined[i] = 1;
        plan.segments.push_back(std::move(open));
      }
      open = OffloadSegment();
      is_open = false;
    };
    for (uint32_t i = group.begin; i < group.end; ++i) {
      const PlanStep& step = steps[i];
      Transfer transfer = TransferOf(plan, devices, step, group.device);
      if (step.kind != PlanStep::Kind::kKernel && transfer != Transfer::kIn) {
        close();
        continue;
      }
      if (is_open && transfer == Transfer::kIn) {
        const MemoryRegion& written = step.writes.front();
        bool clobbers = false;  // would writing it at the segment's start overwrite what an earlier step reads?
        for (uint32_t j = open.begin; j < i && !clobbers; ++j) clobbers = Touches(steps[j], written);
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
    for (auto segment = plan.segments.rbegin(); segment != plan.segments.rend(); ++segment) {
      if (segment->end > c) continue;
      if (TransferOf(plan, devices, steps[c], segment->device) != Transfer::kOut) continue;
      const MemoryRegion& source = steps[c].reads.front();
      const MemoryRegion& written = steps[c].writes.front();
      bool moves = true;
      for (uint32_t j = segment->end; j < c && moves; ++j) {
        moves = !AnyOverlaps(steps[j].writes, source) && !Touches(steps[j], written);
      }
      if (moves) {
        segment->outputs.push_back(c);
        joined[c] = 1;
      }
      break;  // only the latest segment of the copy's device may carry it
    }
  }
  return plan;
}

ExecutionPlan AttachOffloadRunner(ExecutionPlan plan, int device, tvm::ffi::Function run_segment) {
  // Positions below are those of the plan before any runner was attached: a step's `origin`.
  std::vector<int32_t> group_at, carried_by;  // by origin: segment starting there / carrying it
  uint32_t num_origins = 0;
  for (const PlanStep& s : plan.steps) num_origins = std::max(num_origins, s.origin + 1);
  for (const OffloadSegment& segment : plan.segments) {
    for (const PlanStep& s : segment.sub_steps) num_origins = std::max(num_origins, s.origin + 1);
  }
  group_at.assign(num_origins, -1);
  carried_by.assign(num_origins, -1);
  bool any = false;
  for (size_t k = 0; k < plan.segments.size(); ++k) {
    OffloadSegment& segment = plan.segments[k];
    if (segment.device != device) continue;
    any = true;
    if (segment.attached) continue;  // a second runner for the device: the group steps stay, re-pointed below
    group_at[segment.begin] = static_cast<int32_t>(k);
    for (uint32_t i = segment.begin; i < segment.end; ++i) carried_by[i] = static_cast<int32_t>(k);
    for (uint32_t i : segment.outputs) carried_by[i] = static_cast<int32_t>(k);
  }
  if (!any) TVM_FFI_THROW(ValueError) << "device " << device << " has no offload segments";
  std::vector<PlanStep> steps;
  for (PlanStep& step : plan.steps) {
    if (step.kind == PlanStep::Kind::kOffloadGroup) {
      if (plan.segments[step.segment].device == device) step.function = run_segment;
      steps.push_back(std::move(step));
      continue;
    }
    const int32_t k = carried_by[step.origin];
    if (k < 0) {
      steps.push_back(std::move(step));
      continue;
    }
    OffloadSegment& segment = plan.segments[k];
    if (group_at[step.origin] == k) {
      PlanStep group;
      group.kind = PlanStep::Kind::kOffloadGroup;
      group.node = step.node;
      group.device = segment.device;
      group.function = run_segment;
      group.remote = true;
      group.segment = k;
      group.origin = step.origin;
      steps.push_back(std::move(group));
    }
    segment.sub_steps.push_back(std::move(step));
  }
  // Each group's sub-steps arrived in serial order: body first (positions < end), outputs after.
  for (PlanStep& group : steps) {
    if (group.kind != PlanStep::Kind::kOffloadGroup || group_at[group.origin] < 0) continue;
    OffloadSegment& segment = plan.segments[group.segment];
    segment.attached = true;
    segment.num_body_steps = static_cast<uint32_t>(
        std::count_if(segment.sub_steps.begin(), segment.sub_steps.end(),
                      [&](const PlanStep& s) { return s.origin < segment.end; }));
    for (const PlanStep& s : segment.sub_steps) {
      group.reads.insert(group.reads.end(), s.reads.begin(), s.reads.end());
      group.writes.insert(group.writes.end(), s.writes.begin(), s.writes.end());
    }
  }
  plan.steps = std::move(steps);
  return plan;
}

}  // namespace tvm_hetero
