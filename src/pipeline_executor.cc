/*!
 * \file pipeline_executor.cc
 * \brief Init checks the wiring, allocates every frame and starts one worker per stage; a worker's
 *        loop is pop frame -> copy in -> Run -> copy out -> push frame (docs/pipeline.md).
 *
 * Frames: an inference holds one frame from Run until GetOutput returns it; a frame holds a copy of
 * every boundary tensor (pipeline inputs, and stage outputs read by later stages or returned). With
 * N stages and queue capacity C at most (N+1)C frames sit in queues, N in stages and one in
 * GetOutput, so Init allocates (N+1)C + N + 1 frames and Run, which waits only for room in the first
 * queue, always finds a free one.
 */
#include <sched.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/runtime/device_api.h>
#include <tvm_hetero/param_blob.h>
#include <tvm_hetero/pipeline_executor.h>
#include <unistd.h>

#include "support/device.h"
#include "support/json_reader.h"
#include "support/tensor_check.h"
#include "support/thread_pinning.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <sstream>

namespace tvm_hetero {

namespace ffi = tvm::ffi;
namespace json = tvm::ffi::json;
using tvm::runtime::DeviceAPI;
using Clock = std::chrono::steady_clock;

namespace {

ffi::Tensor Empty(const int64_t* shape, int ndim, DLDataType dtype, DLDevice device) {
  return support::AllocTensor(ffi::Shape(shape, shape + ndim), dtype, device);
}

// ---- the wiring JSON reader ------------------------------------------------------------------

const support::JsonReader kReader{"invalid pipeline config"};

int IntAt(const ffi::Any& v, const std::string& where) { return static_cast<int>(kReader.Int(v, where)); }

/*! \brief `{"stage": k, "output": i}`. */
std::pair<int, int> StageOutputAt(const ffi::Any& v, const std::string& where) {
  json::Object obj = kReader.Object(v, where);
  kReader.CheckKeys(obj, {"stage", "output"}, where);
  auto stage = support::JsonReader::Find(obj, "stage");
  if (!stage) kReader.Fail(where, "missing field 'stage'");
  auto output = support::JsonReader::Find(obj, "output");
  return {IntAt(*stage, where + ".stage"), output ? IntAt(*output, where + ".output") : 0};
}

PipelineStage StageAt(const ffi::Any& v, const std::string& where) {
  json::Object obj = kReader.Object(v, where);
  kReader.CheckKeys(obj, {"name", "inputs", "params", "cores", "num_threads"}, where);
  PipelineStage stage;
  if (auto name = support::JsonReader::Find(obj, "name")) stage.name = kReader.String(*name, where + ".name");
  if (auto inputs = support::JsonReader::Find(obj, "inputs")) {
    for (const auto& [key, source] : kReader.Object(*inputs, where + ".inputs")) {
      std::string name = kReader.String(key, where + ".inputs");
      std::string at = where + ".inputs." + name;
      if (auto input = source.try_cast<ffi::String>()) {
        stage.inputs.emplace_back(name, PipelineSource::Input(std::string(*input)));
      } else {
        auto [k, i] = StageOutputAt(source, at);
        stage.inputs.emplace_back(name, PipelineSource::StageOutput(k, i));
      }
    }
  }
  if (auto params = support::JsonReader::Find(obj, "params")) {
    for (const ffi::Any& p : kReader.Array(*params, where + ".params")) {
      stage.params.push_back(kReader.String(p, where + ".params"));
    }
  }
  if (auto cores = support::JsonReader::Find(obj, "cores")) {
    for (const ffi::Any& c : kReader.Array(*cores, where + ".cores")) stage.cores.push_back(IntAt(c, where + ".cores"));
  }
  if (auto threads = support::JsonReader::Find(obj, "num_threads")) stage.num_threads = IntAt(*threads, where + ".num_threads");
  return stage;
}

}  // namespace

PipelineConfig ParsePipelineConfig(const std::string& text) {
  json::Value doc = kReader.Parse(text, "JSON");
  json::Object obj = kReader.Object(doc, "top level");
  kReader.CheckKeys(obj, {"inputs", "stages", "outputs", "queue_capacity"}, "top level");
  PipelineConfig config;
  auto inputs = support::JsonReader::Find(obj, "inputs");
  auto stages = support::JsonReader::Find(obj, "stages");
  auto outputs = support::JsonReader::Find(obj, "outputs");
  if (!inputs || !stages || !outputs) kReader.Fail("top level", "'inputs', 'stages' and 'outputs' are required");
  for (const ffi::Any& name : kReader.Array(*inputs, "inputs")) config.inputs.push_back(kReader.String(name, "inputs"));
  json::Array stage_list = kReader.Array(*stages, "stages");
  for (size_t s = 0; s < stage_list.size(); ++s) {
    config.stages.push_back(StageAt(stage_list[s], "stages[" + std::to_string(s) + "]"));
  }
  json::Array output_list = kReader.Array(*outputs, "outputs");
  for (size_t i = 0; i < output_list.size(); ++i) {
    config.outputs.push_back(StageOutputAt(output_list[i], "outputs[" + std::to_string(i) + "]"));
  }
  if (auto capacity = support::JsonReader::Find(obj, "queue_capacity")) config.queue_capacity = IntAt(*capacity, "queue_capacity");
  return config;
}

// ---- life cycle ------------------------------------------------------------------------------

class PipelineExecutor::CallGuard {
 public:
  explicit CallGuard(PipelineExecutor* self) : self_(self) {
    std::lock_guard<std::mutex> lock(self_->mu_);
    ++self_->active_calls_;
  }
  ~CallGuard() {
    std::lock_guard<std::mutex> lock(self_->mu_);
    --self_->active_calls_;
    self_->changed_.notify_all();
  }

