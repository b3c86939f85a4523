/*!
 * \file plan/prepared_call.h
 * \brief What a frame's hot loop touches per step, packed densely: the function and its packed
 *        arguments, or the tensors of a copy; and, per offloaded group, its packed call. A frame
 *        owns its PreparedSteps (pointing into its memory); executors only read them.
 */
#ifndef TVM_HETERO_PLAN_PREPARED_CALL_H_
#define TVM_HETERO_PLAN_PREPARED_CALL_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <vector>

namespace tvm_hetero {

/*! \brief One step of a frame, ready to run. */
struct PreparedCall {
  enum class Mode : uint8_t {
    /*! \brief Call `function(args...)`: a local kernel (the hot path). */
    kCall,
    /*! \brief Call `function(args...)` in another process: one remote kernel. */
    kRemoteCall,
    /*! \brief Call a remote runner's `run_segment(index, bytes...)`: a whole offloaded group. */
    kRemoteGroup,
    /*! \brief Copy `from` -> `to` (through `staging` when set). */
    kCopy,
    /*! \brief A copy to or from another process. */
    kRemoteCopy,
    /*! \brief Nothing to do (a `__nop`). */
    kNop,
  };
  /*! \brief Function to call (kCall, kRemoteCall, kRemoteGroup). */
  const tvm::ffi::FunctionObj* function = nullptr;
  /*! \brief Packed arguments (owned by the frame). */
  const tvm::ffi::AnyView* args = nullptr;
  /*! \brief Number of packed arguments; kRemoteGroup: the frame's group call index instead. */
  int32_t num_args = 0;
  Mode mode = Mode::kNop;
  /*! \brief Copy source, destination and staging buffer (kCopy, kRemoteCopy). */
  DLTensor* from = nullptr;
  DLTensor* to = nullptr;
  DLTensor* staging = nullptr;
};

/*! \brief A frame's call of one offloaded group: index and input bytes, and where results go. */
struct GroupCall {
  /*! \brief Device and index of the segment (for errors). */
  int device = 0;
  int64_t index = 0;
  /*! \brief The inputs' host bytes, pointed at by `call_args`. */
  std::vector<TVMFFIByteArray> input_bytes;
  /*! \brief Packed call: the index, then one byte array per input. */
  std::vector<tvm::ffi::AnyView> call_args;
  /*! \brief Host tensors the returned bytes are written to, in order. */
  std::vector<DLTensor*> outputs;
};

/*! \brief Every step of one frame, ready to run, and what the calls point into. */
struct PreparedSteps {
  /*! \brief One per plan step: what an executor calls. */
  std::vector<PreparedCall> calls;
  /*! \brief Per attached offload segment: its packed call and the tensors its results go to. */
  std::vector<GroupCall> groups;
  /*! \brief Every kernel step's packed arguments, back to back (calls point into it). */
  std::vector<tvm::ffi::AnyView> args;
  /*! \brief Host staging buffer of each staged copy step (else undefined). */
  std::vector<tvm::ffi::Tensor> staging;
  /*! \brief Bytes of the staging buffers. */
  int64_t staging_bytes = 0;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_PLAN_PREPARED_CALL_H_
