/*!
 * \file plan/serial_executor.cc
 * \brief SerialExecutor: the frame's steps on the calling thread, one after another -- the flat loop
 *        over prepared calls that the dispatch benchmark measures.
 */
#include "plan/frame_executor.h"
#include "plan/prepared_call.h"

namespace tvm_hetero {

namespace ffi = tvm::ffi;

void SerialExecutor::RunSteps() {
  const PreparedSteps& prepared = frame_.prepared();
  const PreparedCall* calls = prepared.calls.data();
  const uint32_t num_steps = static_cast<uint32_t>(prepared.calls.size());
  if (timing_) {
    // Every step waited for: per-step times that add up.
    for (uint32_t i = 0; i < num_steps; ++i) RunStepAlone(i, std::nullopt);  // names the step itself
    return;
  }
  ffi::Any rv;     // kernels return nothing; one slot serves every call
  uint32_t i = 0;  // the step in flight, named in the error if it fails
  try {
    for (i = 0; i < num_steps; ++i) {
      const PreparedCall& call = calls[i];
      if (call.mode == PreparedCall::Mode::kCall) {
        call.function->CallPacked(call.args, call.num_args, &rv);
      } else {
        RunStep(i, &rv);
      }
    }
  } catch (const ffi::Error& err) {
    throw ErrorAt(i, err);
  }
}

}  // namespace tvm_hetero