 private:
  PipelineExecutor* self_;
};

void PipelineExecutor::FrameQueue::Push(int frame) {
  ring[(head + size) % ring.size()] = frame;
  ++size;
  max_size = std::max(max_size, size);
}

int PipelineExecutor::FrameQueue::Pop() {
  int frame = ring[head];
  head = (head + 1) % ring.size();
  --size;
  return frame;
}

PipelineExecutor::~PipelineExecutor() {
  Shutdown();
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return active_calls_ == 0; });
}

void PipelineExecutor::Init(PipelineConfig config) {
  if (!stages_.empty()) TVM_FFI_THROW(RuntimeError) << "the pipeline is already initialised";
  if (config.stages.empty()) TVM_FFI_THROW(ValueError) << "a pipeline needs at least one stage";
  if (config.queue_capacity < 1) {
    TVM_FFI_THROW(ValueError) << "queue_capacity must be at least 1, got " << config.queue_capacity;
  }
  capacity_ = config.queue_capacity;
  SetupStages(config);
  SetupWiring(config);
  SetupFrames();
  StartWorkers();
}

void PipelineExecutor::SetupStages(PipelineConfig& config) {
  long num_cores = sysconf(_SC_NPROCESSORS_CONF);
  for (size_t s = 0; s < config.stages.size(); ++s) {
    PipelineStage& from = config.stages[s];
    Stage stage;
    stage.name = from.name.empty() ? "stage" + std::to_string(s) : from.name;
    std::string where = "stage " + std::to_string(s) + " '" + stage.name + "'";
    if (from.runtime == nullptr) TVM_FFI_THROW(ValueError) << where << ": no runtime";
    for (const Stage& other : stages_) {
      if (other.name == stage.name) TVM_FFI_THROW(ValueError) << where << ": another stage has this name";
      if (other.runtime == from.runtime) {
        TVM_FFI_THROW(ValueError) << where << ": its runtime is also stage '" << other.name
                                  << "' (two workers cannot share one runtime)";
      }
    }
    for (int core : from.cores) {
      if (core < 0 || core >= num_cores || core >= CPU_SETSIZE) {
        TVM_FFI_THROW(ValueError) << where << ": core " << core << " does not exist (this machine has cores 0-"
                                  << num_cores - 1 << ")";
      }
    }
    if (from.num_threads < 0) {
      TVM_FFI_THROW(ValueError) << where << ": num_threads must be >= 0 (0: TVM's default), got " << from.num_threads;
    }
    stage.runtime = std::move(from.runtime);
    stage.params = from.params;
    stage.cores = from.cores;
    stage.num_threads = from.num_threads;
    stages_.push_back(std::move(stage));
  }
}

int PipelineExecutor::StageOutputBoundary(int stage, int output) {
  int& b = output_boundary_[stage][output];
  if (b < 0) {
    const DLTensor* t = stages_[stage].runtime->GetOutput(output).GetDLTensorPtr();
    b = static_cast<int>(boundaries_.size());
    boundaries_.push_back(
        Boundary{std::vector<int64_t>(t->shape, t->shape + t->ndim), t->dtype, t->device,
                 "stage " + std::to_string(stage) + " '" + stages_[stage].name + "' output " + std::to_string(output)});
  }
  return b;
}

