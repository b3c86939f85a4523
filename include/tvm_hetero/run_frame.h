/*!
 * \file tvm_hetero/run_frame.h
 * \brief A frame: the per-run state of one compiled model -- storage pools, tensor views, prepared
 *        arguments, bound inputs and outputs. Frames of one runtime share its
 *        plan (src/plan/execution_plan.h) and its parameters, so several threads, each with its own
 *        frame, run one model at once with the weights held once. A frame knows nothing of how its
 *        steps are run: Run goes through the executor its runtime chose (src/plan/frame_executor.h).
 *
 * Rules: one call at a time per frame (a second raises "frame is busy"); frames run concurrently
 * with each other. Parameters live in the runtime's default frame and are shared: write them
 * (GraphRuntime::SetParams, LoadParams) while no frame runs. A frame must not outlive its runtime.
 */
#ifndef TVM_HETERO_RUN_FRAME_H_
#define TVM_HETERO_RUN_FRAME_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tvm_hetero {

class FrameExecutor;
class RunFrame;
struct ExecutionPlan;
struct PlanInputs;
struct PreparedSteps;

/*! \brief How GraphRuntime::Frame makes a frame (the defaults suit one frame per thread). */
struct FrameOptions {
  /*! \brief Inputs read from the default frame's memory even if not set yet (a pipeline stage's
   *         declared parameters, loaded later); Run refuses while the default frame lacks any
   *         parameter. Parameters already set are shared anyway. */
  std::vector<int> shared_inputs;
  /*! \brief Use the plan's kernel call sites instead of asking the library for the frame's own:
   *         only where no two frames of the runtime ever run at once (a pipeline stage's worker
   *         runs its frames one after another), so a backend keeps its state (oneDNN's reordered
   *         weights) once. */
  bool share_call_sites = false;
  /*! \brief Memory for the values a Run computes (pool slots holding no input, on devices sharing
   *         memory with the scratch's), instead of the frame's own: frames that never run at the
   *         same time (the graphs of one generation session) give the same scratch and hold one
   *         graph's intermediate values between them. An output not bound is then valid until any
   *         of those frames runs. At least GraphRuntime::ScratchBytes of its device; undefined: the
   *         frame allocates its own. */
  tvm::ffi::Tensor scratch;
};

/*! \brief Which inputs a frame reads from another frame's memory (GraphRuntime::Frame decides). */
struct FrameSharing {
  /*! \brief The frame holding the shared inputs (null: the frame shares nothing). */
  const RunFrame* from = nullptr;
  /*! \brief Per input: read from `from`'s memory, not allocated here. */
  std::vector<uint8_t> inputs;
  /*! \brief Some shared input is not set in `from` yet: Run refuses while `from` has inputs unset. */
  bool wait_for_inputs = false;
  /*! \brief Ask the library for a call site of its own per kernel (false: the plan's). */
  bool own_call_sites = false;
  /*! \brief FrameOptions::scratch. */
  tvm::ffi::Tensor scratch;
};

/*! \brief Per-run state of a GraphRuntime (see the file comment). */
class RunFrame {
 public:
  /*!
   * \brief Memory for `plan` (shared inputs taken from `sharing.from`), arguments packed. Made by
   *        GraphRuntime, which also gives it its executor (UseExecutor) before the first Run.
   */
  RunFrame(const PlanInputs& model, std::shared_ptr<const ExecutionPlan> plan, const FrameSharing& sharing);
  ~RunFrame();
  RunFrame(const RunFrame&) = delete;
  RunFrame& operator=(const RunFrame&) = delete;

  /*! \brief Copy `value` into input `index` (shape and dtype checked); unbinds a bound input. */
  void SetInput(int index, const DLTensor* value);
  /*!
   * \brief Zero copy: the steps read input `index` from `value`'s memory from now on (until the
   *        next SetInput or BindInput of it). Shape, dtype, contiguity, device and alignment are
   *        checked; a mismatch is an error naming the input. The frame keeps `value` alive.
   */
  void BindInput(int index, tvm::ffi::Tensor value);
  /*! \brief Zero copy: the steps write output `index` into `out` (checked like BindInput). */
  void BindOutput(int index, tvm::ffi::Tensor out);
  /*! \brief Whether a step computes output `index` and no other output names its tensor, so that
   *         BindOutput can take it (the destination's device aside). */
  bool OutputBindable(int index) const;
  /*! \brief Execute the graph once (every input must be set or bound). */
  void Run();
  /*! \brief The input's tensor: the frame's own memory, or the bound tensor. */
  tvm::ffi::Tensor GetInput(int index) const;
  /*! \brief The output: the frame's memory (valid until the next Run), or the bound tensor. */
  tvm::ffi::Tensor GetOutput(int index) const;
  /*! \brief Copy output `index` into `out`; shape and dtype must match. */
  void CopyOutputTo(int index, DLTensor* out);
  /*! \brief The caller writes input `index` itself (through GetInput's memory) before every Run. */
  void MarkInputSet(int index);
  /*! \brief Whether input `index` was written (or bound, or shared once set). */
  bool input_set(int index) const { return input_set_.at(index) != 0; }
  /*! \brief Bytes set_input and get_output-into-a-tensor copied since the frame was made. */
  int64_t io_bytes_copied() const { return io_bytes_copied_; }
  /*! \brief Bytes of memory this frame allocated (pool slots not shared, copy buffers, staging). */
  int64_t allocated_bytes() const;
  /*! \brief Bytes a frame of `plan` takes from a scratch on `device` (FrameOptions::scratch). */
  static int64_t ScratchBytes(const PlanInputs& model, const ExecutionPlan& plan, DLDevice device);

