/*!
 * \file concurrency/step_schedule.h
 * \brief From a serial list of steps and the memory each touches, the per-device step lists and the
 *        cross-device waits that make concurrent execution give the serial result.
 *
 * Rule. Two steps conflict when they touch overlapping bytes of one storage slot and at least one
 * of them writes (read-after-write, write-after-read, write-after-write). Each device runs its own
 * steps in serial order, so conflicts on one device are ordered already; a conflict between steps
 * of two devices becomes a wait of the later step for the earlier one.
 *
 * Guarantees of DeriveStepSchedule:
 * - every conflicting pair on different devices is ordered as in the serial list, directly by a
 *   wait or through a chain of waits and per-device order (so results are bit-identical to serial
 *   execution, and a slot is reused only after every reader of its previous tensor, on any device,
 *   has finished);
 * - every wait points to an earlier step of the serial list, so executors that each follow their
 *   list can never deadlock: the earliest unfinished step always has all it waits for done;
 * - a step waits at most once per other device (the latest step it needs there), and not at all
 *   for a step its device already waited for at an earlier step.
 * Cost: O(accesses * live accesses per slot); a write that covers a byte range retires the earlier
 * accesses inside it (anything that conflicts with them later also conflicts with the write).
 */
#ifndef TVM_HETERO_CONCURRENCY_STEP_SCHEDULE_H_
#define TVM_HETERO_CONCURRENCY_STEP_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tvm_hetero {

/*! \brief Bytes [begin, end) of one storage slot. */
struct MemoryRegion {
  uint32_t slot = 0;
  size_t begin = 0, end = 0;
};

/*! \brief What one step touches, and where it runs. */
struct StepAccess {
  /*! \brief Device position of the executor that runs the step. */
  int device = 0;
  std::vector<MemoryRegion> reads;
  std::vector<MemoryRegion> writes;
};

/*! \brief Per-device step lists and cross-device waits. */
struct StepSchedule {
  /*! \brief Steps of each device, in serial order. */
  std::vector<std::vector<uint32_t>> device_steps;
  /*! \brief For each step, the steps on other devices it must wait for (at most one per device). */
  std::vector<std::vector<uint32_t>> waits;
  /*! \brief True for steps some other step waits for (their completion must be published). */
  std::vector<bool> awaited;

  /*! \brief Total number of waits. */
  size_t NumWaits() const;
};

/*! \brief Derive the schedule (see the file comment for the rule and guarantees). */
StepSchedule DeriveStepSchedule(const std::vector<StepAccess>& steps, int num_devices);

/*!
 * \brief The schedule of serial execution on device executors: each device's steps as above, and
 *        every step waits for the step before it in the serial list when that one is on another
 *        device. Guarantee: a step starts only after every earlier step has finished (by induction:
 *        the step before it finished, directly awaited or earlier on the same executor), so one
 *        device runs at a time, in serial order, each on its own executor (its cores and threads).
 */
StepSchedule SerialStepSchedule(const std::vector<StepAccess>& steps, int num_devices);

}  // namespace tvm_hetero

#endif  // TVM_HETERO_CONCURRENCY_STEP_SCHEDULE_H_