void PipelineExecutor::SetupWiring(const PipelineConfig& config) {
  input_names_ = config.inputs;
  std::vector<bool> input_used(input_names_.size(), false);
  for (size_t i = 0; i < input_names_.size(); ++i) {
    if (GetInputIndex(input_names_[i]) != static_cast<int>(i)) {
      TVM_FFI_THROW(ValueError) << "pipeline input '" << input_names_[i] << "' is listed twice";
    }
    // Shape and dtype come from the first stage that reads it.
    boundaries_.push_back(
        Boundary{{}, DLDataType{kDLFloat, 32, 1}, DLDevice{kDLCPU, 0}, "pipeline input '" + input_names_[i] + "'"});
  }
  for (const Stage& stage : stages_) output_boundary_.emplace_back(stage.runtime->NumOutputs(), -1);

  for (size_t s = 0; s < stages_.size(); ++s) {
    Stage& stage = stages_[s];
    const GraphRuntime& rt = *stage.runtime;
    std::string where = "stage " + std::to_string(s) + " '" + stage.name + "'";
    std::vector<bool> wired(rt.NumInputs(), false);
    for (const auto& [name, source] : config.stages[s].inputs) {
      int index = rt.GetInputIndex(name);
      if (index < 0) {
        TVM_FFI_THROW(KeyError) << where << ": wiring names input '" << name
                                << "', which the stage's graph does not have";
      }
      if (wired[index]) TVM_FFI_THROW(ValueError) << where << ": input '" << name << "' is wired twice";
      wired[index] = true;
      std::string at = where + " input '" + name + "'";
      int b;
      if (source.is_input()) {
        auto it = std::find(input_names_.begin(), input_names_.end(), source.input);
        if (it == input_names_.end()) {
          TVM_FFI_THROW(KeyError) << at << ": '" << source.input << "' is not a pipeline input";
        }
        b = static_cast<int>(it - input_names_.begin());
        if (!input_used[b]) {
          const DLTensor* t = rt.GetInput(index).GetDLTensorPtr();
          boundaries_[b].shape.assign(t->shape, t->shape + t->ndim);
          boundaries_[b].dtype = t->dtype;
          input_used[b] = true;
        }
      } else {
        if (source.stage >= static_cast<int>(s)) {
          TVM_FFI_THROW(ValueError) << at << ": comes from stage " << source.stage << ", which is not an earlier stage";
        }
        int num_outputs = stages_[source.stage].runtime->NumOutputs();
        if (source.output < 0 || source.output >= num_outputs) {
          TVM_FFI_THROW(IndexError) << at << ": stage " << source.stage << " '" << stages_[source.stage].name
                                    << "' has no output " << source.output << " (it has " << num_outputs << ")";
        }
        b = StageOutputBoundary(source.stage, source.output);
      }
      StageCopy feed{b, rt.GetInput(index), ffi::Tensor(), index};
      const DLTensor* dst = feed.stage_tensor.GetDLTensorPtr();
      const Boundary& from = boundaries_[b];
      if (!support::SameType(dst, from.shape, from.dtype)) {
        TVM_FFI_THROW(ValueError) << at << ": " << from.what << " is "
                                  << support::TypeString(from.shape.data(), from.shape.size(), from.dtype) << ", the input is "
                                  << support::TypeString(dst->shape, dst->ndim, dst->dtype);
      }
      if (support::NeedsStaging(from.device, dst->device)) {
        feed.staging = Empty(dst->shape, dst->ndim, dst->dtype, DLDevice{kDLCPU, 0});
      }
      stage.feeds.push_back(std::move(feed));
      stage.runtime->MarkInputSet(index);  // written by the feed copy before every Run
    }
    for (const std::string& name : stage.params) {
      int index = rt.GetInputIndex(name);
      if (index < 0) {
        TVM_FFI_THROW(KeyError) << where << ": parameter '" << name << "' is not an input of the stage's graph";
      }
      if (wired[index]) TVM_FFI_THROW(ValueError) << where << ": input '" << name << "' is both wired and a parameter";
      wired[index] = true;
    }
    for (int index = 0; index < rt.NumInputs(); ++index) {
      if (!wired[index]) {
        TVM_FFI_THROW(ValueError) << where << ": input '" << rt.GetInputName(index)
                                  << "' is neither wired nor declared a parameter";
      }
    }
  }
  for (size_t i = 0; i < input_names_.size(); ++i) {
    if (!input_used[i]) TVM_FFI_THROW(ValueError) << "pipeline input '" << input_names_[i] << "' feeds no stage";
  }
  if (config.outputs.empty()) TVM_FFI_THROW(ValueError) << "a pipeline needs at least one output";
  for (size_t i = 0; i < config.outputs.size(); ++i) {
    auto [s, index] = config.outputs[i];
    if (s < 0 || s >= NumStages()) {
      TVM_FFI_THROW(IndexError) << "pipeline output " << i << ": there is no stage " << s;
    }
    if (index < 0 || index >= stages_[s].runtime->NumOutputs()) {
      TVM_FFI_THROW(IndexError) << "pipeline output " << i << ": stage " << s << " '" << stages_[s].name
                                << "' has no output " << index;
    }
    output_boundaries_.push_back(StageOutputBoundary(s, index));
  }
  for (size_t s = 0; s < stages_.size(); ++s) {
    Stage& stage = stages_[s];
    for (int index = 0; index < stage.runtime->NumOutputs(); ++index) {
      if (output_boundary_[s][index] >= 0) {
        stage.drains.push_back(
            StageCopy{output_boundary_[s][index], stage.runtime->GetOutput(index), ffi::Tensor(), index});
      }
    }
  }
}