  // ---- what GraphRuntime and the executors use (not part of the user-facing API) ----
  /*! \brief One call at a time per frame (plan/run_frame_use.h). */
  class ExclusiveUse;
  /*! \brief Copy into input `index` (checked against `what`), unbinding it first; counts as set. */
  void WriteInput(int index, const DLTensor* value, const std::string& what);
  /*! \brief Input `index` reads `memory` from now on, for good (a parameter another runtime holds;
   *         the caller checked shape, dtype and device); counts as set. */
  void ShareInput(int index, tvm::ffi::Tensor memory);
  /*! \brief Re-prepare the calls for `plan` (the same tensors; a plan pass changed only steps). */
  void UsePlan(std::shared_ptr<const ExecutionPlan> plan);
  /*! \brief The executor Run goes through (the previous one, if any, is stopped and dropped). */
  void UseExecutor(std::unique_ptr<FrameExecutor> executor);
  /*! \brief The executor given by UseExecutor. */
  FrameExecutor& executor() { return *executor_; }
  /*! \brief Throw naming every input never set (nor those of the frame shared from). */
  void CheckInputsSet() const;
  /*! \brief The frame's tensor of plan tensor id `id` (its own memory, never a bound one). */
  const tvm::ffi::Tensor& tensor(uint32_t id) const { return tensors_.at(id); }
  /*! \brief What Run's loop calls, packed (plan/prepared_call.h). */
  const PreparedSteps& prepared() const { return *prepared_; }

  /*! \brief Compute calls into other processes by the last Run (remote kernels or groups). */
  std::atomic<int64_t> remote_compute_calls{0};
  /*! \brief Copies to or from other processes by the last Run. */
  std::atomic<int64_t> remote_copies{0};

 private:
  /*! \brief Allocate the pool, the tensors of every id and their DLTensors. */
  void AllocateTensors(const FrameSharing& sharing);
  /*! \brief Pack every step's arguments and build the hot-loop calls (after memory changes). */
  void PrepareCalls();
  /*! \brief Point tensor id `t` and every shared view of its entry at `data` (nullptr: own memory). */
  void Repoint(uint32_t entry, const DLTensor* data);
  /*! \brief Throw naming `what` unless `value` can stand in for entry `eid` without a copy. */
  void CheckBindable(uint32_t eid, const DLTensor* value, const std::string& what) const;
  [[noreturn]] void ThrowUnsetInputs() const;
  /*! \brief "input 'x'" for errors; throws for a parameter shared with the runtime (not this frame's). */
  std::string OwnInputName(int index) const;
  int CheckedIndex(int index, bool output) const;
  /*! \brief Graph entry of input `index`. */
  uint32_t InputEntry(int index) const;

  /*! \brief The graph, devices, storage plan and libraries the plan was built from (the runtime's). */
  const PlanInputs& model_;
  /*! \brief The plan; a frame keeps the one it was prepared for. */
  std::shared_ptr<const ExecutionPlan> plan_;
  /*! \brief One allocation per pool slot (undefined: the slot holds only shared parameters). */
  std::vector<tvm::ffi::Tensor> pool_;
  /*! \brief The frame's tensor for each plan tensor id. */
  std::vector<tvm::ffi::Tensor> tensors_;
  /*! \brief The DLTensor each argument points at, per tensor id (rebinding changes only data). */
  std::vector<DLTensor> dl_;
  /*! \brief Frames other than the default: each kernel step's own call site (FindKernel). */
  std::vector<tvm::ffi::Function> own_kernels_;
  /*! \brief The packed calls of every step, their arguments and staging buffers. */
  std::unique_ptr<PreparedSteps> prepared_;
  /*! \brief Each output as the caller sees it: the entry, or a view on the primary device. */
  std::vector<tvm::ffi::Tensor> output_views_;
  /*! \brief Per output: the input it passes through (its node is that input), or -1. */
  std::vector<int> output_input_;
  /*! \brief Caller tensors bound to inputs / outputs (undefined where not bound). */
  std::vector<tvm::ffi::Tensor> bound_inputs_, bound_outputs_;
  /*! \brief Per input: written at least once; Run refuses to start while any is not. */
  std::vector<uint8_t> input_set_;
  /*! \brief Inputs not written yet. */
  int num_inputs_unset_ = 0;
  /*! \brief Per input: a parameter shared with the default frame (frames other than it only). */
  std::vector<uint8_t> input_shared_;
  /*! \brief The frame holding shared_inputs not set when this one was made (else null): Run
   *         refuses while it has inputs unset. */
  const RunFrame* params_from_ = nullptr;
  /*! \brief Bytes SetInput and CopyOutputTo copied. */
  int64_t io_bytes_copied_ = 0;
  /*! \brief Pool slots and copy buffers allocated (staging buffers: PreparedSteps). */
  int64_t allocated_bytes_ = 0;
  /*! \brief A call using the frame's memory is in progress (a flag, not a lock). */
  std::atomic<bool> in_use_{false};
  /*! \brief Runs the prepared steps; last member, so it (and its threads) goes first. */
  std::unique_ptr<FrameExecutor> executor_;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_RUN_FRAME_H_
