/*!
 * \file plan/execution_schedule.cc
 * \brief ScheduleFor: the steps' accesses -> the executors' schedule (or none for the serial loop).
 */
#include "plan/execution_schedule.h"

#include "support/device.h"

namespace tvm_hetero {

ExecutionSchedule ScheduleFor(const ExecutionPlan& plan, const std::vector<DLDevice>& devices, ExecutionMode mode,
                              const std::vector<ExecutorOptions>& options) {
  ExecutionSchedule out;
  out.options = options;
  // Serial execution without options is the flat loop on the caller; with options, each device's
  // steps run on its configured executor, one device at a time (SerialStepSchedule).
  if (mode != ExecutionMode::kConcurrent && !HasExecutorOptions(options)) return out;
  std::vector<StepAccess> access;
  access.reserve(plan.steps.size());
  for (const PlanStep& step : plan.steps) access.push_back(StepAccess{step.device, step.reads, step.writes});
  const int num_devices = static_cast<int>(devices.size());
  out.schedule = mode == ExecutionMode::kConcurrent ? DeriveStepSchedule(access, num_devices)
                                                    : SerialStepSchedule(access, num_devices);
  out.num_waits = out.schedule.NumWaits();
  out.sync_before_publish.assign(plan.steps.size(), std::nullopt);
  for (uint32_t i = 0; i < plan.steps.size(); ++i) {
    DLDevice dev = devices[access[i].device];
    if (out.schedule.awaited[i] && support::IsAsynchronous(dev)) out.sync_before_publish[i] = dev;
  }
  // One device with steps and no options of its own: the serial loop on the caller is the same
  // schedule without the executors' per-step indirection.
  int busy_devices = 0, last_busy = 0;
  for (int d = 0; d < static_cast<int>(out.schedule.device_steps.size()); ++d) {
    if (out.schedule.device_steps[d].empty()) continue;
    ++busy_devices;
    last_busy = d;
  }
  bool has_options = last_busy < static_cast<int>(options.size()) && !options[last_busy].empty();
  out.use_executors = busy_devices > 1 || has_options;
  return out;
}

}  // namespace tvm_hetero