void PipelineExecutor::SetupFrames() {
  size_t num_stages = stages_.size();
  size_t num_frames = (num_stages + 1) * capacity_ + num_stages + 1;
  for (size_t f = 0; f < num_frames; ++f) {
    for (const Boundary& b : boundaries_) {
      frame_tensors_.push_back(Empty(b.shape.data(), b.shape.size(), b.dtype, b.device));
      frame_ptrs_.push_back(support::Mutable(frame_tensors_.back()));
    }
  }
  for (size_t f = num_frames; f-- > 0;) free_frames_.push_back(static_cast<int>(f));
  for (size_t q = 0; q <= num_stages; ++q) {
    queues_.push_back(std::make_unique<FrameQueue>());
    queues_.back()->ring.assign(capacity_, -1);
  }
  for (Stage& stage : stages_) SetupStageFrames(stage);
  for (Stage& stage : stages_) {
    for (const StageCopy& feed : stage.feeds) {
      DLDevice dev = support::CopyApiDevice(boundaries_[feed.boundary].device, feed.stage_tensor.device());
      if (!support::IsHost(dev)) support::AddUnique(&stage.feed_devices, dev);
    }
    for (const StageCopy& drain : stage.drains) {
      if (!support::IsHost(drain.stage_tensor.device())) support::AddUnique(&stage.drain_devices, drain.stage_tensor.device());
    }
  }
}

void PipelineExecutor::SetupStageFrames(Stage& stage) {
  const size_t num_frames = frame_ptrs_.size() / std::max<size_t>(boundaries_.size(), 1);
  stage.copies_without_frames = static_cast<int64_t>(stage.feeds.size() + stage.drains.size());
  FrameOptions options;
  for (const std::string& name : stage.params) options.shared_inputs.push_back(stage.runtime->GetInputIndex(name));
  options.share_call_sites = true;  // the stage's one worker runs its frames one after another
  // Remote devices: the runtime's own frame, boundaries copied.
  if (!stage.runtime->FramesSupported()) return;
  for (size_t f = 0; f < num_frames; ++f) stage.frames.push_back(stage.runtime->Frame(options));
  const size_t num_boundaries = boundaries_.size();
  auto tensor = [&](size_t f, int b) { return frame_tensors_[f * num_boundaries + b]; };
  // A boundary binds where its tensor can stand in for the stage's own without a copy: the device
  // record says the two devices share memory (boundary tensors are allocated aligned, at offset 0).
  // An output also needs a step of its own writing it (RunFrame::OutputBindable).
  std::vector<StageCopy> feeds, drains;
  for (StageCopy& feed : stage.feeds) {
    if (support::ReadableInPlace(boundaries_[feed.boundary].device, feed.stage_tensor.device())) {
      for (size_t f = 0; f < num_frames; ++f) stage.frames[f]->BindInput(feed.index, tensor(f, feed.boundary));
    } else {
      for (size_t f = 0; f < num_frames; ++f) stage.frames[f]->MarkInputSet(feed.index);  // written by the copy
      feeds.push_back(std::move(feed));
    }
  }
  for (StageCopy& drain : stage.drains) {
    if (stage.frames[0]->OutputBindable(drain.index) &&
        support::ReadableInPlace(boundaries_[drain.boundary].device, drain.stage_tensor.device())) {
      for (size_t f = 0; f < num_frames; ++f) stage.frames[f]->BindOutput(drain.index, tensor(f, drain.boundary));
    } else {
      drains.push_back(std::move(drain));
    }
  }
  stage.feeds = std::move(feeds);
  stage.drains = std::move(drains);
  for (size_t f = 0; f < num_frames; ++f) {
    for (const StageCopy& feed : stage.feeds) stage.feed_to.push_back(support::Mutable(stage.frames[f]->GetInput(feed.index)));
    for (const StageCopy& drain : stage.drains) {
      stage.drain_from.push_back(support::Mutable(stage.frames[f]->GetOutput(drain.index)));
    }
  }
}

