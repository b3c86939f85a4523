/*!
 * \file tvm_hetero/pipeline_executor.h
 * \brief Pipeline executor: a graph split into stages (each its own GraphRuntime, possibly on its own
 *        device), one worker thread per stage, bounded queues between them, so that successive
 *        inferences keep every device busy at once (docs/pipeline.md).
 *
 * Everything is checked, allocated and prepared in Init; a worker's loop only pops a frame index,
 * copies, runs and pushes. Errors are exceptions naming the stage and input at fault.
 */
#ifndef TVM_HETERO_PIPELINE_EXECUTOR_H_
#define TVM_HETERO_PIPELINE_EXECUTOR_H_

#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/graph_runtime.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace tvm_hetero {

/*! \brief Where a stage input gets its value each inference. */
struct PipelineSource {
  /*! \brief Pipeline input name; empty when the source is a stage output. */
  std::string input;
  /*! \brief Producing stage (-1 for a pipeline input). */
  int stage = -1;
  /*! \brief Output index of the producing stage. */
  int output = 0;

  /*! \brief The pipeline input `name`. */
  static PipelineSource Input(std::string name) { return PipelineSource{std::move(name), -1, 0}; }
  /*! \brief Output `output` of stage `stage`. */
  static PipelineSource StageOutput(int stage, int output) { return PipelineSource{"", stage, output}; }
  /*! \brief Whether the source is a pipeline input. */
  bool is_input() const { return stage < 0; }
};

/*! \brief One stage: its runtime, how its inputs are wired, and its worker's options. */
struct PipelineStage {
  /*! \brief Name used in errors and stats; "stage<i>" when empty. */
  std::string name;
  /*! \brief The stage's runtime, already initialised; shared so that a Module can own it. */
  std::shared_ptr<GraphRuntime> runtime;
  /*! \brief Stage input name -> its source; every other input must be listed in `params`. */
  std::vector<std::pair<std::string, PipelineSource>> inputs;
  /*! \brief Inputs set once (SetParam/SetParams/LoadParams) rather than per inference. */
  std::vector<std::string> params;
  /*! \brief CPU cores for the worker thread and its TVM thread pool; empty: no affinity. */
  std::vector<int> cores;
  /*! \brief TVM threads for this stage's kernels; 0: TVM's default. */
  int num_threads = 0;
};

/*! \brief Everything a pipeline is made of (the C++ form of the wiring JSON, docs/pipeline.md). */
struct PipelineConfig {
  /*! \brief Pipeline input names, in the order Run takes them. */
  std::vector<std::string> inputs;
  /*! \brief Stages in order; a stage reads only pipeline inputs and earlier stages' outputs. */
  std::vector<PipelineStage> stages;
  /*! \brief Pipeline outputs as (stage, output index), in the order GetOutput returns them. */
  std::vector<std::pair<int, int>> outputs;
  /*! \brief Frames each queue holds at most. */
  int queue_capacity = 2;
};

/*!
 * \brief Parse the wiring JSON (docs/pipeline.md) into a config without runtimes.
 * \throws tvm::ffi::Error (ValueError) naming the field at fault.
 */
PipelineConfig ParsePipelineConfig(const std::string& json);

/*!
 * \brief Runs successive inferences through stages, one worker thread per stage.
 *
 * Thread safety: Run and GetOutput may be called from different threads (one producer, one
 * consumer; more are serialised). The stage runtimes must not be used elsewhere while it lives.
 */
class PipelineExecutor {
 public:
  /*! \brief An executor with no stages; Init sets it up. */
  PipelineExecutor() = default;
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;
  /*! \brief Stops the workers (work in flight is dropped) and joins them. */
  ~PipelineExecutor();

  /*! \brief Validate the wiring, allocate every frame and start the workers. */
  void Init(PipelineConfig config);

  /*!
   * \brief Submit one inference: copy `inputs` (pipeline-input order) into a free frame and enqueue it.
   * \param block Wait while the first stage's queue is full; when false, return false instead.
   * \return Whether the inference was submitted.
   * \throws the stage error if a stage failed, RuntimeError after Shutdown.
   */
  bool Run(const std::vector<const DLTensor*>& inputs, bool block = true);

