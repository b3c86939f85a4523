/*!
 * \file tvm_hetero/run_frame.h
 * \brief A frame: the per-run state of one compiled model -- storage pools, tensor views, prepared
 *        arguments, bound inputs and outputs, and its executors. Frames of one runtime share its
 *        plan (src/plan/execution_plan.h) and its parameters, so several threads, each with its own
 *        frame, run one model at once with the weights held once.
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
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tvm_hetero {

class GraphRuntime;
class DeviceExecutors;
struct ExecutionPlan;
struct ExecutionSchedule;
struct PreparedCall;
struct GroupCall;

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
};

/*! \brief Per-run state of a GraphRuntime (see the file comment). */
class RunFrame {
 public:
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
  /*! \brief Bytes set_input and get_output-into-a-tensor copied since the frame was made. */
  int64_t io_bytes_copied() const { return io_bytes_copied_; }
  /*! \brief Bytes of memory this frame allocated (pool slots not shared, copy buffers, staging). */
  int64_t allocated_bytes() const { return allocated_bytes_ + staging_bytes_; }

 private:
  friend class GraphRuntime;
  /*! \brief Memory for `plan` (parameter entries from `shared` when given), arguments packed. */
  RunFrame(const GraphRuntime* runtime, std::shared_ptr<const ExecutionPlan> plan, const RunFrame* shared,
           const FrameOptions& options = FrameOptions());
  /*! \brief Allocate the pool, the tensors of every id and their DLTensors. */
  void AllocateTensors(const RunFrame* shared, const FrameOptions& options);
  /*! \brief Pack every step's arguments and build the hot-loop calls (after memory changes). */
  void PrepareCalls();
  /*! \brief Start executors for `schedule` (none: the serial loop on the caller). */
  void StartExecutors(std::shared_ptr<const ExecutionSchedule> schedule);
  /*! \brief Point tensor id `t` and every shared view of its entry at `data` (nullptr: own memory). */
  void Repoint(uint32_t entry, const DLTensor* data);
  /*! \brief Throw naming `what` unless `value` can stand in for entry `eid` without a copy. */
  void CheckBindable(uint32_t eid, const DLTensor* value, const std::string& what) const;
  /*! \brief Copy into input `index` (checked against `what`), unbinding it first; counts as set. */
  void WriteInput(int index, const DLTensor* value, const std::string& what);

  // ---- execution (plan/step_execution.cc) ----
  /*! \brief One execution, serial or on the executors (callers check use and inputs). */
  void RunOnce();
  /*! \brief Run every step on the calling thread, in order. */
  void RunSerial();
  /*! \brief Everything but a local kernel call: remote calls (counted), copies, groups. */
  void RunOtherStep(uint32_t index, tvm::ffi::Any* rv);
  /*! \brief Run step `i` on whichever executor holds it; errors name the node and device. */
  static void RunStepOnExecutor(void* self, uint32_t i);
  /*! \brief `err` with the step's node and device in front. */
  tvm::ffi::Error ErrorAt(uint32_t i, const tvm::ffi::Error& err) const;
  /*! \brief Write the bytes a group's call returned into its outputs' tensors. */
  void ReceiveGroupOutputs(const GroupCall& group, const tvm::ffi::Any& returned) const;
  /*! \brief Run `runs` times timing every step (per run: start and end, -1 where not run). */
  std::vector<std::vector<std::pair<double, double>>> TimedRuns(int runs, bool serial);
  [[noreturn]] void ThrowUnsetInputs() const;
  /*! \brief "input 'x'" for errors; throws for a parameter shared with the runtime (not this frame's). */
  std::string OwnInputName(int index) const;
  int CheckedIndex(int index, bool output) const;

  /*! \brief The runtime this frame runs (graph, devices, names). */
  const GraphRuntime* runtime_;
  /*! \brief The plan; a frame keeps the one it was prepared for. */
  std::shared_ptr<const ExecutionPlan> plan_;
  /*! \brief The executors' schedule and per-step device syncs. */
  std::shared_ptr<const ExecutionSchedule> schedule_;
  /*! \brief One allocation per pool slot (undefined: the slot holds only shared parameters). */
  std::vector<tvm::ffi::Tensor> pool_;
  /*! \brief The frame's tensor for each plan tensor id. */
  std::vector<tvm::ffi::Tensor> tensors_;
  /*! \brief The DLTensor each argument points at, per tensor id (rebinding changes only data). */
  std::vector<DLTensor> dl_;
  /*! \brief Host staging buffer of each staged copy step (else undefined). */
  std::vector<tvm::ffi::Tensor> staging_;
  /*! \brief Frames other than the default: each kernel step's own call site (FindKernel). */
  std::vector<tvm::ffi::Function> own_kernels_;
  /*! \brief Every step's packed arguments, back to back. */
  std::vector<tvm::ffi::AnyView> args_;
  /*! \brief One per plan step: what Run's loop calls. */
  std::vector<PreparedCall> calls_;
  /*! \brief Per attached offload segment: its packed call and the tensors its results go to. */
  std::vector<GroupCall> group_calls_;
  /*! \brief Each output as the caller sees it: the entry, or a view on the primary device. */
  std::vector<tvm::ffi::Tensor> output_views_;
  /*! \brief Caller tensors bound to inputs / outputs (undefined where not bound). */
  std::vector<tvm::ffi::Tensor> bound_inputs_, bound_outputs_;
  /*! \brief Per input: written at least once; Run refuses to start while any is not. */
  std::vector<uint8_t> input_set_;
  int num_inputs_unset_ = 0;
  /*! \brief Per input: a parameter shared with the default frame (frames other than it only). */
  std::vector<uint8_t> input_shared_;
  /*! \brief The frame holding shared_inputs not set when this one was made (else null): Run
   *         refuses while it has inputs unset. */
  const RunFrame* params_from_ = nullptr;
  /*! \brief Non-CPU devices to synchronise at the end of Run. */
  std::vector<DLDevice> devices_to_sync_;
  /*! \brief This frame's device executors (started only when the schedule asks for them). */
  std::unique_ptr<DeviceExecutors> executors_;
  /*! \brief Set while TimedRuns records step times (read between runs only). */
  bool tracing_ = false;
  /*! \brief Start of the traced run, and each step's span in it (µs; -1: not run). */
  std::chrono::steady_clock::time_point run_start_;
  std::vector<double> span_start_us_, span_end_us_;
  /*! \brief Bytes SetInput and CopyOutputTo copied. */
  int64_t io_bytes_copied_ = 0;
  /*! \brief Pool slots and copy buffers allocated; staging buffers (remade with the calls). */
  int64_t allocated_bytes_ = 0, staging_bytes_ = 0;
  /*! \brief A call using the frame's memory is in progress (a flag, not a lock). */
  std::atomic<bool> in_use_{false};

 public:
  /*! \brief Compute calls into other processes by the last Run (remote kernels or groups). */
  std::atomic<int64_t> remote_compute_calls{0};
  /*! \brief Copies to or from other processes by the last Run. */
  std::atomic<int64_t> remote_copies{0};

 private:
  class ExclusiveUse;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_RUN_FRAME_H_