void PipelineExecutor::StartWorkers() {
  try {
    for (size_t s = 0; s < stages_.size(); ++s) stages_[s].thread = std::thread(&PipelineExecutor::Work, this, s);
  } catch (const std::system_error& err) {
    Shutdown();
    TVM_FFI_THROW(RuntimeError) << "cannot start the pipeline's worker threads: " << err.what();
  }
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return workers_ready_ == NumStages(); });
  if (failure_) {
    lock.unlock();
    Shutdown();
    lock.lock();
    ThrowStoppedLocked();
  }
}

void PipelineExecutor::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    StopLocked();
  }
  std::lock_guard<std::mutex> lock(join_mu_);
  for (Stage& stage : stages_) {
    if (stage.thread.joinable()) stage.thread.join();
  }
}

void PipelineExecutor::StopLocked() {
  stopped_ = true;
  for (auto& q : queues_) {
    q->ready.notify_all();
    q->space.notify_all();
  }
  changed_.notify_all();
}

void PipelineExecutor::FailLocked(int s, const std::string& kind, const std::string& message,
                                  const std::string& backtrace) {
  if (!failure_) {
    failure_ = Failure{kind, "pipeline stage " + std::to_string(s) + " '" + stages_[s].name + "' failed: " + message,
                       backtrace};
  }
  StopLocked();
}

void PipelineExecutor::ThrowStoppedLocked() const {
  if (failure_) throw ffi::Error(failure_->kind, failure_->message, failure_->backtrace);
  TVM_FFI_THROW(RuntimeError) << "the pipeline has been shut down";
  TVM_FFI_UNREACHABLE();
}

// ---- workers -------------------------------------------------------------------------------

void PipelineExecutor::ConfigureWorkerThread(const Stage& stage) const {
  support::ConfigureCurrentThread(stage.cores, stage.num_threads, support::CoreSharing::kShareAllCores);
}

void PipelineExecutor::Work(int s) {
  Stage& stage = stages_[s];
  try {
    ConfigureWorkerThread(stage);
  } catch (const ffi::Error& err) {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(s, err.kind(), "setting up its worker thread: " + err.message(), err.backtrace());
  } catch (const std::exception& err) {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(s, "RuntimeError", std::string("setting up its worker thread: ") + err.what(), "");
  }
  FrameQueue& in = *queues_[s];
  FrameQueue& out = *queues_[s + 1];
  bool last = s + 1 == NumStages();
  std::unique_lock<std::mutex> lock(mu_);
  ++workers_ready_;
  changed_.notify_all();
  while (true) {
    in.ready.wait(lock, [&] { return stopped_ || in.size > 0; });
    if (stopped_) return;
    int frame = in.Pop();
    in.space.notify_one();
    lock.unlock();
    Clock::time_point start = Clock::now();
    try {
      RunStage(stage, frame);
    } catch (const ffi::Error& err) {
      lock.lock();
      FailLocked(s, err.kind(), err.message(), err.backtrace());
      return;
    } catch (const std::exception& err) {
      lock.lock();
      FailLocked(s, "RuntimeError", err.what(), "");
      return;
    }
    double busy = std::chrono::duration<double>(Clock::now() - start).count();
    lock.lock();
    stage.busy_s += busy;
    ++stage.count;
    out.space.wait(lock, [&] { return stopped_ || !out.full(); });
    if (stopped_) return;
    out.Push(frame);
    completed_ += last;
    out.ready.notify_one();
  }
}

