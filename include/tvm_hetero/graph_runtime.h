/*!
 * \file tvm_hetero/graph_runtime.h
 * \brief The heterogeneous graph runtime in three pieces: an immutable plan (src/plan/execution_plan.h)
 *        built once from the graph, devices and kernel libraries; frames (tvm_hetero/run_frame.h)
 *        holding each run's memory and bindings; executors running (plan, frame)
 *        (src/plan/frame_executor.h). The runtime owns the plan and the default frame, and gives
 *        every frame the executor its execution mode calls for. SetInput / Run / GetOutput use the
 *        default frame; Frame() gives more, so several threads run one model at once with the
 *        weights held once.
 */
#ifndef TVM_HETERO_GRAPH_RUNTIME_H_
#define TVM_HETERO_GRAPH_RUNTIME_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/execution.h>
#include <tvm_hetero/graph.h>
#include <tvm_hetero/run_frame.h>
#include <tvm_hetero/storage_plan.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tvm_hetero {

struct ExecutionPlan;
struct ExecutionSchedule;
class FrameExecutor;
struct PlanInputs;

/*!
 * \brief Name of the optional function a kernel library (or an import) provides to drop caches
 *        derived from parameter values, e.g. weights reordered by an external backend. The runtime
 *        calls every one it finds at Init and whenever parameters are loaded, set or shared.
 */
inline constexpr const char* kInvalidateCachesFunction = "__tvm_hetero_invalidate_caches";

/*! \brief Consecutive steps on one device; an offload device is entered once per group. */
struct ExecGroup {
  /*! \brief Device position. */
  int device = 0;
  /*! \brief Steps [begin, end) of the plan (positions before offload runners were attached). */
  uint32_t begin = 0, end = 0;
};

/*! \brief Runs a graph (docs/graph-format.md) over several devices. */
class GraphRuntime {
 public:
  GraphRuntime();
  ~GraphRuntime();
  GraphRuntime(const GraphRuntime&) = delete;
  GraphRuntime& operator=(const GraphRuntime&) = delete;

  /*!
   * \brief Load the graph, place storage on devices and prepare every call.
   * \param graph_json The graph.
   * \param lib Kernel library; kernels are found by func_name, imports searched.
   * \param devices Devices, indexed by device_index; devices[0] is primary and fallback.
   * \param kind How to read device_index when the graph does not say (docs/graph-format.md).
   * \param device_libs Optional per-device libraries (e.g. a module loaded on an RPC session for a
   *        remote device); kernels of nodes on device d come from device_libs[d] when it is set.
   */
  void Init(const std::string& graph_json, tvm::ffi::Module lib, std::vector<DLDevice> devices,
            DeviceIndexKind kind = DeviceIndexKind::kPosition,
            std::vector<tvm::ffi::Optional<tvm::ffi::Module>> device_libs = {});

  /*!
   * \brief Execute the graph once.
   *
   * Rules checked here (docs/runtime.md): every input must have been set (parameters count once
   * loaded or set), else an error names those never set; one call at a time per runtime: Run,
   * SetInput, SetParam(s), LoadParams, ShareParams, CopyOutputTo and ProfileJSON raise "runtime is
   * busy" instead of waiting while another thread is inside one of them on this runtime. Threads
   * that run at the same time each use a frame of their own (Frame()).
   */
  void Run();

  /*!
   * \brief A new frame: memory for one run of the plan, the parameters set so far shared with the
   *        runtime (not copied). Frames run concurrently with each other and with the runtime's own
   *        Run. Needs local devices (an offload runner serves the default frame's memory only). A frame
   *        keeps the execution mode (SetExecution) in force when it was made.
   */
  std::unique_ptr<RunFrame> Frame(const FrameOptions& options = FrameOptions()) const;
  /*! \brief Bytes a frame takes from a scratch on `device` (FrameOptions::scratch): its intermediate values. */
  int64_t ScratchBytes(DLDevice device) const;
  /*! \brief Whether Frame() can make frames: every device is local (a remote runner serves only the
   *         default frame's memory). */
  bool FramesSupported() const;
  /*! \brief The frame behind SetInput / Run / GetOutput. */
  RunFrame& default_frame() { return *default_frame_; }
  /*! \brief The plan, one line per step (ExecutionPlan::ToString). */
  std::string PlanText() const;

  /*!
   * \brief Choose how Run executes the devices (default: concurrent, no executor options). In
   *        concurrent mode each device with steps gets an executor (the primary device runs on the
   *        calling thread unless it has options); waits derived from the graph's memory accesses
   *        keep results bit-identical to serial execution.
   */
  void SetExecution(ExecutionMode mode, std::vector<ExecutorOptions> options = {});
  ExecutionMode execution() const { return execution_; }

  /*!
   * \brief Run `runs` times recording when each step ran, on which device's executor: JSON
   *        {"devices": [name...], "runs": [[{"step", "node", "name", "kind", "device", "start_us",
   *        "end_us"}...]...]}, times from the start of each run.
   */
  std::string TraceJSON(int runs);

