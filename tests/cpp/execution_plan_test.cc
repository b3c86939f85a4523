/*!
 * \file execution_plan_test.cc
 * \brief The plan passes alone on hand-made graphs (no memory is allocated: a remote device needs
 *        no session here), the executors alone over a hand-made (plan, frame), and frames of one
 *        runtime running on several threads at once.
 */
#include <gtest/gtest.h>

#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm_hetero/device_assignment.h>
#include <tvm_hetero/graph_runtime.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "plan/execution_plan.h"
#include "plan/execution_schedule.h"
#include "plan/frame_executor.h"
#include "support/device_kinds.h"
#include "test_graphs.h"
#include "test_kernels.h"

namespace tvm_hetero {
namespace {

namespace ffi = tvm::ffi;
using testing::SimplexJSON;

using testing::TestKernels;  // without a log: stateless, safe on any thread

const DLDevice kCpu0{kDLCPU, 0}, kCpu1{kDLCPU, 1}, kCpu2{kDLCPU, 2};
const DLDevice kRemoteCpu{static_cast<DLDeviceType>(kDLCPU + support::kRPCSessMask), 0};

/*! \brief A graph with the plan's inputs: the graph, its devices, storage and kernels. */
struct HandMade {
  HandMade(const std::string& json, std::vector<DLDevice> devices) {
    graph = ParseGraphJSON(json);
    in.devices = std::move(devices);
    in.node_device = AssignDevices(graph, in.devices, DeviceIndexKind::kPosition);
    storage = PlanStorage(graph, in.node_device);
    in.graph = &graph;
    in.storage = &storage;
    in.lib = ffi::Module(ffi::make_object<TestKernels>());
  }
  Graph graph;
  StoragePlan storage;
  PlanInputs in;
};

TEST(ExecutionPlan, BuildPlanHasOneStepPerOperatorNodeReadingAndWritingItsEntries) {
  HandMade g(SimplexJSON(), {kCpu0, kCpu1});
  ExecutionPlan plan = BuildPlan(g.in);
  ASSERT_EQ(plan.steps.size(), 3u);
  EXPECT_EQ(plan.steps[0].kind, PlanStep::Kind::kKernel);
  EXPECT_EQ(plan.steps[1].kind, PlanStep::Kind::kCopy);
  EXPECT_EQ(plan.steps[2].kind, PlanStep::Kind::kKernel);
  EXPECT_EQ(plan.steps[0].args, (std::vector<uint32_t>{0, 1, 3}));  // A + B -> add's entry
  EXPECT_EQ(plan.steps[0].device, 1);
  EXPECT_EQ(plan.steps[2].writes.size(), 1u);
  EXPECT_EQ(plan.bytes_copied_per_run, 16);
  EXPECT_EQ(plan.tensors.size(), g.graph.num_entries());
}

TEST(ExecutionPlan, AKernelReadingASharedMemoryDeviceGetsAViewAndNoCopy) {
  // sub on cpu:0 reads C, which lives on cpu:2: same bytes, another device.
  HandMade g(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 2, 1, 0, 0]"), {kCpu0, kCpu1, kCpu2});
  ExecutionPlan before = BuildPlan(g.in);
  ExecutionPlan plan = InsertDeviceCrossings(before, g.in);
  ASSERT_EQ(plan.steps.size(), 3u);
  EXPECT_EQ(plan.num_shared_views, 1);
  EXPECT_TRUE(plan.copy_buffers.empty());
  const uint32_t view = plan.steps[2].args[1];
  EXPECT_EQ(plan.tensors[view].source, PlanTensor::Source::kSharedView);
  EXPECT_EQ(plan.tensors[view].entry, 2u);
  EXPECT_EQ(plan.tensors[view].device, 0);
  EXPECT_EQ(plan.groups.size(), 2u);  // add on 1, then copy + sub on 0
  EXPECT_EQ(before.steps[2].args[1], 2u);  // the pass returned a new plan; its input is unchanged
}

TEST(ExecutionPlan, AKernelReadingAnotherProcessGetsOneCopyBeforeItsFirstReader) {
  // C on a remote device, read by sub on cpu:0: no shared memory, so an implicit copy.
  HandMade g(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 2, 1, 0, 0]"), {kCpu0, kCpu1, kRemoteCpu});
  ExecutionPlan plan = InsertDeviceCrossings(BuildPlan(g.in), g.in);
  ASSERT_EQ(plan.steps.size(), 4u);
  ASSERT_EQ(plan.copy_buffers.size(), 1u);
  const PlanStep& copy = plan.steps[2];
  EXPECT_EQ(copy.kind, PlanStep::Kind::kCopy);
  EXPECT_TRUE(copy.remote);
  EXPECT_EQ(copy.device, 2);  // one thread per RPC session: the remote device's executor runs it
  EXPECT_EQ(copy.args, (std::vector<uint32_t>{2, plan.copy_buffers[0]}));
  const PlanStep& sub = plan.steps[3];
  EXPECT_EQ(sub.args[1], plan.copy_buffers[0]);
  // The reader reads the buffer's slot, numbered after the pool's, which the copy writes.
  EXPECT_EQ(sub.reads[1].slot, plan.num_pool_slots);
  EXPECT_EQ(copy.writes[0].slot, plan.num_pool_slots);
  EXPECT_EQ(plan.bytes_copied_per_run, 32);
  EXPECT_EQ(EntryNumber(plan, plan.copy_buffers[0]), static_cast<int64_t>(g.graph.num_entries()));
}

TEST(ExecutionPlan, RemoteKernelsFormASegmentThatAttachingTurnsIntoOneGroupStep) {
  // add on the remote device (A, B there too), copied back to cpu:0 by the graph's __copy, then sub.
  HandMade g(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 0, 1, 0, 0]"), {kCpu0, kRemoteCpu});
  ExecutionPlan plan = FormOffloadSegments(InsertDeviceCrossings(BuildPlan(g.in), g.in), g.in.devices);
  ASSERT_EQ(plan.segments.size(), 1u);
  EXPECT_EQ(plan.segments[0].begin, 0u);
  EXPECT_EQ(plan.segments[0].end, 1u);
  EXPECT_EQ(plan.segments[0].outputs, (std::vector<uint32_t>{1}));  // the copy back rides along
  ffi::Function runner = ffi::Function::FromTyped([](int64_t) {});
  ExecutionPlan attached = AttachOffloadRunner(plan, 1, runner);
  ASSERT_EQ(attached.steps.size(), 2u);  // the group (add + copy back), then sub
  EXPECT_EQ(attached.steps[0].kind, PlanStep::Kind::kOffloadGroup);
  EXPECT_EQ(attached.steps[1].kind, PlanStep::Kind::kKernel);
  const OffloadSegment& segment = attached.segments[0];
  EXPECT_EQ(segment.sub_steps.size(), 2u);
  EXPECT_EQ(segment.num_body_steps, 1u);
  // The group step touches what its sub-steps touch: the scheduler orders it like them.
  EXPECT_EQ(attached.steps[0].writes.size(), 2u);
  EXPECT_NE(attached.ToString(g.graph).find("group"), std::string::npos);
  EXPECT_THROW(AttachOffloadRunner(plan, 0, runner), ffi::Error);  // cpu:0 has no segments
}

TEST(ExecutionPlan, PrintsOneLinePerStepWithKindNodeAndDevice) {
  HandMade g(SimplexJSON(), {kCpu0, kCpu1});
  std::string text = InsertDeviceCrossings(BuildPlan(g.in), g.in).ToString(g.graph);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3);
  EXPECT_NE(text.find("0: kernel node 3 'add' on device 1"), std::string::npos) << text;
  EXPECT_NE(text.find("1: copy"), std::string::npos) << text;
}

void SetFloats(RunFrame& frame, int index, const std::vector<float>& values) {
  int64_t shape[1] = {4};
  DLTensor t{const_cast<float*>(values.data()), kCpu0, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  frame.SetInput(index, &t);
}

std::vector<float> Floats(RunFrame& frame) {
  std::vector<float> values(4);
  int64_t shape[1] = {4};
  DLTensor t{values.data(), kCpu0, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  frame.CopyOutputTo(0, &t);
  return values;
}

/*! \brief A frame of `g`'s plan (crossings inserted) with inputs A, B, C set. */
std::unique_ptr<RunFrame> FrameWithInputs(const HandMade& g, std::shared_ptr<const ExecutionPlan> plan) {
  auto frame = std::make_unique<RunFrame>(g.in, std::move(plan), FrameSharing());
  SetFloats(*frame, 0, {1, 2, 3, 4});
  SetFloats(*frame, 1, {10, 20, 30, 40});
  SetFloats(*frame, 2, {1, 1, 1, 1});
  return frame;
}

TEST(FrameExecutors, SerialAndConcurrentExecutorsOfOneFrameGiveTheSerialResult) {
  // add on cpu:1, sub on cpu:0 reading C on cpu:2: three devices, one frame, either executor.
  HandMade g(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 2, 1, 0, 0]"), {kCpu0, kCpu1, kCpu2});
  auto plan = std::make_shared<const ExecutionPlan>(InsertDeviceCrossings(BuildPlan(g.in), g.in));
  auto schedule = std::make_shared<const ExecutionSchedule>(
      ScheduleFor(*plan, g.in.devices, ExecutionMode::kConcurrent, {}));
  ASSERT_TRUE(schedule->use_executors);
  std::unique_ptr<RunFrame> frame = FrameWithInputs(g, plan);
  const std::vector<float> expected{10, 21, 32, 43};
  frame->UseExecutor(std::make_unique<SerialExecutor>(g.in, plan, *frame));
  frame->Run();
  EXPECT_EQ(Floats(*frame), expected);
  frame->UseExecutor(std::make_unique<ConcurrentExecutor>(g.in, plan, *frame, schedule));
  for (int run = 0; run < 50; ++run) {
    SetFloats(*frame, 0, {float(run), 2, 3, 4});
    frame->Run();
    EXPECT_EQ(Floats(*frame), (std::vector<float>{float(run) + 10 - 1, 21, 32, 43})) << "run " << run;
  }
}

TEST(FrameExecutors, AFailingStepIsNamedWithItsNodeAndDeviceAndLeavesTheFrameFree) {
  // Without InsertDeviceCrossings, sub on cpu:0 gets C's tensor on cpu:2: the test kernel refuses.
  HandMade g(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 2, 1, 0, 0]"), {kCpu0, kCpu1, kCpu2});
  auto plan = std::make_shared<const ExecutionPlan>(BuildPlan(g.in));
  std::unique_ptr<RunFrame> frame = FrameWithInputs(g, plan);
  frame->UseExecutor(std::make_unique<SerialExecutor>(g.in, plan, *frame));
  // Twice: the failed run released the frame (the second fails the same way, not as "busy").
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      frame->Run();
      ADD_FAILURE() << "no error";
    } catch (const ffi::Error& err) {
      EXPECT_NE(err.message().find("'sub'"), std::string::npos) << err.message();
      EXPECT_NE(err.message().find("on device 0 (cpu:0): arguments on different devices"), std::string::npos)
          << err.message();
    }
  }
}

TEST(FrameExecutors, TimedRunsGiveEveryStepASpanInsideItsRun) {
  HandMade g(SimplexJSON(), {kCpu0, kCpu1});
  auto plan = std::make_shared<const ExecutionPlan>(InsertDeviceCrossings(BuildPlan(g.in), g.in));
  std::unique_ptr<RunFrame> frame = FrameWithInputs(g, plan);
  SerialExecutor serial(g.in, plan, *frame);
  std::vector<StepSpans> runs = serial.TimedRuns(3);
  ASSERT_EQ(runs.size(), 3u);
  for (const StepSpans& run : runs) {
    ASSERT_EQ(run.size(), plan->steps.size());
    double previous_end = 0;
    for (const auto& [start, end] : run) {
      EXPECT_GE(start, previous_end);  // serial: one step after another
      EXPECT_GE(end, start);
      previous_end = end;
    }
  }
  EXPECT_EQ(Floats(*frame), (std::vector<float>{10, 21, 32, 43}));
}

TEST(GraphRuntimeFrames, ConcurrentFramesOfOneModelMatchSerialOnEveryInference) {
  // Three devices (each frame runs its own executors: add on cpu:1, sub on cpu:2 reading cpu:0's
  // copy); four threads, each with its own frame, 200 inferences each, against serial.
  GraphRuntime rt;
  rt.Init(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 2, 1, 0, 2]"), ffi::Module(ffi::make_object<TestKernels>()),
          {kCpu0, kCpu1, kCpu2});
  constexpr int kThreads = 4, kInferences = 200;
  auto values = [](int i, int input) {
    std::mt19937 rng(i * 3 + input);
    std::uniform_real_distribution<float> value(-100.0f, 100.0f);
    return std::vector<float>{value(rng), value(rng), value(rng), value(rng)};
  };
  std::vector<std::vector<float>> expected;
  for (int i = 0; i < kThreads * kInferences; ++i) {
    for (int input = 0; input < 3; ++input) SetFloats(rt.default_frame(), input, values(i, input));
    rt.Run();
    expected.push_back(Floats(rt.default_frame()));
  }
  std::atomic<int> mismatches{0}, ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<RunFrame> frame = rt.Frame();
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int k = 0; k < kInferences; ++k) {
        const int i = t * kInferences + k;
        for (int input = 0; input < 3; ++input) SetFloats(*frame, input, values(i, input));
        frame->Run();
        mismatches += Floats(*frame) != expected[i];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(GraphRuntimeFrames, AFrameSharesParametersAndRefusesToWriteThem) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), ffi::Module(ffi::make_object<TestKernels>()), {kCpu0, kCpu1});
  std::vector<float> c{1, 1, 1, 1};
  int64_t shape[1] = {4};
  DLTensor t{c.data(), kCpu0, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  rt.SetParam(rt.GetInputIndex("C"), &t);
  std::unique_ptr<RunFrame> frame = rt.Frame();
  EXPECT_EQ(frame->GetInput(2).data_ptr(), rt.GetInput(2).data_ptr());
  EXPECT_THROW(SetFloats(*frame, 2, c), ffi::Error);
  SetFloats(*frame, 0, {1, 2, 3, 4});
  SetFloats(*frame, 1, {10, 20, 30, 40});
  frame->Run();
  EXPECT_EQ(Floats(*frame), (std::vector<float>{10, 21, 32, 43}));
  EXPECT_THROW(rt.Run(), ffi::Error);  // the runtime's own frame never had A and B set
}

