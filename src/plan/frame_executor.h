/*!
 * \file plan/frame_executor.h
 * \brief The executors of (plan, frame): objects of their own that run a frame's prepared steps.
 *        GraphRuntime owns the plan and the frames and chooses, per frame, one executor:
 *        SerialExecutor (every step on the calling thread, in plan order) or ConcurrentExecutor
 *        (each device's steps on its own executor, waits from the schedule). The frame owns only
 *        per-request state; an executor reads its prepared steps and never changes its memory.
 *
 * What is common to both lives in the base: one Run (reset the remote counters, run the steps,
 * wait for the devices that need it), running a step of any kind, naming a failing step's node and
 * device, and timed runs for trace and profile (the same steps timed, never another program).
 * Nothing on the Run path allocates, looks anything up, logs or holds a lock across a kernel.
 */
#ifndef TVM_HETERO_PLAN_FRAME_EXECUTOR_H_
#define TVM_HETERO_PLAN_FRAME_EXECUTOR_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/error.h>
#include <tvm_hetero/run_frame.h>

#include <chrono>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "concurrency/device_executors.h"
#include "plan/execution_plan.h"
#include "plan/execution_schedule.h"

namespace tvm_hetero {

struct GroupCall;

/*! \brief Per step of one timed run: start and end in µs from the run's start (-1: not run). */
using StepSpans = std::vector<std::pair<double, double>>;

/*! \brief Runs one frame's steps of one plan (see the file comment). */
class FrameExecutor {
 public:
  /*! \brief An executor of `plan` over `frame` (prepared for that plan); `model` names steps in errors. */
  FrameExecutor(const PlanInputs& model, std::shared_ptr<const ExecutionPlan> plan, RunFrame& frame);
  virtual ~FrameExecutor() = default;
  FrameExecutor(const FrameExecutor&) = delete;
  FrameExecutor& operator=(const FrameExecutor&) = delete;

  /*! \brief Execute every step once, then wait for devices that need it (callers check use and inputs). */
  void Run();
  /*! \brief Run `runs` times timing every step (a span is the device's work, not its launch). */
  std::vector<StepSpans> TimedRuns(int runs);

 protected:
  /*! \brief Every step once, the executor's way. */
  virtual void RunSteps() = 0;
  /*! \brief Step `i` of any kind; errors not yet named. */
  void RunStep(uint32_t i, tvm::ffi::Any* rv);
  /*!
   * \brief Step `i` alone, as an executor thread or a timed run runs it: timed while timing, then
   *        `drain` synchronised (its results are read on another device) or, while timing, the
   *        step's device waited for; errors name the step.
   */
  void RunStepAlone(uint32_t i, const std::optional<DLDevice>& drain);
  /*! \brief `err` with step `i`'s node and device in front (i past the steps: the final sync). */
  tvm::ffi::Error ErrorAt(uint32_t i, const tvm::ffi::Error& err) const;

  /*! \brief The graph and devices the plan was built from (node names and devices in errors). */
  const PlanInputs& model_;
  /*! \brief The plan the frame was prepared for. */
  std::shared_ptr<const ExecutionPlan> plan_;
  /*! \brief The frame whose prepared steps run. */
  RunFrame& frame_;
  /*! \brief Set while TimedRuns records step times (read between runs only). */
  bool timing_ = false;

 private:
  /*! \brief Write the bytes a group's call returned into its outputs' tensors. */
  static void ReceiveGroupOutputs(const GroupCall& group, const tvm::ffi::Any& returned);

  /*! \brief Devices whose kind has work to wait for at the end of a run. */
  std::vector<DLDevice> devices_to_sync_;
  /*! \brief Start of the timed run, and each step's span in it (µs; -1: not run). */
  std::chrono::steady_clock::time_point run_start_;
  std::vector<double> span_start_us_, span_end_us_;
};

/*! \brief Every step on the calling thread, in plan order: the flat loop of the hot path. */
class SerialExecutor final : public FrameExecutor {
 public:
  using FrameExecutor::FrameExecutor;

 private:
  void RunSteps() final;
};

/*!
 * \brief Each device's steps on its own executor (concurrency/device_executors.h), ordered by the
 *        schedule's waits; a step read on another device has its device drained first.
 */
class ConcurrentExecutor final : public FrameExecutor {
 public:
  /*! \brief Starts the device executors of `schedule` (which must use executors). */
  ConcurrentExecutor(const PlanInputs& model, std::shared_ptr<const ExecutionPlan> plan, RunFrame& frame,
                     std::shared_ptr<const ExecutionSchedule> schedule);
  /*! \brief Stops the executor threads before anything they read goes away. */
  ~ConcurrentExecutor() override;

 private:
  void RunSteps() final;
  /*! \brief The device executors' step function: step `i` of the executor `self`. */
  static void RunScheduledStep(void* self, uint32_t i);

  /*! \brief The per-device step lists, waits and per-step drains. */
  std::shared_ptr<const ExecutionSchedule> schedule_;
  /*! \brief A drain-free step's entry of RunStepAlone (no device to drain). */
  const std::optional<DLDevice> no_drain_;
  /*! \brief One executor thread per busy device (the primary may run on the caller). */
  DeviceExecutors executors_;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_PLAN_FRAME_EXECUTOR_H_