  /*!
   * \brief Copy the outputs of the oldest unreturned inference into `outputs` (pipeline-output order).
   * \param block Wait until it is done (with nothing in flight: until another thread submits one, or
   *        Shutdown); when false, return false if it is not done.
   * \throws the stage error (naming the stage) once a stage failed and the outputs finished before
   *         the failure have been returned; RuntimeError after Shutdown.
   */
  bool GetOutput(const std::vector<DLTensor*>& outputs, bool block = true);
  /*! \brief GetOutput into new tensors, each on its producing stage's device; nullopt when not ready. */
  std::optional<std::vector<tvm::ffi::Tensor>> GetOutput(bool block = true);

  /*! \brief Set parameter `name` of stage `stage`; only while no inference is in flight. */
  void SetParam(int stage, const std::string& name, const DLTensor* value);
  /*! \brief Set parameters by name in stage `stage`, or in every stage declaring them when stage < 0. */
  void SetParams(int stage, const tvm::ffi::Map<tvm::ffi::String, tvm::ffi::Tensor>& params);
  /*! \brief SetParams from `tvm.runtime.save_param_dict` bytes. */
  void LoadParams(int stage, const std::string& param_bytes);

  /*! \brief Stop accepting work, wake every waiter, join the workers. Idempotent. */
  void Shutdown();

  /*! \brief Per-stage busy time, inferences and queue depths; totals and throughput, as JSON. */
  std::string StatsJSON() const;

  /*! \brief Number of pipeline inputs. */
  int NumInputs() const { return static_cast<int>(input_names_.size()); }
  /*! \brief Number of pipeline outputs. */
  int NumOutputs() const { return static_cast<int>(output_boundaries_.size()); }
  /*! \brief Number of stages. */
  int NumStages() const { return static_cast<int>(stages_.size()); }
  /*! \brief Pipeline input names in Run order. */
  const std::vector<std::string>& input_names() const { return input_names_; }
  /*! \brief Index of the pipeline input `name`, or -1. */
  int GetInputIndex(const std::string& name) const;
  /*! \brief Name of stage `index`. */
  const std::string& stage_name(int index) const { return stages_.at(index).name; }
  /*! \brief Frames each queue holds at most. */
  int queue_capacity() const { return capacity_; }
  /*! \brief Inferences submitted and not yet returned by GetOutput. */
  int64_t NumInFlight() const;

 private:
  /*! \brief A tensor that crosses a stage boundary: a pipeline input or a used stage output. */
  struct Boundary {
    /*! \brief Shape. */
    std::vector<int64_t> shape;
    /*! \brief Dtype. */
    DLDataType dtype;
    /*! \brief Device the frame copies live on (host for inputs, the producer's for outputs). */
    DLDevice device;
    /*! \brief "pipeline input 'x'" or "stage 0 'front' output 1", for errors. */
    std::string what;
  };
  /*! \brief A copy between a frame's boundary tensor and a stage runtime's own tensor. */
  struct StageCopy {
    /*! \brief Boundary id within a frame. */
    int boundary = 0;
    /*! \brief The runtime's input (feed) or output (drain) tensor. */
    tvm::ffi::Tensor stage_tensor;
    /*! \brief Host buffer when no single device API can do the copy, else undefined. */
    tvm::ffi::Tensor staging;
    /*! \brief The stage runtime's input (feed) or output (drain) index. */
    int index = 0;
  };
  /*! \brief A bounded FIFO of frame indices; guarded by mu_. */
  struct FrameQueue {
    /*! \brief Ring storage; its size is the capacity. */
    std::vector<int> ring;
    /*! \brief Position of the oldest element. */
    size_t head = 0;
    /*! \brief Number of elements. */
    size_t size = 0;
    /*! \brief Most elements ever held. */
    size_t max_size = 0;
    /*! \brief Signalled when an element is pushed (the consumer waits on it). */
    std::condition_variable ready;
    /*! \brief Signalled when an element is popped (the producer waits on it). */
    std::condition_variable space;