void PipelineExecutor::RunStage(Stage& stage, int frame) {
  if (!stage.frames.empty()) {
    // Bound boundaries are read and written in place; the rest is copied to and from this frame's.
    const size_t num_feeds = stage.feeds.size(), num_drains = stage.drains.size();
    for (size_t k = 0; k < num_feeds; ++k) {
      const StageCopy& feed = stage.feeds[k];
      support::CopyAcrossDevices(FrameTensor(frame, feed.boundary), stage.feed_to[frame * num_feeds + k],
                                 feed.staging.defined() ? support::Mutable(feed.staging) : nullptr);
    }
    for (const DLDevice& dev : stage.feed_devices) DeviceAPI::Get(dev)->StreamSync(dev, nullptr);
    stage.frames[frame]->Run();
    for (size_t k = 0; k < num_drains; ++k) {
      support::CopyAcrossDevices(stage.drain_from[frame * num_drains + k], FrameTensor(frame, stage.drains[k].boundary));
    }
    for (const DLDevice& dev : stage.drain_devices) DeviceAPI::Get(dev)->StreamSync(dev, nullptr);
    return;
  }
  for (const StageCopy& feed : stage.feeds) {
    support::CopyAcrossDevices(FrameTensor(frame, feed.boundary), support::Mutable(feed.stage_tensor),
                      feed.staging.defined() ? support::Mutable(feed.staging) : nullptr);
  }
  // The copies must land before the stage's kernels, which may run on another device's stream.
  for (const DLDevice& dev : stage.feed_devices) DeviceAPI::Get(dev)->StreamSync(dev, nullptr);
  stage.runtime->Run();
  for (const StageCopy& drain : stage.drains) {
    support::CopyAcrossDevices(drain.stage_tensor.GetDLTensorPtr(), FrameTensor(frame, drain.boundary));
  }
  // The next stage reads the frame from another thread.
  for (const DLDevice& dev : stage.drain_devices) DeviceAPI::Get(dev)->StreamSync(dev, nullptr);
}

// ---- submitting and collecting ---------------------------------------------------------------

int PipelineExecutor::GetInputIndex(const std::string& name) const {
  auto it = std::find(input_names_.begin(), input_names_.end(), name);
  return it == input_names_.end() ? -1 : static_cast<int>(it - input_names_.begin());
}

void PipelineExecutor::CheckBoundary(int b, const DLTensor* value, const std::string& what) const {
  const Boundary& boundary = boundaries_[b];
  if (!support::SameType(value, boundary.shape, boundary.dtype)) {
    TVM_FFI_THROW(ValueError) << what << ": expected "
                              << support::TypeString(boundary.shape.data(), boundary.shape.size(), boundary.dtype) << ", got "
                              << support::TypeString(value->shape, value->ndim, value->dtype);
  }
  if (!support::IsContiguous(value)) TVM_FFI_THROW(ValueError) << what << ": tensor must be contiguous";
}

bool PipelineExecutor::Run(const std::vector<const DLTensor*>& inputs, bool block) {
  CallGuard guard(this);
  if (inputs.size() != input_names_.size()) {
    TVM_FFI_THROW(ValueError) << "Run: expected " << input_names_.size() << " pipeline inputs, got " << inputs.size();
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Boundary& b = boundaries_[i];
    if (!support::SameType(inputs[i], b.shape, b.dtype) || !support::IsContiguous(inputs[i])) {
      CheckBoundary(i, inputs[i], "Run: " + b.what);
    }
  }
  std::unique_lock<std::mutex> submit(submit_mu_, std::defer_lock);
  if (block) {
    submit.lock();
  } else if (!submit.try_lock()) {
    return false;
  }
  FrameQueue& first = *queues_.front();
  int frame;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!block && !stopped_ && first.full()) return false;
    first.space.wait(lock, [&] { return stopped_ || !first.full(); });
    if (stopped_) ThrowStoppedLocked();
    if (free_frames_.empty()) TVM_FFI_THROW(InternalError) << "pipeline: no free frame (see the count in Init)";
    frame = free_frames_.back();
    free_frames_.pop_back();
    if (submitted_ == 0) first_run_ = Clock::now();
    ++submitted_;
  }
  try {
    for (size_t i = 0; i < inputs.size(); ++i) support::CopyAcrossDevices(inputs[i], FrameTensor(frame, i));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    free_frames_.push_back(frame);
    --submitted_;
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) ThrowStoppedLocked();
  // Only the holder of submit_mu_ pushes here, so the room found above is still there.
  first.Push(frame);
  first.ready.notify_one();
  return true;
}

