// Concurrent execution's building blocks: the schedule derived from memory conflicts (checked
// against brute-force happens-before), and the device executors (bit-identical to serial order,
// failures stop every executor, shutdown never hangs). Also run under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>

#include "concurrency/device_executors.h"
#include "concurrency/step_schedule.h"
#include "support/thread_pinning.h"

namespace tvm_hetero {
namespace {

MemoryRegion Slot(uint32_t slot, size_t begin = 0, size_t end = 16) { return MemoryRegion{slot, begin, end}; }

TEST(StepSchedule, ReadOfAnotherDevicesOutputWaitsForIt) {
  std::vector<StepAccess> steps = {{0, {}, {Slot(0)}}, {1, {Slot(0)}, {Slot(1)}}};
  StepSchedule s = DeriveStepSchedule(steps, 2);
  EXPECT_EQ(s.device_steps[0], std::vector<uint32_t>({0}));
  EXPECT_EQ(s.device_steps[1], std::vector<uint32_t>({1}));
  EXPECT_EQ(s.waits[1], std::vector<uint32_t>({0}));
  EXPECT_TRUE(s.awaited[0]);
}

TEST(StepSchedule, SlotReuseWaitsForEveryReaderOnOtherDevices) {
  // Step 0 (dev 0) writes slot 0; step 1 (dev 1) reads it; step 2 (dev 0) overwrites slot 0.
  std::vector<StepAccess> steps = {
      {0, {}, {Slot(0)}}, {1, {Slot(0)}, {Slot(1)}}, {0, {}, {Slot(0)}}};
  StepSchedule s = DeriveStepSchedule(steps, 2);
  EXPECT_EQ(s.waits[2], std::vector<uint32_t>({1}));  // write-after-read across devices
}

TEST(StepSchedule, DisjointByteRangesOfOneSlotDoNotConflict) {
  std::vector<StepAccess> steps = {{0, {}, {Slot(0, 0, 8)}}, {1, {}, {Slot(0, 8, 16)}}};
  EXPECT_EQ(DeriveStepSchedule(steps, 2).NumWaits(), 0u);
  steps[1].writes[0].begin = 0;
  EXPECT_EQ(DeriveStepSchedule(steps, 2).NumWaits(), 1u);
}

TEST(StepSchedule, ADeviceWaitsOnceForWhatItAlreadyWaitedFor) {
  // Steps 1 and 2 on device 1 both read step 0's output: only step 1 waits.
  std::vector<StepAccess> steps = {{0, {}, {Slot(0)}}, {1, {Slot(0)}, {Slot(1)}}, {1, {Slot(0)}, {Slot(2)}}};
  StepSchedule s = DeriveStepSchedule(steps, 2);
  EXPECT_EQ(s.waits[1].size(), 1u);
  EXPECT_TRUE(s.waits[2].empty());
}

/*! \brief Random steps over a few slots with random byte ranges. */
std::vector<StepAccess> RandomSteps(std::mt19937& rng, int num_steps, int num_devices, int num_slots) {
  std::vector<StepAccess> steps(num_steps);
  auto region = [&] {
    uint32_t slot = rng() % num_slots;
    size_t begin = rng() % 8, end = begin + 1 + rng() % 8;
    return MemoryRegion{slot, begin, end};
  };
  for (StepAccess& step : steps) {
    step.device = static_cast<int>(rng() % num_devices);
    for (int i = rng() % 3; i > 0; --i) step.reads.push_back(region());
    for (int i = 1 + rng() % 2; i > 0; --i) step.writes.push_back(region());
  }
  return steps;
}

bool Conflict(const StepAccess& a, const StepAccess& b) {
  auto overlap = [](const MemoryRegion& x, const MemoryRegion& y) {
    return x.slot == y.slot && x.begin < y.end && y.begin < x.end;
  };
  for (const MemoryRegion& w : a.writes) {
    for (const MemoryRegion& r : b.reads) if (overlap(w, r)) return true;
    for (const MemoryRegion& r : b.writes) if (overlap(w, r)) return true;
  }
  for (const MemoryRegion& r : a.reads) {
    for (const MemoryRegion& w : b.writes) if (overlap(r, w)) return true;
  }
  return false;
}

TEST(StepSchedule, EveryConflictIsOrderedAsInSerialOrder) {
  std::mt19937 rng(2026);
  for (int trial = 0; trial < 300; ++trial) {
    int num_devices = 2 + trial % 3;
    std::vector<StepAccess> steps = RandomSteps(rng, 4 + trial % 30, num_devices, 1 + trial % 4);
    StepSchedule s = DeriveStepSchedule(steps, num_devices);
    const size_t n = steps.size();
    // before[j][i]: step i happens before step j (per-device order and waits, transitively).
    std::vector<std::vector<bool>> before(n, std::vector<bool>(n, false));
    for (size_t j = 0; j < n; ++j) {
      for (size_t i = 0; i < j; ++i) {
        if (steps[i].device == steps[j].device) before[j][i] = true;
      }
      for (uint32_t w : s.waits[j]) {
        ASSERT_LT(w, j) << "a wait must point backwards";
        ASSERT_NE(steps[w].device, steps[j].device);
        before[j][w] = true;
      }
      for (size_t i = 0; i < j; ++i) {
        if (!before[j][i]) continue;
        for (size_t k = 0; k < i; ++k) before[j][k] = before[j][k] || before[i][k];
      }
    }
    for (size_t j = 0; j < n; ++j) {
      for (size_t i = 0; i < j; ++i) {
        if (Conflict(steps[i], steps[j])) {
          EXPECT_TRUE(before[j][i]) << "trial " << trial << ": steps " << i << " and " << j << " conflict";
        }
      }
    }
  }
}

/*! \brief Steps that compute on a shared array: each step folds the values it reads into the ones it
 *         writes. Any missed ordering changes the result (and TSan reports the race). */
struct Machine {
  const std::vector<StepAccess>* steps = nullptr;
  std::vector<uint64_t> memory;  // slots * 16 words
  int fail_at = -1;
  std::atomic<int> slow_step{-1};
  static void Step(void* context, uint32_t s) {
    auto* m = static_cast<Machine*>(context);
    if (static_cast<int>(s) == m->fail_at) throw std::runtime_error("step " + std::to_string(s) + " failed");
    if (static_cast<int>(s) == m->slow_step.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    const StepAccess& step = (*m->steps)[s];
    uint64_t h = 1469598103934665603ull ^ s;
    for (const MemoryRegion& r : step.reads) {
      for (size_t b = r.begin; b < r.end; ++b) h = (h ^ m->memory[r.slot * 16 + b]) * 1099511628211ull;
    }
    for (const MemoryRegion& r : step.writes) {
      for (size_t b = r.begin; b < r.end; ++b) m->memory[r.slot * 16 + b] = h + b;
    }
  }
};

TEST(DeviceExecutors, ConcurrentRunsAreBitIdenticalToSerial) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    int num_devices = 2 + trial % 2;
    std::vector<StepAccess> steps = RandomSteps(rng, 40, num_devices, 4);
    Machine serial{&steps, std::vector<uint64_t>(64, 0)};
    for (uint32_t s = 0; s < steps.size(); ++s) Machine::Step(&serial, s);