    /*! \brief Whether a push would exceed the capacity. */
    bool full() const { return size == ring.size(); }
    /*! \brief Append `frame` (the queue must not be full). */
    void Push(int frame);
    /*! \brief Remove and return the oldest frame (the queue must not be empty). */
    int Pop();
  };
  /*! \brief A stage as the executor runs it. */
  struct Stage {
    /*! \brief Name for errors and stats. */
    std::string name;
    /*! \brief The stage's runtime (shared ownership). */
    std::shared_ptr<GraphRuntime> runtime;
    /*! \brief Frame -> runtime input copies, before Run. */
    std::vector<StageCopy> feeds;
    /*! \brief Runtime output -> frame copies, after Run. */
    std::vector<StageCopy> drains;
    /*! \brief One frame of the stage's runtime per pipeline frame, its wired inputs and used
     *         outputs bound to that pipeline frame's boundary tensors where the devices allow (no
     *         copy); `feeds` and `drains` keep only the rest. Empty: the stage runs its runtime's
     *         default frame and copies every boundary (a stage with remote devices). */
    std::vector<std::unique_ptr<RunFrame>> frames;
    /*! \brief Per pipeline frame f, feed k: the stage frame's input it copies into ([f * feeds + k]);
     *         likewise the outputs the drains copy from. */
    std::vector<DLTensor*> feed_to, drain_from;
    /*! \brief Boundary copies per inference before binding (every feed and drain). */
    int64_t copies_without_frames = 0;
    /*! \brief Non-host devices doing the feed copies, synchronised before Run. */
    std::vector<DLDevice> feed_devices;
    /*! \brief Non-host devices the drains write to, synchronised before the frame moves on. */
    std::vector<DLDevice> drain_devices;
    /*! \brief Declared parameter names. */
    std::vector<std::string> params;
    /*! \brief CPU cores for the worker (validated). */
    std::vector<int> cores;
    /*! \brief TVM threads for the worker's pool; 0: default. */
    int num_threads = 0;
    /*! \brief The worker. */
    std::thread thread;
    /*! \brief Seconds spent copying and running (guarded by mu_). */
    double busy_s = 0;
    /*! \brief Inferences this stage finished (guarded by mu_). */
    int64_t count = 0;
  };
  /*! \brief The first stage error, kept to rethrow. */
  struct Failure {
    /*! \brief Error kind of the original (ValueError, ...). */
    std::string kind;
    /*! \brief "pipeline stage 1 'back' failed: <original message>". */
    std::string message;
    /*! \brief Backtrace of the original. */
    std::string backtrace;
  };
  /*! \brief Counts a public call in flight so that the destructor can wait for it to leave. */
  class CallGuard;

