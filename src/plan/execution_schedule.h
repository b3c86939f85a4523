/*!
 * \file plan/execution_schedule.h
 * \brief How frames execute a plan: the serial loop on the caller, or device executors following a
 *        StepSchedule derived from the steps' memory accesses (concurrent) or from their order
 *        (serial with executor options). One schedule serves every frame of a plan.
 */
#ifndef TVM_HETERO_PLAN_EXECUTION_SCHEDULE_H_
#define TVM_HETERO_PLAN_EXECUTION_SCHEDULE_H_

#include <tvm_hetero/execution.h>

#include <optional>
#include <vector>

#include "concurrency/step_schedule.h"
#include "plan/execution_plan.h"

namespace tvm_hetero {

/*! \brief What a frame's executors run (empty `use_executors`: the serial loop). */
struct ExecutionSchedule {
  /*! \brief Device executors are needed (several busy devices, or executor options). */
  bool use_executors = false;
  StepSchedule schedule;
  /*! \brief Per step: the accelerator whose stream must drain before other devices may read the
   *         step's results (a kernel launch returns before the work is done), or none. */
  std::vector<std::optional<DLDevice>> sync_before_publish;
  /*! \brief Cross-device waits of the schedule. */
  size_t num_waits = 0;
  std::vector<ExecutorOptions> options;
};

/*! \brief The schedule of `plan` on `devices` in `mode` with per-device `options`. */
ExecutionSchedule ScheduleFor(const ExecutionPlan& plan, const std::vector<DLDevice>& devices, ExecutionMode mode,
                              const std::vector<ExecutorOptions>& options);

}  // namespace tvm_hetero

#endif  // TVM_HETERO_PLAN_EXECUTION_SCHEDULE_H_