    Machine concurrent{&steps, std::vector<uint64_t>(64, 0)};
    DeviceExecutors executors;
    executors.Start(DeriveStepSchedule(steps, num_devices), &Machine::Step, &concurrent, {});
    for (int run = 0; run < 50; ++run) {
      std::fill(concurrent.memory.begin(), concurrent.memory.end(), 0);
      concurrent.slow_step.store(static_cast<int>(rng() % steps.size()));
      executors.Run();
      ASSERT_EQ(concurrent.memory, serial.memory) << "trial " << trial << " run " << run;
    }
  }
}

TEST(DeviceExecutors, AFailingStepStopsEveryDeviceAndTheNextRunWorks) {
  // Device 1 waits for device 0's step 2, which fails: the waiter must wake and the run must throw.
  std::vector<StepAccess> steps = {{0, {}, {Slot(0)}}, {1, {}, {Slot(1)}}, {0, {Slot(0)}, {Slot(2)}},
                                   {1, {Slot(2)}, {Slot(3)}}};
  Machine m{&steps, std::vector<uint64_t>(64, 0)};
  m.fail_at = 2;
  DeviceExecutors executors;
  executors.Start(DeriveStepSchedule(steps, 2), &Machine::Step, &m, {ExecutorOptions{}, ExecutorOptions{{}, 1}});
  for (int i = 0; i < 3; ++i) {
    try {
      executors.Run();
      FAIL() << "the run should have thrown";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "step 2 failed");
    }
  }
  m.fail_at = -1;
  std::fill(m.memory.begin(), m.memory.end(), 0);
  executors.Run();  // runs again after failures
  Machine serial{&steps, std::vector<uint64_t>(64, 0)};
  for (uint32_t s = 0; s < steps.size(); ++s) Machine::Step(&serial, s);
  EXPECT_EQ(m.memory, serial.memory);
}