  /*! \brief Check each stage's options and take its runtime. */
  void SetupStages(PipelineConfig& config);
  /*! \brief Check the wiring; make the boundaries and each stage's feed and drain copies. */
  void SetupWiring(const PipelineConfig& config);
  /*! \brief Allocate every frame and the queues. */
  void SetupFrames();
  /*! \brief Give stage `stage` one runtime frame per pipeline frame, binding what can be bound. */
  void SetupStageFrames(Stage& stage);
  /*! \brief Start one worker per stage and wait until each has set up its thread. */
  void StartWorkers();
  /*! \brief Boundary id of (stage, output), creating it on first use. */
  int StageOutputBoundary(int stage, int output);
  /*! \brief The worker loop of stage `s`. */
  void Work(int s);
  /*! \brief Apply the stage's core list and thread count to the calling (worker) thread. */
  void ConfigureWorkerThread(const Stage& stage) const;
  /*! \brief Copy, run, copy for frame `frame` in stage `s`. */
  void RunStage(Stage& stage, int frame);
  /*! \brief Set stopped_ and wake every waiter; call with mu_ held. */
  void StopLocked();
  /*! \brief Throw unless no inference is in flight (parameters may change); call with mu_ held. */
  void CheckIdleLocked() const;
  /*! \brief Record the first failure and stop everything; call with mu_ held. */
  void FailLocked(int s, const std::string& kind, const std::string& message, const std::string& backtrace);
  /*! \brief Throw the failure, or RuntimeError once shut down; call with mu_ held. */
  [[noreturn]] void ThrowStoppedLocked() const;
  /*! \brief collect_mu_, locked (or, when not blocking and another consumer has it, not). */
  std::unique_lock<std::mutex> LockCollect(bool block);
  /*! \brief Pop the oldest finished frame, waiting if `block`; -1 when none is ready. Throws once stopped. */
  int TakeFinished(bool block);
  /*! \brief Copy the outputs of `frame` into `outputs`, then free the frame. */
  void CopyOutAndRelease(int frame, const std::vector<DLTensor*>& outputs);
  /*! \brief Throw unless `value` matches boundary `b` in shape and dtype. */
  void CheckBoundary(int b, const DLTensor* value, const std::string& what) const;
  /*! \brief The frame copy of boundary `b` in frame `frame`. */
  DLTensor* FrameTensor(int frame, int b) const { return frame_ptrs_[frame * boundaries_.size() + b]; }
  /*! \brief Stage `s`, or throw IndexError. */
  const Stage& CheckedStage(int s) const;
  /*! \brief Input index of the declared parameter `name` of stage `s`, or throw naming the stage. */
  int CheckedParamIndex(int s, const std::string& name) const;

  /*! \brief Stages in order. */
  std::vector<Stage> stages_;
  /*! \brief Pipeline input names; input i is boundary i. */
  std::vector<std::string> input_names_;
  /*! \brief Every boundary tensor: pipeline inputs first, then stage outputs in order of first use. */
  std::vector<Boundary> boundaries_;
  /*! \brief (stage, output) -> boundary id, -1 when unused; indexed [stage][output]. */
  std::vector<std::vector<int>> output_boundary_;
  /*! \brief Boundary id of each pipeline output. */
  std::vector<int> output_boundaries_;
  /*! \brief Capacity of every queue. */
  int capacity_ = 2;
  /*! \brief frames x boundaries tensors, allocated once. */
  std::vector<tvm::ffi::Tensor> frame_tensors_;
  /*! \brief DLTensor of each frame tensor, same indexing. */
  std::vector<DLTensor*> frame_ptrs_;

  /*! \brief Guards everything below and the FrameQueues. */
  mutable std::mutex mu_;
  /*! \brief queues_[s] feeds stage s; queues_[num stages] holds finished frames for GetOutput. */
  std::vector<std::unique_ptr<FrameQueue>> queues_;
  /*! \brief Frames no inference holds (a stack). */
  std::vector<int> free_frames_;
  /*! \brief Set by Shutdown or a failure: workers exit, Run and GetOutput throw. */
  bool stopped_ = false;
  /*! \brief The first stage failure. */
  std::optional<Failure> failure_;
  /*! \brief Workers that finished their thread setup. */
  int workers_ready_ = 0;
  /*! \brief Signalled when a worker finished setup and when a public call leaves. */
  std::condition_variable changed_;
  /*! \brief Public calls in flight. */
  int active_calls_ = 0;
  /*! \brief Inferences submitted, finished by the last stage, and returned by GetOutput. */
  int64_t submitted_ = 0, completed_ = 0, returned_ = 0;
  /*! \brief Time of the first Run. */
  std::chrono::steady_clock::time_point first_run_;

  /*! \brief Serialises producers (Run) so that queue 0 only grows under the one holding it. */
  std::mutex submit_mu_;
  /*! \brief Serialises consumers (GetOutput) so that outputs leave in submission order. */
  std::mutex collect_mu_;
  /*! \brief Serialises Shutdown's joins. */
  std::mutex join_mu_;
};

}  // namespace tvm_hetero

#endif  // TVM_HETERO_PIPELINE_EXECUTOR_H_
