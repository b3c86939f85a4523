/*!
 * \file concurrency/device_executors.cc
 * \brief Executor threads, cross-device waits (spin, then sleep) and stopping on the first error.
 */
#include "device_executors.h"

#include <tvm/ffi/error.h>

#include "support/thread_pinning.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace tvm_hetero {

namespace ffi = tvm::ffi;

namespace {

/*! \brief Spins before sleeping in a wait: a cross-device wait is often shorter than a wake-up. */
constexpr int kSpinsBeforeSleep = 4000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

double SpinWindowSeconds() {
  std::atomic<uint64_t> never_done{0};
  std::vector<double> seconds;
  for (int round = 0; round < 9; ++round) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kSpinsBeforeSleep; ++i) {  // the loop of WaitFor, with a step never done
      if (never_done.load(std::memory_order_acquire) >= 1) break;
      CpuRelax();
    }
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

DeviceExecutors::~DeviceExecutors() { Stop(); }

void DeviceExecutors::Start(StepSchedule schedule, StepFunction run_step, void* context,
                            std::vector<ExecutorOptions> options) {
  Stop();
  schedule_ = std::move(schedule);
  run_step_ = run_step;
  context_ = context;
  options_ = std::move(options);
  const int num_devices = static_cast<int>(schedule_.device_steps.size());
  options_.resize(num_devices);
  step_done_.reset(new std::atomic<uint64_t>[schedule_.waits.size()]);
  for (size_t s = 0; s < schedule_.waits.size(); ++s) step_done_[s].store(0, std::memory_order_relaxed);
  run_.store(0);
  stopping_run_.store(false);
  shutting_down_.store(false);
  // The primary device keeps the caller's thread (and its TVM thread pool) unless told otherwise.
  inline_device_ = num_devices > 0 && options_[0].empty() ? 0 : -1;
  threads_.clear();
  threads_.resize(num_devices);
  num_workers_ = 0;
  for (int d = 0; d < num_devices; ++d) {
    if (d == inline_device_ || schedule_.device_steps[d].empty()) continue;
    threads_[d] = std::thread(&DeviceExecutors::WorkerLoop, this, d);
    ++num_workers_;
  }
  started_ = true;
}

void DeviceExecutors::Stop() {
  if (!started_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutting_down_.store(true);
    stopping_run_.store(true);
  }
  work_cv_.notify_all();
  progress_cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  num_workers_ = 0;
  started_ = false;
}

void DeviceExecutors::ConfigureThread(int d) const {
  const ExecutorOptions& opt = options_[d];
  support::ConfigureCurrentThread(opt.cores, opt.num_threads, support::CoreSharing::kOneCorePerThread);
}

void DeviceExecutors::WorkerLoop(int d) {
  try {
    ConfigureThread(d);
  } catch (...) {
    // Reported by the first run that needs this executor.
    Fail(std::current_exception());
  }
  uint64_t seen = 0;
  while (true) {
    // Back-to-back runs are common (a serving loop): spin a little before sleeping on the next run.
    for (int i = 0; i < kSpinsBeforeSleep && run_.load(std::memory_order_acquire) == seen; ++i) CpuRelax();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return shutting_down_.load() || run_.load() != seen; });
      if (shutting_down_.load()) return;
      seen = run_.load();
    }
    RunDeviceSteps(d, seen);
    if (busy_workers_.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_all();
    }
  }
}

void DeviceExecutors::Run() {
  if (!started_) TVM_FFI_THROW(InternalError) << "device executors were not started";
  uint64_t run;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!first_error_) stopping_run_.store(false);  // an executor that failed to start stays failed
    busy_workers_.store(num_workers_);
    run = run_.fetch_add(1) + 1;
  }
  work_cv_.notify_all();
  if (inline_device_ >= 0) RunDeviceSteps(inline_device_, run);
  for (int i = 0; i < kSpinsBeforeSleep && busy_workers_.load(std::memory_order_acquire) != 0; ++i) CpuRelax();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return busy_workers_.load() == 0; });
    if (first_error_) {
      std::exception_ptr error = first_error_;
      first_error_ = nullptr;
      std::rethrow_exception(error);
    }
  }
}

bool DeviceExecutors::RunDeviceSteps(int d, uint64_t run) {
  for (uint32_t s : schedule_.device_steps[d]) {
    if (stopping_run_.load(std::memory_order_acquire)) return false;
    for (uint32_t w : schedule_.waits[s]) {
      if (!WaitFor(w, run)) return false;
    }
    try {
      run_step_(context_, s);
    } catch (...) {
      Fail(std::current_exception());
      return false;
    }
    if (schedule_.awaited[s]) PublishDone(s, run);
  }
  return true;
}

bool DeviceExecutors::WaitFor(uint32_t s, uint64_t run) {
  for (int i = 0; i < kSpinsBeforeSleep; ++i) {
    if (step_done_[s].load(std::memory_order_acquire) >= run) return true;
    if (stopping_run_.load(std::memory_order_relaxed)) return false;
    CpuRelax();
  }
  // Sleep. The sleeper count and the completion are both sequentially consistent, so either the
  // publisher sees this sleeper and notifies, or this thread sees the completion under the lock.
  sleepers_.fetch_add(1);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    progress_cv_.wait(lock, [&] { return step_done_[s].load() >= run || stopping_run_.load(); });
  }
  sleepers_.fetch_sub(1);
  return step_done_[s].load(std::memory_order_acquire) >= run;
}

void DeviceExecutors::PublishDone(uint32_t s, uint64_t run) {
  step_done_[s].store(run);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    progress_cv_.notify_all();
  }
}

void DeviceExecutors::Fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!first_error_) first_error_ = error;
    stopping_run_.store(true);
  }
  progress_cv_.notify_all();
}

}  // namespace tvm_hetero
