/*!
 * \file plan/step_execution.cc
 * \brief The executors of (plan, frame): the serial loop on the caller, or one submit to the frame's
 *        device executors; trace and profile time these same steps (TimedRuns), never another
 *        program. Nothing here allocates, looks anything up, logs or holds a lock across a kernel.
 */
#include <tvm_hetero/graph_runtime.h>
#include <tvm_hetero/run_frame.h>

#include <cstring>
#include <sstream>

#include "concurrency/device_executors.h"
#include "plan/execution_plan.h"
#include "plan/execution_schedule.h"
#include "plan/prepared_call.h"
#include "plan/run_frame_use.h"
#include "support/device.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;

void RunFrame::RunOnce() {
  remote_compute_calls = 0;
  remote_copies = 0;
  if (executors_->started()) {
    executors_->Run();  // step errors already name their node and device
  } else {
    RunSerial();
  }
  try {
    for (const DLDevice& dev : devices_to_sync_) support::SyncDevice(dev);
  } catch (const ffi::Error& err) {
    throw ErrorAt(static_cast<uint32_t>(calls_.size()), err);
  }
}

void RunFrame::RunSerial() {
  ffi::Any rv;     // kernels return nothing; one slot serves every call
  uint32_t i = 0;  // the step in flight, named in the error if it fails
  const PreparedCall* calls = calls_.data();
  const uint32_t num_steps = static_cast<uint32_t>(calls_.size());
  if (tracing_) {
    for (i = 0; i < num_steps; ++i) RunStepOnExecutor(this, i);  // names the step itself
    return;
  }
  try {
    for (i = 0; i < num_steps; ++i) {
      const PreparedCall& call = calls[i];
      if (call.mode == PreparedCall::Mode::kCall) {
        call.function->CallPacked(call.args, call.num_args, &rv);
      } else {
        RunOtherStep(i, &rv);
      }
    }
  } catch (const ffi::Error& err) {
    throw ErrorAt(i, err);
  }
}

void RunFrame::RunOtherStep(uint32_t index, ffi::Any* rv) {
  const PreparedCall& call = calls_[index];
  switch (call.mode) {
    case PreparedCall::Mode::kCall:
    case PreparedCall::Mode::kRemoteCall:
      remote_compute_calls += call.mode != PreparedCall::Mode::kCall;
      call.function->CallPacked(call.args, call.num_args, rv);
      break;
    case PreparedCall::Mode::kRemoteGroup: {
      ++remote_compute_calls;
      const GroupCall& group = group_calls_[call.num_args];
      call.function->CallPacked(group.call_args.data(), static_cast<int32_t>(group.call_args.size()), rv);
      ReceiveGroupOutputs(group, *rv);
      *rv = nullptr;  // kernels that reuse the slot expect it empty, not holding the bytes object
      break;
    }
    case PreparedCall::Mode::kRemoteCopy:
      ++remote_copies;
      support::CopyAcrossDevices(call.from, call.to, call.staging);
      break;
    case PreparedCall::Mode::kCopy:
      support::CopyAcrossDevices(call.from, call.to, call.staging);
      break;
    case PreparedCall::Mode::kNop:
      break;
  }
}

void RunFrame::ReceiveGroupOutputs(const GroupCall& group, const ffi::Any& returned) const {
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

void RunFrame::RunStepOnExecutor(void* self, uint32_t i) {
  auto* frame = static_cast<RunFrame*>(self);
  using Clock = std::chrono::steady_clock;
  const bool tracing = frame->tracing_;
  if (tracing) frame->span_start_us_[i] = std::chrono::duration<double, std::micro>(Clock::now() - frame->run_start_).count();
  ffi::Any rv;
  try {
    const PreparedCall& call = frame->calls_[i];
    if (call.mode == PreparedCall::Mode::kCall) {
      call.function->CallPacked(call.args, call.num_args, &rv);
    } else {
      frame->RunOtherStep(i, &rv);
    }
    const ExecutionSchedule& schedule = *frame->schedule_;
    if (!schedule.sync_before_publish.empty() && schedule.sync_before_publish[i].has_value()) {
      support::SyncDevice(*schedule.sync_before_publish[i]);
    } else if (tracing) {
      // The kind's completion hook: a span is the device's work, not its launch.
      const GraphRuntime& rt = *frame->runtime_;
      support::WaitForCompletion(rt.devices_[rt.node_device_[frame->plan_->steps[i].node]]);
    }
  } catch (const ffi::Error& err) {
    throw frame->ErrorAt(i, err);
  }
  if (tracing) frame->span_end_us_[i] = std::chrono::duration<double, std::micro>(Clock::now() - frame->run_start_).count();
}

ffi::Error RunFrame::ErrorAt(uint32_t i, const ffi::Error& err) const {
  const GraphRuntime& rt = *runtime_;
  std::ostringstream where;
  bool remote = false;  // the failing step talks to another process
  if (i < plan_->steps.size()) {
    const PlanStep& step = plan_->steps[i];
    const int device = rt.node_device_[step.node];
    remote = step.remote;
    where << "while running " << (step.kind == PlanStep::Kind::kOffloadGroup ? "the offloaded group starting at " : "")
          << rt.graph_.describe_node(step.node) << " on device " << device << " ("
          << support::DeviceName(rt.devices_[device]) << "): ";
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

std::vector<std::vector<std::pair<double, double>>> RunFrame::TimedRuns(int runs, bool serial) {
  using Clock = std::chrono::steady_clock;
  if (num_inputs_unset_ != 0) ThrowUnsetInputs();
  std::vector<std::vector<std::pair<double, double>>> spans;
  tracing_ = true;
  try {
    for (int r = 0; r < std::max(runs, 1); ++r) {
      std::fill(span_start_us_.begin(), span_start_us_.end(), -1.0);
      std::fill(span_end_us_.begin(), span_end_us_.end(), -1.0);
      run_start_ = Clock::now();
      if (serial) {
        // Every step on the caller, one after another, each waited for: per-step times that add up.
        remote_compute_calls = 0;
        remote_copies = 0;
        RunSerial();
      } else {
        RunOnce();
      }
      std::vector<std::pair<double, double>> run;
      for (size_t i = 0; i < calls_.size(); ++i) run.emplace_back(span_start_us_[i], span_end_us_[i]);
      spans.push_back(std::move(run));
    }
  } catch (...) {
    tracing_ = false;
    throw;
  }
  tracing_ = false;
  return spans;
}

}  // namespace tvm_hetero
