/*!
 * \file plan/concurrent_executor.cc
 * \brief ConcurrentExecutor: the frame's steps on per-device executors following the schedule; one
 *        Run is one submit and one wait (concurrency/device_executors.h).
 */
#include "plan/frame_executor.h"

namespace tvm_hetero {

ConcurrentExecutor::ConcurrentExecutor(const PlanInputs& model, std::shared_ptr<const ExecutionPlan> plan,
                                       RunFrame& frame, std::shared_ptr<const ExecutionSchedule> schedule)
    : FrameExecutor(model, std::move(plan), frame), schedule_(std::move(schedule)) {
  executors_.Start(schedule_->schedule, &ConcurrentExecutor::RunScheduledStep, this, schedule_->options);
}

ConcurrentExecutor::~ConcurrentExecutor() { executors_.Stop(); }

void ConcurrentExecutor::RunSteps() { executors_.Run(); }

void ConcurrentExecutor::RunScheduledStep(void* self, uint32_t i) {
  auto* executor = static_cast<ConcurrentExecutor*>(self);
  const std::vector<std::optional<DLDevice>>& drains = executor->schedule_->sync_before_publish;
  executor->RunStepAlone(i, drains.empty() ? executor->no_drain_ : drains[i]);
}

}  // namespace tvm_hetero