TEST(DeviceExecutors, StopAndRestartNeverHang) {
  std::vector<StepAccess> steps = {{0, {}, {Slot(0)}}, {1, {Slot(0)}, {Slot(1)}}, {2, {Slot(1)}, {Slot(2)}}};
  Machine m{&steps, std::vector<uint64_t>(64, 0)};
  for (int i = 0; i < 20; ++i) {
    DeviceExecutors executors;
    executors.Start(DeriveStepSchedule(steps, 3), &Machine::Step, &m, {});
    if (i % 2) executors.Run();
  }  // destructors stop and join
}

TEST(DeviceExecutors, PinnedPrimaryRunsOnItsOwnThread) {
  std::vector<StepAccess> steps = {{0, {}, {Slot(0)}}, {1, {Slot(0)}, {Slot(1)}}};
  Machine m{&steps, std::vector<uint64_t>(64, 0)};
  DeviceExecutors executors;
  executors.Start(DeriveStepSchedule(steps, 2), &Machine::Step, &m, {ExecutorOptions{{0}, 1}});
  EXPECT_EQ(executors.inline_device(), -1);
  executors.Run();
}

TEST(StepSchedule, SerialScheduleWaitsAtEveryDeviceSwitchOnly) {
  // Devices 0 0 1 1 0 2: steps 2, 4 and 5 follow a step of another device; no memory is shared.
  std::vector<StepAccess> steps = {{0, {}, {Slot(0)}}, {0, {}, {Slot(1)}}, {1, {}, {Slot(2)}},
                                   {1, {}, {Slot(3)}}, {0, {}, {Slot(4)}}, {2, {}, {Slot(5)}}};
  StepSchedule s = SerialStepSchedule(steps, 3);
  EXPECT_EQ(s.device_steps[0], std::vector<uint32_t>({0, 1, 4}));
  EXPECT_EQ(s.device_steps[1], std::vector<uint32_t>({2, 3}));
  std::vector<std::vector<uint32_t>> waits = {{}, {}, {1}, {}, {3}, {4}};
  EXPECT_EQ(s.waits, waits);
  EXPECT_EQ(s.awaited, std::vector<bool>({false, true, false, true, true, false}));
}

/*! \brief Records the order steps run in, how many ran at once, and each step's OpenMP team. */
struct SerialProbe {
  std::vector<uint32_t> order;
  std::vector<int> openmp_threads;
  std::atomic<int> running{0};
  std::atomic<int> most_running{0};

  static void Step(void* self, uint32_t s) {
    auto* p = static_cast<SerialProbe*>(self);
    int now = p->running.fetch_add(1) + 1;
    int seen = p->most_running.load();
    while (now > seen && !p->most_running.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // room for an overlap to show
    p->order.push_back(s);  // one step at a time (checked by most_running), so no race
    p->openmp_threads[s] = support::OpenMPMaxThreads();
    p->running.fetch_sub(1);
  }
};

TEST(DeviceExecutors, SerialScheduleRunsOneStepAtATimeInOrderWithEachDevicesThreads) {
  std::vector<StepAccess> steps;
  for (int device : {0, 1, 1, 0, 1, 0, 0, 1}) steps.push_back({device, {}, {Slot(static_cast<uint32_t>(steps.size()))}});
  SerialProbe probe;
  probe.openmp_threads.assign(steps.size(), -1);
  DeviceExecutors executors;
  // Device 0 runs on the caller; device 1 on its executor with one thread.
  executors.Start(SerialStepSchedule(steps, 2), &SerialProbe::Step, &probe, {ExecutorOptions{}, ExecutorOptions{{}, 1}});
  for (int run = 0; run < 20; ++run) {
    probe.order.clear();
    executors.Run();
    std::vector<uint32_t> expected(steps.size());
    for (uint32_t s = 0; s < steps.size(); ++s) expected[s] = s;
    ASSERT_EQ(probe.order, expected) << "run " << run;
  }
  EXPECT_EQ(probe.most_running.load(), 1);
  if (support::OpenMPMaxThreads() == 0) GTEST_SKIP() << "no OpenMP runtime in this process";
  for (uint32_t s = 0; s < steps.size(); ++s) {
    if (steps[s].device == 1) EXPECT_EQ(probe.openmp_threads[s], 1) << "step " << s;
  }
}

}  // namespace
}  // namespace tvm_hetero
