/*!
 * \file plan/frame_executor.cc
 * \brief What every executor of (plan, frame) shares: one Run, a step of any kind, errors naming the
 *        step, and timed runs for trace and profile.
 */
#include "plan/frame_executor.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "plan/prepared_call.h"
#include "support/device.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;
using Clock = std::chrono::steady_clock;

FrameExecutor::FrameExecutor(const PlanInputs& model, std::shared_ptr<const ExecutionPlan> plan, RunFrame& frame)
    : model_(model), plan_(std::move(plan)), frame_(frame) {
  if (frame_.prepared().calls.size() != plan_->steps.size()) {
    TVM_FFI_THROW(InternalError) << "executor: the frame was prepared for a plan of " << frame_.prepared().calls.size()
                                 << " steps, the executor's plan has " << plan_->steps.size();
  }
  for (const DLDevice& dev : model_.devices) {
    if (support::NeedsDrain(dev)) support::AddUnique(&devices_to_sync_, dev);
  }
  span_start_us_.assign(plan_->steps.size(), -1.0);
  span_end_us_.assign(plan_->steps.size(), -1.0);
}

void FrameExecutor::Run() {
  frame_.remote_compute_calls = 0;
  frame_.remote_copies = 0;
  RunSteps();  // step errors already name their node and device
  try {
    for (const DLDevice& dev : devices_to_sync_) support::SyncDevice(dev);
  } catch (const ffi::Error& err) {
    throw ErrorAt(static_cast<uint32_t>(plan_->steps.size()), err);
  }
}

void FrameExecutor::RunStep(uint32_t i, ffi::Any* rv) {
  const PreparedSteps& prepared = frame_.prepared();
  const PreparedCall& call = prepared.calls[i];
  switch (call.mode) {
    case PreparedCall::Mode::kCall:
    case PreparedCall::Mode::kRemoteCall:
      frame_.remote_compute_calls += call.mode != PreparedCall::Mode::kCall;
      call.function->CallPacked(call.args, call.num_args, rv);
      break;
    case PreparedCall::Mode::kRemoteGroup: {
      ++frame_.remote_compute_calls;
      const GroupCall& group = prepared.groups[call.num_args];
      call.function->CallPacked(group.call_args.data(), static_cast<int32_t>(group.call_args.size()), rv);
      ReceiveGroupOutputs(group, *rv);
      *rv = nullptr;  // kernels that reuse the slot expect it empty, not holding the bytes object
      break;
    }
    case PreparedCall::Mode::kRemoteCopy:
      ++frame_.remote_copies;
      support::CopyAcrossDevices(call.from, call.to, call.staging);
      break;
    case PreparedCall::Mode::kCopy:
      support::CopyAcrossDevices(call.from, call.to, call.staging);
      break;
    case PreparedCall::Mode::kNop:
      break;
  }
}

void FrameExecutor::ReceiveGroupOutputs(const GroupCall& group, const ffi::Any& returned) {
  if (group.outputs.empty()) return;
  std::optional<ffi::Bytes> bytes = returned.try_cast<ffi::Bytes>();
  size_t expected = 0;
  for (const DLTensor* to : group.outputs) expected += ffi::GetDataSize(*to);
  if (!bytes.has_value() || bytes->size() != expected) {
    TVM_FFI_THROW(RuntimeError) << "the remote runner returned " << (bytes ? std::to_string(bytes->size()) : "no")
                                << " bytes for segment " << group.index << " of device " << group.device
                                << ", expected " << expected
                                << " (is the server's libtvm_hetero older than this one?)";
  }
  const char* data = bytes->data();
  for (DLTensor* to : group.outputs) {
    size_t n = ffi::GetDataSize(*to);
    std::memcpy(static_cast<char*>(to->data) + to->byte_offset, data, n);
    data += n;
  }
}

void FrameExecutor::RunStepAlone(uint32_t i, const std::optional<DLDevice>& drain) {
  const bool timing = timing_;
  if (timing) span_start_us_[i] = std::chrono::duration<double, std::micro>(Clock::now() - run_start_).count();
  ffi::Any rv;
  try {
    RunStep(i, &rv);
    if (drain.has_value()) {
      support::SyncDevice(*drain);
    } else if (timing) {
      // The kind's completion hook: a span is the device's work, not its launch.
      support::WaitForCompletion(model_.devices[model_.node_device[plan_->steps[i].node]]);
    }
  } catch (const ffi::Error& err) {
    throw ErrorAt(i, err);
  }
  if (timing) span_end_us_[i] = std::chrono::duration<double, std::micro>(Clock::now() - run_start_).count();
}

ffi::Error FrameExecutor::ErrorAt(uint32_t i, const ffi::Error& err) const {
  std::ostringstream where;
  bool remote = false;  // the failing step talks to another process
  if (i < plan_->steps.size()) {
    const PlanStep& step = plan_->steps[i];
    const int device = model_.node_device[step.node];
    remote = step.remote;
    where << "while running " << (step.kind == PlanStep::Kind::kOffloadGroup ? "the offloaded group starting at " : "")
          << model_.graph->describe_node(step.node) << " on device " << device << " ("
          << support::DeviceName(model_.devices[device]) << "): ";
  } else {
    remote = std::any_of(devices_to_sync_.begin(), devices_to_sync_.end(), support::IsRemote);
    where << "while synchronising devices: ";
  }
  std::string message = err.message();
  // Errors raised in the remote process come back as RPCError; any other error of a remote step
  // comes from the transport itself.
  if (remote && err.kind() != "RPCError") {
    message = "the connection to the remote device was lost (server gone or connection closed): " + message;
  }
  return ffi::Error(err.kind(), where.str() + message, err.backtrace());
}

std::vector<StepSpans> FrameExecutor::TimedRuns(int runs) {
  std::vector<StepSpans> spans;
  timing_ = true;
  try {
    for (int r = 0; r < std::max(runs, 1); ++r) {
      std::fill(span_start_us_.begin(), span_start_us_.end(), -1.0);
      std::fill(span_end_us_.begin(), span_end_us_.end(), -1.0);
      run_start_ = Clock::now();
      Run();
      StepSpans run;
      for (size_t i = 0; i < span_start_us_.size(); ++i) run.emplace_back(span_start_us_[i], span_end_us_[i]);
      spans.push_back(std::move(run));
    }
  } catch (...) {
    timing_ = false;
    throw;
  }
  timing_ = false;
  return spans;
}

}  // namespace tvm_hetero