bool PipelineExecutor::GetOutput(const std::vector<DLTensor*>& outputs, bool block) {
  CallGuard guard(this);
  if (outputs.size() != output_boundaries_.size()) {
    TVM_FFI_THROW(ValueError) << "GetOutput: expected " << output_boundaries_.size() << " output tensors, got "
                              << outputs.size();
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Boundary& b = boundaries_[output_boundaries_[i]];
    if (!support::SameType(outputs[i], b.shape, b.dtype) || !support::IsContiguous(outputs[i])) {
      CheckBoundary(output_boundaries_[i], outputs[i], "GetOutput: output " + std::to_string(i) + " (" + b.what + ")");
    }
  }
  std::unique_lock<std::mutex> collect = LockCollect(block);
  int frame = collect.owns_lock() ? TakeFinished(block) : -1;
  if (frame < 0) return false;
  CopyOutAndRelease(frame, outputs);
  return true;
}

std::optional<std::vector<ffi::Tensor>> PipelineExecutor::GetOutput(bool block) {
  CallGuard guard(this);
  std::unique_lock<std::mutex> collect = LockCollect(block);
  int frame = collect.owns_lock() ? TakeFinished(block) : -1;
  if (frame < 0) return std::nullopt;
  std::vector<ffi::Tensor> tensors;
  std::vector<DLTensor*> outputs;
  for (int b : output_boundaries_) {
    const DLTensor* t = FrameTensor(frame, b);
    tensors.push_back(Empty(t->shape, t->ndim, t->dtype, t->device));
    outputs.push_back(support::Mutable(tensors.back()));
  }
  CopyOutAndRelease(frame, outputs);
  return tensors;
}

std::unique_lock<std::mutex> PipelineExecutor::LockCollect(bool block) {
  std::unique_lock<std::mutex> collect(collect_mu_, std::defer_lock);
  if (block) {
    collect.lock();
  } else {
    collect.try_lock();  // another consumer holds it: "not ready" for this one
  }
  return collect;
}

int PipelineExecutor::TakeFinished(bool block) {
  FrameQueue& done = *queues_.back();
  std::unique_lock<std::mutex> lock(mu_);
  while (done.size == 0) {
    if (stopped_) {
      if (!failure_) ThrowStoppedLocked();
      lock.unlock();
      Shutdown();  // the workers are leaving; wait for them, so that none outlives the error
      lock.lock();
      ThrowStoppedLocked();
    }
    if (!block) return -1;
    done.ready.wait(lock);  // with nothing in flight, for a Run from another thread
  }
  int frame = done.Pop();
  done.space.notify_one();
  return frame;
}

void PipelineExecutor::CopyOutAndRelease(int frame, const std::vector<DLTensor*>& outputs) {
  try {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const DLTensor* src = FrameTensor(frame, output_boundaries_[i]);
      support::CopyOnce(src, outputs[i]);
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    free_frames_.push_back(frame);
    ++returned_;
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  free_frames_.push_back(frame);
  ++returned_;
}

int64_t PipelineExecutor::NumInFlight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return submitted_ - returned_;
}

// ---- parameters ------------------------------------------------------------------------------

const PipelineExecutor::Stage& PipelineExecutor::CheckedStage(int s) const {
  if (s < 0 || s >= NumStages()) {
    TVM_FFI_THROW(IndexError) << "there is no stage " << s << " (the pipeline has " << NumStages() << ")";
  }
  return stages_[s];
}

int PipelineExecutor::CheckedParamIndex(int s, const std::string& name) const {
  const Stage& stage = CheckedStage(s);
  if (std::find(stage.params.begin(), stage.params.end(), name) == stage.params.end()) {
    TVM_FFI_THROW(KeyError) << "stage " << s << " '" << stage.name << "': '" << name
                            << "' is not one of its declared parameters";
  }
  return stage.runtime->GetInputIndex(name);
}

void PipelineExecutor::CheckIdleLocked() const {
  if (submitted_ != returned_) {
    TVM_FFI_THROW(RuntimeError) << "set parameters only while no inference is in flight (" << submitted_ - returned_
                                << " are)";
  }
}