/*! \brief A tensor over memory the test owns (or none: checks fail before data is touched). */
struct Borrowed {
  void* data;
  void AllocData(DLTensor* t) { t->data = data; }
  void FreeData(DLTensor*) {}
};

ffi::Tensor BorrowedFloats(void* data, DLDevice device, int64_t length = 4) {
  return ffi::Tensor::FromNDAlloc(Borrowed{data}, ffi::Shape({length}), DLDataType{kDLFloat, 32, 1}, device);
}

TEST(GraphRuntimeFrames, BoundInputsAndOutputsAreUsedInPlaceAndCheckedNamingTheInput) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), ffi::Module(ffi::make_object<TestKernels>()), {kCpu0, kCpu1});
  std::unique_ptr<RunFrame> frame = rt.Frame();
  alignas(64) float a[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
  alignas(64) float unaligned[5] = {0, 0, 0, 0, 0};
  auto expect_error = [](auto call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one containing: " << text;
    } catch (const ffi::Error& err) {
      EXPECT_NE(err.message().find(text), std::string::npos) << err.message();
    }
  };
  expect_error([&] { frame->BindInput(0, BorrowedFloats(a, DLDevice{kDLCUDA, 0})); },
               "input 'A': bound without a copy, it must be on cpu:1");
  expect_error([&] { frame->BindInput(0, BorrowedFloats(unaligned + 1, kCpu1)); },
               "input 'A': bound without a copy, its data must be 64-byte aligned");
  expect_error([&] { frame->BindInput(0, BorrowedFloats(a, kCpu1, 3)); }, "input 'A': expected shape (4,)");
  frame->BindInput(0, BorrowedFloats(a, kCpu0));  // cpu:0 shares cpu:1's memory: accepted
  frame->BindOutput(0, BorrowedFloats(out, kCpu0));
  SetFloats(*frame, 1, {10, 20, 30, 40});
  SetFloats(*frame, 2, {1, 1, 1, 1});
  frame->Run();
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{10, 21, 32, 43}));
  a[0] = 101;  // the frame reads the caller's memory on every run
  frame->Run();
  EXPECT_EQ(out[0], 110);
  EXPECT_EQ(frame->GetOutput(0).data_ptr(), static_cast<void*>(out));
  EXPECT_EQ(frame->io_bytes_copied(), 32);  // B and C were copied; A and the output were not
}

TEST(GraphRuntimeFrames, AnInputPassedThroughAsAnOutputReadsTheBoundMemory) {
  // Outputs: sub's, then input A itself. Bound, A's output is the caller's tensor, not stale bytes.
  std::string json = SimplexJSON();
  json.replace(json.find(R"("heads": [[5, 0, 0]])"), 20, R"("heads": [[5, 0, 0], [0, 0, 0]])");
  GraphRuntime rt;
  rt.Init(json, ffi::Module(ffi::make_object<TestKernels>()), {kCpu0, kCpu1});
  std::unique_ptr<RunFrame> frame = rt.Frame();
  EXPECT_FALSE(frame->OutputBindable(1));  // no step writes it
  EXPECT_TRUE(frame->OutputBindable(0));
  alignas(64) float a[4] = {7, 8, 9, 10};
  frame->BindInput(0, BorrowedFloats(a, kCpu1));
  EXPECT_EQ(frame->GetOutput(1).data_ptr(), static_cast<void*>(a));
}

}  // namespace
}  // namespace tvm_hetero
