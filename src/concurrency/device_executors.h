/*!
 * \file concurrency/device_executors.h
 * \brief One executor per device running its steps of a StepSchedule at the same time as the others.
 *
 * Life cycle: Start() creates the executors once (a thread per device, pinned to its cores with its
 * own TVM thread pool when options say so; the primary device runs on the calling thread unless it
 * has options). Run() is one submit plus one wait: it publishes a new run number, runs the calling
 * thread's own steps, and waits until every executor has finished or stopped. Nothing is allocated,
 * looked up or logged per run, and no lock is held while a step runs.
 *
 * Ordering contract: a step starts after the steps it waits for (StepSchedule::waits) have finished
 * in this run; completion is published with release semantics and observed with acquire, so a
 * step's writes are visible to the steps that waited for it.
 *
 * Failure: the first step that throws stops the run. Every other executor stops before its next
 * step (a step blocked in a wait is woken), Run() rethrows the first error, and the executors are
 * ready for the next Run(). The destructor stops and joins the threads; it never waits for a step
 * that is not running.
 */
#ifndef TVM_HETERO_CONCURRENCY_DEVICE_EXECUTORS_H_
#define TVM_HETERO_CONCURRENCY_DEVICE_EXECUTORS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <tvm_hetero/execution.h>

#include "step_schedule.h"

namespace tvm_hetero {

/*! \brief Runs one step; throws to stop the run. */
using StepFunction = void (*)(void* context, uint32_t step);

/*!
 * \brief Seconds a cross-device wait spins before it sleeps (the median of a few timings of the spin
 *  loop itself, on the calling thread). An input published within this window after a device began
 *  waiting costs no wake-up; automatic placement's cost model uses it.
 */
double SpinWindowSeconds();

class DeviceExecutors {
 public:
  DeviceExecutors() = default;
  DeviceExecutors(const DeviceExecutors&) = delete;
  DeviceExecutors& operator=(const DeviceExecutors&) = delete;
  ~DeviceExecutors();

  /*!
   * \brief Create the executors.
   * \param schedule Per-device steps and waits (copied).
   * \param run_step Called with `context` for every step, on the step's executor.
   * \param options Per device (may be shorter than the device count: the rest have none).
   */
  void Start(StepSchedule schedule, StepFunction run_step, void* context, std::vector<ExecutorOptions> options);
  /*! \brief Run every step once; rethrows the first step error. */
  void Run();
  /*! \brief Stop and join the executor threads (idempotent). */
  void Stop();
  bool started() const { return started_; }
  /*! \brief Steps run on the calling thread (the primary device, when it has no options). */
  int inline_device() const { return inline_device_; }

 private:
  /*! \brief Run device `d`'s steps for run `run`; false if the run was stopped. */
  bool RunDeviceSteps(int d, uint64_t run);
  /*! \brief Block until step `s` finished in run `run` or the run stopped; false if stopped. */
  bool WaitFor(uint32_t s, uint64_t run);
  void PublishDone(uint32_t s, uint64_t run);
  void Fail(std::exception_ptr error);
  void WorkerLoop(int d);
  void ConfigureThread(int d) const;

  /*! \brief What to run. */
  StepSchedule schedule_;
  StepFunction run_step_ = nullptr;
  void* context_ = nullptr;
  std::vector<ExecutorOptions> options_;
  /*! \brief Device whose steps run on the caller's thread, or -1. */
  int inline_device_ = -1;
  /*! \brief Threads of the other devices (index: device; empty where inline or without steps). */
  std::vector<std::thread> threads_;
  /*! \brief Number of threads in threads_ (each finishes every run). */
  int num_workers_ = 0;
  bool started_ = false;

  /*! \brief Number of the current run (0: none yet); executors start a run when it changes. */
  std::atomic<uint64_t> run_{0};
  /*! \brief Run number in which each step last finished. */
  std::unique_ptr<std::atomic<uint64_t>[]> step_done_;
  /*! \brief Set when a step failed or the executors are stopping. */
  std::atomic<bool> stopping_run_{false};
  std::atomic<bool> shutting_down_{false};
  /*! \brief Executors (threads) still working on the current run. */
  std::atomic<int> busy_workers_{0};
  /*! \brief Threads blocked in WaitFor (completions notify only when someone sleeps). */
  std::atomic<int> sleepers_{0};
  /*! \brief Guards the condition variables' predicates and first_error_. */
  std::mutex mutex_;
  std::condition_variable work_cv_;      // workers: a new run or shutdown
  std::condition_variable progress_cv_;  // waiters: a step finished or the run stopped
  std::condition_variable done_cv_;      // caller: the workers finished the run
  std::exception_ptr first_error_;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_CONCURRENCY_DEVICE_EXECUTORS_H_