void PipelineExecutor::SetParam(int s, const std::string& name, const DLTensor* value) {
  CallGuard guard(this);
  int index = CheckedParamIndex(s, name);
  std::lock_guard<std::mutex> lock(mu_);
  CheckIdleLocked();
  stages_[s].runtime->SetParam(index, value);
}

void PipelineExecutor::SetParams(int s, const ffi::Map<ffi::String, ffi::Tensor>& params) {
  CallGuard guard(this);
  if (s >= 0) CheckedStage(s);
  // (stage, input index, value) for every assignment, all checked before any is made.
  std::vector<std::tuple<int, int, ffi::Tensor>> sets;
  for (const auto& [name, value] : params) {
    std::string n(name);
    if (s >= 0) {
      sets.emplace_back(s, CheckedParamIndex(s, n), value);
      continue;
    }
    size_t before = sets.size();
    for (int k = 0; k < NumStages(); ++k) {
      const std::vector<std::string>& declared = stages_[k].params;
      if (std::find(declared.begin(), declared.end(), n) != declared.end()) {
        sets.emplace_back(k, stages_[k].runtime->GetInputIndex(n), value);
      }
    }
    if (sets.size() == before) TVM_FFI_THROW(KeyError) << "'" << n << "' is a parameter of no stage";
  }
  for (const auto& [k, index, value] : sets) {
    stages_[k].runtime->CheckInputValue(index, value.GetDLTensorPtr(),
                                        "stage " + std::to_string(k) + " '" + stages_[k].name + "': parameter '" +
                                            stages_[k].runtime->GetInputName(index) + "'");
  }
  std::lock_guard<std::mutex> lock(mu_);
  CheckIdleLocked();
  // Through the runtime's parameter path, so caches derived from the old values are dropped.
  for (const auto& [k, index, value] : sets) stages_[k].runtime->SetParam(index, value.GetDLTensorPtr());
}

void PipelineExecutor::LoadParams(int s, const std::string& param_bytes) {
  ffi::Map<ffi::String, ffi::Tensor> params;
  for (NamedParam& p : ReadParamBlob(param_bytes, "load_params")) params.Set(p.name, p.value);
  SetParams(s, params);
}

// ---- stats -----------------------------------------------------------------------------------

std::string PipelineExecutor::StatsJSON() const {
  json::Array stages;
  json::Object totals;
  {
    std::lock_guard<std::mutex> lock(mu_);
    double elapsed = submitted_ == 0 ? 0.0 : std::chrono::duration<double>(Clock::now() - first_run_).count();
    int64_t boundary_copies = 0, copies_without_frames = 0;
    for (size_t s = 0; s < stages_.size(); ++s) {
      const Stage& stage = stages_[s];
      boundary_copies += static_cast<int64_t>(stage.feeds.size() + stage.drains.size());
      copies_without_frames += stage.copies_without_frames;
      stages.push_back(json::Object{{ffi::String("name"), ffi::String(stage.name)},
                                    {ffi::String("busy_s"), stage.busy_s},
                                    {ffi::String("inferences"), stage.count},
                                    {ffi::String("queue_depth"), int64_t(queues_[s]->size)},
                                    {ffi::String("queue_max"), int64_t(queues_[s]->max_size)}});
    }
    const FrameQueue& done = *queues_.back();
    totals = json::Object{
        {ffi::String("stages"), stages},
        {ffi::String("output_queue_depth"), int64_t(done.size)},
        {ffi::String("output_queue_max"), int64_t(done.max_size)},
        {ffi::String("queue_capacity"), int64_t(capacity_)},
        {ffi::String("num_frames"), int64_t(frame_ptrs_.size() / std::max<size_t>(boundaries_.size(), 1))},
        {ffi::String("submitted"), submitted_},
        {ffi::String("total_inferences"), completed_},
        {ffi::String("returned"), returned_},
        {ffi::String("in_flight"), submitted_ - returned_},
        {ffi::String("elapsed_s"), elapsed},
        {ffi::String("throughput"), elapsed > 0 ? static_cast<double>(completed_) / elapsed : 0.0},
        {ffi::String("stopped"), stopped_},
        {ffi::String("boundary_copies"), boundary_copies},
        {ffi::String("boundary_copies_without_frames"), copies_without_frames},
        {ffi::String("failed"), failure_.has_value()},
    };
  }
  return std::string(json::Stringify(totals));
}

}  // namespace tvm_hetero
