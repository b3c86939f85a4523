/*!
 * \file tvm_hetero/graph_runtime.h
 * \brief The heterogeneous graph runtime: everything is looked up, allocated and packed in Init;
 *        Run() is one flat loop over prepared calls (graph_runtime_steps.h).
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
#include <tvm_hetero/storage_plan.h>

#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tvm_hetero {

struct MemoryRegion;
struct StepAccess;

/*!
 * \brief Name of the optional function a kernel library (or an import) provides to drop caches
 *        derived from parameter values, e.g. weights reordered by an external backend. The runtime
 *        calls every one it finds at Init and whenever parameters are loaded, set or shared.
 */
inline constexpr const char* kInvalidateCachesFunction = "__tvm_hetero_invalidate_caches";

struct OpExec;
struct OffloadSegment;
/*! \brief The prepared steps (graph_runtime_steps.h, private to the library). */
struct RuntimeSteps;

/*! \brief Consecutive steps on one device; an offload device is entered once per group. */
struct ExecGroup {
  /*! \brief Device position. */
  int device = 0;
  /*! \brief Steps [begin, end) of the runtime's step array. */
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
   * busy" instead of waiting while another thread is inside one of them on this runtime.
   */
  void Run();

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
  const std::vector<ExecGroup>& groups() const { return groups_; }
  const std::vector<DLDevice>& devices() const { return devices_; }
  const StoragePlan& storage_plan() const { return storage_plan_; }

 private:
  void SetupStorage();
  void SetupOpExecs();
  void SetupGroups();
  void SetupOffloadSegments();
  /*! \brief Point each segment's call arguments at its inputs' host bytes (after steps change). */
  void SetupSegmentCalls();
  /*! \brief Write the bytes a segment's call returned into its outputs' host tensors. */
  void ReceiveSegmentOutputs(const OffloadSegment& segment, const tvm::ffi::Any& returned) const;
  /*! \brief What each step reads and writes, in step order (concurrency/step_schedule.h). */
  const std::vector<StepAccess>& StepAccesses() const;
  /*! \brief Find the libraries' cache-invalidation hooks. */
  void SetupCacheHooks();
  /*! \brief Parameter values changed: call every cache-invalidation hook. */
  void InvalidateCaches() const;
  void RunStep(const OpExec& step, tvm::ffi::Any* rv) const;
  /*! \brief Everything but a local kernel call: remote calls (counted), copies, skips. */
  void RunOtherStep(uint32_t index, tvm::ffi::Any* rv);
  /*! \brief Build the hot-loop calls from the steps. */
  void SetupPreparedCalls();
  int CheckedInputIndex(int index, const char* what) const;
  /*! \brief Throw naming the input unless `value` matches its shape and dtype. */
  void CheckCompatible(uint32_t eid, const DLTensor* value, const std::string& what) const;
  /*! \brief Copy into input `index` (checked) and count it as set. */
  void WriteInput(int index, const DLTensor* value, const std::string& what);
  /*! \brief Write checked parameters, mark them parameters, invalidate caches once. */
  void BindParams(const std::vector<std::pair<int, const DLTensor*>>& params);
  /*! \brief Throw naming every input never set. */
  [[noreturn]] void ThrowUnsetInputs() const;
  /*! \brief Marks the runtime in use for one call; another call meanwhile raises "busy". */
  class ExclusiveUse;
  /*! \brief Executors, the schedule's memory accesses and trace buffers (concurrency/). */
  struct Concurrency;
  /*! \brief Rebuild the step schedule and restart the executors (after steps change). */
  void SetupExecution();
  /*! \brief The kernel argument for entry `eid` read by node `nid`: the entry, a view of it
   *         carrying the node's device (devices sharing memory), or a copy on the node's device. */
  DLTensor* KernelInput(uint32_t nid, uint32_t eid);
  /*! \brief Bytes of entry `eid` in its pool slot. */
  MemoryRegion EntryRegion(uint32_t eid) const;
  /*! \brief What node `nid` reads for entry `eid`: the entry, or its implicit copy. */
  MemoryRegion InputRegion(uint32_t nid, uint32_t eid) const;
  /*! \brief One execution of the graph, serial or concurrent (callers check use and inputs). */
  void RunOnce();
  /*! \brief Run step `i` (the body of Run's loop); errors name the node and device. */
  static void RunStepOnExecutor(void* self, uint32_t i);
  /*! \brief `err` with the step's node and device in front. */
  tvm::ffi::Error ErrorAt(uint32_t i, const tvm::ffi::Error& err) const;
  /*! \brief Run every step on the calling thread, in order. */
  void RunSerial();