  /*! \brief Index of the input (or parameter) named `name`, or -1. */
  int GetInputIndex(const std::string& name) const;
  /*! \brief Copy `value` into input `index`; shape and dtype must match. Writing an input that
   *         is a parameter (bound by SetParam(s)/LoadParams/ShareParams) invalidates caches. */
  void SetInput(int index, const DLTensor* value);
  /*! \brief Throw naming `what` unless `value` fits input `index` (shape, dtype, contiguity). */
  void CheckInputValue(int index, const DLTensor* value, const std::string& what) const;
  /*! \brief The caller writes input `index` itself (through GetInput's memory) before every Run. */
  void MarkInputSet(int index);
  /*! \brief The input's tensor (the runtime's own memory). */
  tvm::ffi::Tensor GetInput(int index) const;
  /*! \brief The output's tensor (the runtime's own memory; valid until the next Run). */
  tvm::ffi::Tensor GetOutput(int index) const;
  /*! \brief Copy output `index` into `out`; shape and dtype must match. */
  void CopyOutputTo(int index, DLTensor* out) const;
  int NumInputs() const { return static_cast<int>(input_nodes_.size()); }
  int NumOutputs() const { return static_cast<int>(graph_.heads.size()); }
  /*! \brief Name of input `index`. */
  const std::string& GetInputName(int index) const;
  /*! \brief Whether input `index` was written by a parameter path (set_params, load_params, share_params). */
  bool InputIsParam(int index) const { return input_is_param_.at(index) != 0; }

  /*!
   * \brief Set parameters from `tvm.runtime.save_param_dict` bytes. The whole blob is validated
   *        (sizes against the bytes present, names, shapes and dtypes against the graph) before
   *        anything is written; errors name `what` (e.g. the file) and the parameter.
   */
  void LoadParams(const std::string& param_bytes, const std::string& what = "load_params");
  /*! \brief Set parameters by name; all are checked before any is written. */
  void SetParams(const tvm::ffi::Map<tvm::ffi::String, tvm::ffi::Tensor>& params);
  /*! \brief Set one parameter by input index. */
  void SetParam(int index, const DLTensor* value);
  /*! \brief Use `other`'s memory for the parameters named in `param_bytes` (no copy). */
  void ShareParams(const GraphRuntime& other, const std::string& param_bytes);

  /*!
   * \brief The kernel segments of `device` as JSON, for building its remote runner:
   *        {"entries": [eid...], "segments": [[{"func_name": f, "args": [k...]}...]...]} where each
   *        arg k indexes "entries".
   */
  std::string OffloadPlanJSON(int device) const;
  /*! \brief The tensor of entry `eid` (the runtime's own memory, on its device). */
  tvm::ffi::Tensor GetEntry(uint32_t eid) const;
  /*! \brief From now on, run each segment of `device` with one call `run_segment(index)`. */
  void AttachOffloadRunner(int device, tvm::ffi::Function run_segment);

  /*! \brief Counts as JSON: nodes, groups, copies, device switches, storage bytes per device. */
  std::string StatsJSON() const;
  /*! \brief Run `repeat` times timing every node; per-node and per-group times as JSON. */
  std::string ProfileJSON(int repeat);

  const Graph& graph() const { return graph_; }
  const std::vector<ExecGroup>& groups() const;
  const ExecutionPlan& plan() const { return *plan_; }
  const std::vector<DLDevice>& devices() const;
  const StoragePlan& storage_plan() const { return storage_plan_; }

 private:
  /*! \brief Find the libraries' cache-invalidation hooks. */
  void SetupCacheHooks();
  /*! \brief Parameter values changed: call every cache-invalidation hook. */
  void InvalidateCaches() const;
  /*! \brief Replace the plan (after a plan pass) and re-prepare the default frame for it. */
  void UsePlan(ExecutionPlan plan);
  /*! \brief Derive the schedule for the current plan and mode; give the default frame its executor. */
  void SetupExecution();
  /*! \brief The executor the schedule calls for, running the plan over `frame`. */
  std::unique_ptr<FrameExecutor> ExecutorFor(RunFrame& frame) const;
  int CheckedInputIndex(int index, const char* what) const;
  /*! \brief Write checked parameters, mark them parameters, invalidate caches once. */
  void BindParams(const std::vector<std::pair<int, const DLTensor*>>& params);

  /*! \brief The validated graph. */
  Graph graph_;
  /*! \brief Pool slots and the slot of each entry. */
  StoragePlan storage_plan_;
  /*! \brief What the plan, the frames and the executors are made from: the graph and storage plan
   *         above, the devices by position, each node's device and the kernel libraries. */
  std::unique_ptr<PlanInputs> model_;
  /*! \brief Node id of each input (arg_nodes order). */
  std::vector<uint32_t> input_nodes_;
  /*! \brief Input name -> input index. */
  std::unordered_map<std::string, int> input_index_;
  /*! \brief The immutable plan every frame runs (replaced whole by AttachOffloadRunner). */
  std::shared_ptr<const ExecutionPlan> plan_;
  /*! \brief How frames execute the plan (replaced whole by SetExecution). */
  std::shared_ptr<const ExecutionSchedule> schedule_;
  /*! \brief The frame behind SetInput / Run / GetOutput; it holds the parameters frames share. */
  std::unique_ptr<RunFrame> default_frame_;
  /*! \brief Cache-invalidation hooks of the libraries (kInvalidateCachesFunction). */
  std::vector<tvm::ffi::Function> invalidate_caches_;
  /*! \brief Serial or concurrent, and each device's executor options. */
  ExecutionMode execution_ = ExecutionMode::kConcurrent;
  std::vector<ExecutorOptions> executor_options_;
  /*! \brief Per input: bound as a parameter, so writing it invalidates derived caches and frames
   *         share it. */
  std::vector<uint8_t> input_is_param_;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_GRAPH_RUNTIME_H_
