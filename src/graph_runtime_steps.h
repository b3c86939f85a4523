/*!
 * \file graph_runtime_steps.h
 * \brief The graph runtime's prepared steps (private to the library): one OpExec per step in node
 *        order, a dense PreparedCall per step for Run's flat loop, and the offload segments that
 *        replace runs of remote kernel steps by one call.
 */
#ifndef TVM_HETERO_GRAPH_RUNTIME_STEPS_H_
#define TVM_HETERO_GRAPH_RUNTIME_STEPS_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <tvm_hetero/graph_runtime.h>

#include <cstdint>
#include <vector>

namespace tvm_hetero {

/*! \brief One prepared step of Run(). */
struct OpExec {
  enum class Kind { kKernel, kCopy, kNop };
  /*! \brief What the step does. */
  Kind kind = Kind::kNop;
  /*! \brief Node this step executes. */
  uint32_t node_id = 0;
  /*! \brief Kernel (kKernel only). */
  tvm::ffi::Function kernel;
  /*! \brief Packed kernel arguments: input then output DLTensors (kKernel only). */
  std::vector<tvm::ffi::AnyView> args;
  /*! \brief Source and destination (kCopy only). */
  DLTensor* copy_from = nullptr;
  DLTensor* copy_to = nullptr;
  /*! \brief Host buffer for copies that no single device API can do (kCopy only, else empty). */
  tvm::ffi::Tensor staging;
};

/*! \brief The hot-loop view of an OpExec: only what Run() touches, packed densely. */
struct PreparedCall {
  enum class Mode : uint8_t {
    /*! \brief Call `function(args...)`: a local kernel (the hot path). */
    kCall,
    /*! \brief Call `function(args...)` in another process: one remote kernel. */
    kRemoteCall,
    /*! \brief Call a remote runner's `run_segment(index)`: a whole offloaded segment. */
    kRemoteGroup,
    /*! \brief A copy or nop: run the OpExec. */
    kStep,
    /*! \brief A copy to or from another process. */
    kRemoteStep,
    /*! \brief Part of an offloaded segment already run by the segment's first call. */
    kSkip,
  };
  /*! \brief Function to call (kCall, kRemoteCall, kRemoteGroup). */
  const tvm::ffi::FunctionObj* function = nullptr;
  /*! \brief Packed arguments (owned by the OpExec or the offload segment). */
  const tvm::ffi::AnyView* args = nullptr;
  /*! \brief Number of packed arguments. */
  int32_t num_args = 0;
  /*! \brief What Run() does for this step (last, so the struct packs into 24 bytes). */
  Mode mode = Mode::kStep;
};

/*!
 * \brief A run of steps on one offload device executed by one remote call: its kernels, the host
 *        tensors they read (sent with the call) and the host tensors that read its results (returned
 *        by the call), so a segment costs one round trip, data included (graph_runtime_offload.cc).
 */
struct OffloadSegment {
  /*! \brief Device position. */
  int device = 0;
  /*! \brief Steps [begin, end) of RuntimeSteps::op_execs: kernels on the device and, among them,
   *         the host-to-device copies listed in `inputs`. The call runs at `begin`. */
  uint32_t begin = 0, end = 0;
  /*! \brief Steps (host-to-device copies) whose data travels in the call, applied before the
   *         kernels, in this order. */
  std::vector<uint32_t> inputs;
  /*! \brief Steps (device-to-host copies, at or after `end`) whose data the call returns, written
   *         after it, in this order. */
  std::vector<uint32_t> outputs;
  /*! \brief The segment's index among its device's segments (the runner's numbering). */
  int64_t index = 0;
  /*! \brief The remote runner's `run_segment`, once attached. */
  tvm::ffi::Optional<tvm::ffi::Function> runner;
  /*! \brief The inputs' host bytes, pointed at by `call_args` (built with the prepared calls). */
  std::vector<TVMFFIByteArray> input_bytes;
  /*! \brief Packed call: the index, then one byte array per input. */
  std::vector<tvm::ffi::AnyView> call_args;
};

/*! \brief Everything Init prepares for Run, owned by the runtime. */
struct RuntimeSteps {
  /*! \brief Prepared steps in node order (null nodes have none), then implicit copies' places. */
  std::vector<OpExec> op_execs;
  /*! \brief One per step, parallel to op_execs. */
  std::vector<PreparedCall> calls;
  /*! \brief Kernel runs on devices of another process (RPC), in step order. */
  std::vector<OffloadSegment> segments;
  /*! \brief Per step: the segment whose call runs there once a runner is attached, or -1. */
  std::vector<int32_t> segment_at;
};

/*! \brief One call at a time per runtime: a second raises instead of corrupting shared buffers
 *         (a flag, not a lock, so nothing is held or waited on across kernels). */
class GraphRuntime::ExclusiveUse {
 public:
  ExclusiveUse(const GraphRuntime* rt, const char* call) : rt_(const_cast<GraphRuntime*>(rt)) {
    if (rt_->in_use_.exchange(true, std::memory_order_acquire)) {
      TVM_FFI_THROW(RuntimeError) << "runtime is busy: " << call
                                  << " was called while another call (run, set_input, set_params, load_params, "
                                     "get_output into a tensor, profile) is in progress on this runtime; use one "
                                     "runtime per thread (share_params lets them share weights)";
    }
  }
  ~ExclusiveUse() { rt_->in_use_.store(false, std::memory_order_release); }
  ExclusiveUse(const ExclusiveUse&) = delete;
  ExclusiveUse& operator=(const ExclusiveUse&) = delete;

 private:
  GraphRuntime* rt_;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_GRAPH_RUNTIME_STEPS_H_