  /*! \brief The validated graph. */
  Graph graph_;
  /*! \brief Kernel library. */
  tvm::ffi::Optional<tvm::ffi::Module> lib_;
  /*! \brief Per-device kernel libraries overriding lib_ (empty or unset: lib_). */
  std::vector<tvm::ffi::Optional<tvm::ffi::Module>> device_libs_;
  /*! \brief Devices by position. */
  std::vector<DLDevice> devices_;
  /*! \brief Device position of each node. */
  std::vector<int> node_device_;
  /*! \brief Pool slots and the slot of each entry. */
  StoragePlan storage_plan_;
  /*! \brief One allocation per slot, on its device. */
  std::vector<tvm::ffi::Tensor> pool_;
  /*! \brief One view per entry into its pool slot (or a shared parameter). */
  std::vector<tvm::ffi::Tensor> data_entry_;
  /*! \brief Node id of each input (arg_nodes order). */
  std::vector<uint32_t> input_nodes_;
  /*! \brief Input name -> input index. */
  std::unordered_map<std::string, int> input_index_;
  /*! \brief The prepared steps, their hot-loop calls and offload segments. */
  std::unique_ptr<RuntimeSteps> steps_;
  /*! \brief Runs of steps on one device. */
  std::vector<ExecGroup> groups_;
  /*! \brief Cache-invalidation hooks of the libraries (kInvalidateCachesFunction). */
  std::vector<tvm::ffi::Function> invalidate_caches_;
  /*! \brief Compute calls into other processes by the last Run (remote kernels or segments). */
  std::atomic<int64_t> remote_compute_calls_{0};
  /*! \brief Copies to or from other processes by the last Run. */
  std::atomic<int64_t> remote_copies_{0};
  /*! \brief Serial or concurrent, and each device's executor options. */
  ExecutionMode execution_ = ExecutionMode::kConcurrent;
  std::vector<ExecutorOptions> executor_options_;
  /*! \brief Views of entries read by kernels of another device that shares memory with the
   *         entry's device: same bytes, the reader's device (TVM kernels check the device). */
  std::vector<tvm::ffi::Tensor> shared_views_;
  /*! \brief Buffers on a reader's device for entries whose device does not share memory with it
   *         and that the graph does not copy itself (a graph compiled for two CPUs, run with one of
   *         them remote). Indexed after the graph's entries in GetEntry / OffloadPlanJSON. */
  std::vector<tvm::ffi::Tensor> implicit_copies_;
  /*! \brief Each output as the caller sees it: the entry, or a view on the primary device. */
  std::vector<tvm::ffi::Tensor> output_views_;
  /*! \brief Bytes moved by copy steps per Run (graph copies and implicit ones). */
  int64_t bytes_copied_per_run_ = 0;
  std::unique_ptr<Concurrency> concurrency_;
  /*! \brief Non-CPU devices to synchronise at the end of Run. */
  std::vector<DLDevice> devices_to_sync_;
  /*! \brief Per input: written at least once (SetInput, a parameter path, or MarkInputSet). */
  std::vector<uint8_t> input_set_;
  /*! \brief Inputs not yet written: Run refuses to start while it is not zero. */
  int num_inputs_unset_ = 0;
  /*! \brief Per input: bound as a parameter, so writing it invalidates derived caches. */
  std::vector<uint8_t> input_is_param_;
  /*! \brief A call that uses the runtime's memory is in progress (see Run). */
  std::atomic<bool> in_use_{false};
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_GRAPH_RUNTIME_H_
