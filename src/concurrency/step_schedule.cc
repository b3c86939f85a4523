/*!
 * \file concurrency/step_schedule.cc
 * \brief DeriveStepSchedule: conflicts per storage slot, reduced to the waits that order them;
 *        SerialStepSchedule: every device switch of the serial list is a wait.
 */
#include "step_schedule.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <unordered_map>

namespace tvm_hetero {

namespace {

/*! \brief One earlier access still able to conflict with later ones. */
struct LiveAccess {
  uint32_t step;
  size_t begin, end;
  bool write;
};

bool Overlaps(const LiveAccess& a, const MemoryRegion& r) { return a.begin < r.end && r.begin < a.end; }

}  // namespace

size_t StepSchedule::NumWaits() const {
  size_t total = 0;
  for (const auto& w : waits) total += w.size();
  return total;
}

StepSchedule DeriveStepSchedule(const std::vector<StepAccess>& steps, int num_devices) {
  StepSchedule schedule;
  schedule.device_steps.resize(num_devices);
  schedule.waits.resize(steps.size());
  schedule.awaited.assign(steps.size(), false);
  std::unordered_map<uint32_t, std::vector<LiveAccess>> live;  // slot -> accesses not yet retired
  // waited[d][e]: the latest step of device e that device d has waited for (or -1).
  std::vector<std::vector<int64_t>> waited(num_devices, std::vector<int64_t>(num_devices, -1));
  std::vector<int64_t> latest_needed(num_devices);

  for (uint32_t s = 0; s < steps.size(); ++s) {
    const StepAccess& step = steps[s];
    if (step.device < 0 || step.device >= num_devices) {
      TVM_FFI_THROW(InternalError) << "step " << s << " is on device " << step.device << " of " << num_devices;
    }
    schedule.device_steps[step.device].push_back(s);
    std::fill(latest_needed.begin(), latest_needed.end(), -1);
    auto depend_on = [&](uint32_t earlier) {
      int d = steps[earlier].device;
      if (d != step.device) latest_needed[d] = std::max<int64_t>(latest_needed[d], earlier);
    };
    for (const MemoryRegion& r : step.reads) {
      for (const LiveAccess& a : live[r.slot]) {
        if (a.write && Overlaps(a, r)) depend_on(a.step);
      }
    }
    for (const MemoryRegion& r : step.writes) {
      for (const LiveAccess& a : live[r.slot]) {
        if (Overlaps(a, r)) depend_on(a.step);
      }
    }
    for (int d = 0; d < num_devices; ++d) {
      if (latest_needed[d] <= waited[step.device][d]) continue;  // already ordered by an earlier wait
      schedule.waits[s].push_back(static_cast<uint32_t>(latest_needed[d]));
      schedule.awaited[latest_needed[d]] = true;
      waited[step.device][d] = latest_needed[d];
    }
    // Record this step's accesses; a write retires the earlier accesses it covers.
    for (const MemoryRegion& r : step.writes) {
      auto& accesses = live[r.slot];
      accesses.erase(std::remove_if(accesses.begin(), accesses.end(),
                                    [&](const LiveAccess& a) { return r.begin <= a.begin && a.end <= r.end; }),
                     accesses.end());
    }
    for (const MemoryRegion& r : step.reads) live[r.slot].push_back({s, r.begin, r.end, false});
    for (const MemoryRegion& r : step.writes) live[r.slot].push_back({s, r.begin, r.end, true});
  }
  return schedule;
}

StepSchedule SerialStepSchedule(const std::vector<StepAccess>& steps, int num_devices) {
  StepSchedule schedule;
  schedule.device_steps.resize(num_devices);
  schedule.waits.resize(steps.size());
  schedule.awaited.assign(steps.size(), false);
  for (uint32_t s = 0; s < steps.size(); ++s) {
    const int device = steps[s].device;
    if (device < 0 || device >= num_devices) {
      TVM_FFI_THROW(InternalError) << "step " << s << " is on device " << device << " of " << num_devices;
    }
    schedule.device_steps[device].push_back(s);
    if (s > 0 && steps[s - 1].device != device) {
      schedule.waits[s].push_back(s - 1);
      schedule.awaited[s - 1] = true;
    }
  }
  return schedule;
}

}  // namespace tvm_hetero
