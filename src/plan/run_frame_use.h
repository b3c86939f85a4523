/*!
 * \file plan/run_frame_use.h
 * \brief One call at a time per frame: a second raises instead of corrupting the frame's buffers
 *        (a flag, not a lock, so nothing is held or waited on across kernels).
 */
#ifndef TVM_HETERO_PLAN_RUN_FRAME_USE_H_
#define TVM_HETERO_PLAN_RUN_FRAME_USE_H_

#include <tvm/ffi/error.h>
#include <tvm_hetero/run_frame.h>

namespace tvm_hetero {

class RunFrame::ExclusiveUse {
 public:
  ExclusiveUse(const RunFrame* frame, const char* call) : frame_(const_cast<RunFrame*>(frame)) {
    if (frame_->in_use_.exchange(true, std::memory_order_acquire)) {
      TVM_FFI_THROW(RuntimeError) << "runtime is busy: " << call
                                  << " was called while another call (run, set_input, set_params, load_params, "
                                     "get_output into a tensor, profile) is in progress on this runtime (or frame); "
                                     "give each thread its own frame (rt.frame()): frames share the weights";
    }
  }
  ~ExclusiveUse() { frame_->in_use_.store(false, std::memory_order_release); }
  ExclusiveUse(const ExclusiveUse&) = delete;
  ExclusiveUse& operator=(const ExclusiveUse&) = delete;

 private:
  RunFrame* frame_;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_PLAN_RUN_FRAME_USE_H_
