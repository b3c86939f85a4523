/*!
 * \file pipeline_executor_test.cc
 * \brief The pipeline executor in a pure C++ program: stages are graph runtimes over kernels written
 *        here; every result is compared bit for bit with running the stages one after another.
 */
#include <gtest/gtest.h>
#include <sched.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm_hetero/pipeline_executor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_kernels.h"

namespace tvm_hetero {
namespace {

namespace ffi = tvm::ffi;
using Values = std::vector<float>;

/*!
 * \brief A TVM pool thread spins (300000 yields by default) before it sleeps or sees that its pool is
 *        going away, so joining a stage worker that configured a pool waits for the spin: seconds on
 *        a loaded machine. The tests do not need the spin; a user's own setting is kept.
 */
const bool kNoPoolSpin = [] { return setenv("TVM_THREAD_POOL_SPIN_COUNT", "0", /*overwrite=*/0) == 0; }();

/*! \brief Elements of every tensor in these graphs. */
constexpr int64_t kN = 16;
/*! \brief An input whose first element is this makes the `guard` kernel fail. */
constexpr float kPoison = 666.0f;
/*! \brief Microseconds the `slow` kernel sleeps. */
std::atomic<int> g_slow_us{0};
/*! \brief CPU the `where` kernel last ran on. */
std::atomic<int> g_where_cpu{-1};

/*! \brief Elementwise float32 kernels: add, sub, mul; guard (add that fails on kPoison); slow (add
 *         after g_slow_us); where (add that records its CPU). */
class PipeKernels : public ffi::ModuleObj {
 public:
  const char* kind() const final { return "tvm_hetero.PipeKernels"; }
  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    auto add = [](float a, float b) { return a + b; };
    if (name == "add") return Elementwise(add);
    if (name == "sub") return Elementwise([](float a, float b) { return a - b; });
    if (name == "mul") return Elementwise([](float a, float b) { return a * b; });
    if (name == "guard") {
      return Elementwise(add, [](const float* a) {
        if (a[0] == kPoison) TVM_FFI_THROW(ValueError) << "guard: poison value in the input";
      });
    }
    if (name == "slow") {
      return Elementwise(add, [](const float*) { std::this_thread::sleep_for(std::chrono::microseconds(g_slow_us)); });
    }
    if (name == "where") return Elementwise(add, [](const float*) { g_where_cpu = sched_getcpu(); });
    return std::nullopt;
  }

 private:
  template <typename F, typename Before = void (*)(const float*)>
  static ffi::Function Elementwise(F f, Before before = [](const float*) {}) {
    return ffi::Function::FromTyped([f, before](DLTensor* a, DLTensor* b, DLTensor* out) {
      before(static_cast<const float*>(a->data));
      testing::ElementwiseFloat32(f, a, b, out);
    });
  }
};

/*! \brief A kernel node: `func` over the nodes `inputs` (graph inputs first, then ops, in order). */
struct OpSpec {
  std::string name, func;
  std::vector<int> inputs;
};

/*! \brief Graph JSON: null nodes `inputs`, then `ops`; every entry is `dtype`[n]; outputs `heads`. */
std::string GraphJSON(const std::vector<std::string>& inputs, const std::vector<OpSpec>& ops,
                      const std::vector<int>& heads, int64_t n = kN, const std::string& dtype = "float32") {
  std::ostringstream nodes, shapes, dtypes, sids, ptr, arg_nodes, out;
  size_t total = inputs.size() + ops.size();
  for (size_t i = 0; i < inputs.size(); ++i) {
    nodes << (i ? "," : "") << R"({"op": "null", "name": ")" << inputs[i] << R"(", "inputs": []})";
    arg_nodes << (i ? "," : "") << i;
  }
  for (const OpSpec& op : ops) {
    nodes << R"(,{"op": "tvm_op", "name": ")" << op.name << R"(", "inputs": [)";
    for (size_t k = 0; k < op.inputs.size(); ++k) nodes << (k ? "," : "") << "[" << op.inputs[k] << ", 0, 0]";
    nodes << R"(], "attrs": {"func_name": ")" << op.func << R"(", "num_inputs": ")" << op.inputs.size()
          << R"(", "num_outputs": "1", "flatten_data": "0"}})";
  }
  for (size_t e = 0; e < total; ++e) {
    shapes << (e ? "," : "") << "[" << n << "]";
    dtypes << (e ? "," : "") << "\"" << dtype << "\"";
    sids << (e ? "," : "") << e;
    ptr << e << ",";
  }
  ptr << total;
  for (size_t h = 0; h < heads.size(); ++h) out << (h ? "," : "") << "[" << heads[h] << ", 0, 0]";
  return R"({"nodes": [)" + nodes.str() + R"(], "arg_nodes": [)" + arg_nodes.str() + R"(], "node_row_ptr": [)" +
         ptr.str() + R"(], "heads": [)" + out.str() + R"(], "attrs": {"shape": ["list_shape", [)" + shapes.str() +
         R"(]], "dltype": ["list_str", [)" + dtypes.str() + R"(]], "storage_id": ["list_int", [)" + sids.str() + "]]}}";
}

/*! \brief Aborts the test program if a scope takes longer than `seconds` (a hang must fail, not stall). */
class Watchdog {
 public:
  explicit Watchdog(const char* what, int seconds = 30)
      : thread_([this, what, seconds] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "watchdog: '%s' still running after %d s: hang\n", what, seconds);
            std::_Exit(3);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/*! \brief A float32[kN] tensor over `values`. */
DLTensor View(Values& values) {
  static int64_t shape[1] = {kN};
  return DLTensor{values.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
}

/*! \brief Views of several value vectors, with the pointer lists Run and GetOutput take. */
struct Views {
  explicit Views(std::vector<Values>& values) {
    for (Values& v : values) tensors.push_back(View(v));
    for (DLTensor& t : tensors) {
      in.push_back(&t);
      out.push_back(&t);
    }
  }
  /*! \brief One view per vector. */
  std::vector<DLTensor> tensors;
  /*! \brief The views, as Run takes them. */
  std::vector<const DLTensor*> in;
  /*! \brief The views, as GetOutput takes them. */
  std::vector<DLTensor*> out;
};

/*! \brief Submits every input from its own thread; on destruction shuts the pipeline down (waking the
 *         thread if it is blocked) and joins it, so that a failed assertion cannot leave it running. */
class Producer {
 public:
  Producer(PipelineExecutor* pipeline, std::vector<std::vector<Values>>* inputs, std::atomic<int>* submitted = nullptr)
      : pipeline_(pipeline), thread_([=] {
          try {
            for (std::vector<Values>& one : *inputs) {
              pipeline->Run(Views(one).in);
              if (submitted) ++*submitted;
            }
          } catch (const ffi::Error& err) {
            error_ = err.message();
          }
        }) {}
  /*! \brief Wait for the thread to submit everything (or fail); returns its error message, if any. */
  std::string Join() {
    thread_.join();
    return error_;
  }
  ~Producer() {
    if (thread_.joinable()) {
      pipeline_->Shutdown();
      thread_.join();
    }
  }

 private:
  PipelineExecutor* pipeline_;
  std::string error_;
  std::thread thread_;
};

Values RandomValues(std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  Values v(kN);
  for (float& x : v) x = dist(rng);
  return v;
}

class PipelineExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lib_ = ffi::Module(ffi::make_object<PipeKernels>());
    g_slow_us = 0;
  }

  std::shared_ptr<GraphRuntime> Runtime(const std::string& json, DLDevice dev = {kDLCPU, 0}) {
    auto rt = std::make_shared<GraphRuntime>();
    rt->Init(json, *lib_, {dev});
    return rt;
  }

  /*!
   * \brief front(x, y) = [x + y, x * y] on cpu:0; back(A, B; W) = [A * W + B] on cpu:1.
   *        Outputs: back's, then front's second (a stage output that is also a pipeline output).
   */
  PipelineConfig TwoStages(const std::string& back_func = "add") {
    PipelineConfig config;
    config.inputs = {"x", "y"};
    PipelineStage front;
    front.name = "front";
    front.runtime = Runtime(GraphJSON({"x", "y"}, {{"s", "add", {0, 1}}, {"p", "mul", {0, 1}}}, {2, 3}));
    front.inputs = {{"x", PipelineSource::Input("x")}, {"y", PipelineSource::Input("y")}};
    PipelineStage back;
    back.name = "back";
    back.runtime =
        Runtime(GraphJSON({"A", "B", "W"}, {{"r", "mul", {0, 2}}, {"q", back_func, {3, 1}}}, {4}), {kDLCPU, 1});
    back.inputs = {{"A", PipelineSource::StageOutput(0, 0)}, {"B", PipelineSource::StageOutput(0, 1)}};
    back.params = {"W"};
    config.stages = {front, back};
    config.outputs = {{1, 0}, {0, 1}};
    return config;
  }

  /*! \brief TwoStages plus tail(Q, y, S) = [(Q + y) - S]: a pipeline input and a stage-0 output skip stage 1. */
  PipelineConfig ThreeStages() {
    PipelineConfig config = TwoStages();
    PipelineStage tail;
    tail.name = "tail";
    tail.runtime = Runtime(GraphJSON({"Q", "y", "S"}, {{"u", "add", {0, 1}}, {"z", "sub", {3, 2}}}, {4}));
    tail.inputs = {{"Q", PipelineSource::StageOutput(1, 0)},
                   {"y", PipelineSource::Input("y")},
                   {"S", PipelineSource::StageOutput(0, 0)}};
    config.stages.push_back(tail);
    config.outputs = {{2, 0}, {1, 0}};
    return config;
  }

  /*! \brief Set parameter W of the `back` stage in the pipeline and in a reference config. */
  void SetW(PipelineExecutor* pipeline, PipelineConfig* reference) {
    Values w(kN);
    for (int64_t i = 0; i < kN; ++i) w[i] = 0.5f + 0.25f * i;
    DLTensor t = View(w);
    if (pipeline) pipeline->SetParam(1, "W", &t);
    if (reference) reference->stages[1].runtime->SetInput(reference->stages[1].runtime->GetInputIndex("W"), &t);
  }

  /*! \brief The stages of `config` run one after another, following its wiring. */
  static std::vector<Values> Sequential(const PipelineConfig& config, std::vector<Values> inputs) {
    std::vector<std::vector<Values>> stage_outputs;
    for (const PipelineStage& stage : config.stages) {
      for (const auto& [name, source] : stage.inputs) {
        Values* value;
        if (source.is_input()) {
          size_t i = std::find(config.inputs.begin(), config.inputs.end(), source.input) - config.inputs.begin();
          value = &inputs[i];
        } else {
          value = &stage_outputs[source.stage][source.output];
        }
        DLTensor t = View(*value);
        stage.runtime->SetInput(stage.runtime->GetInputIndex(name), &t);
      }
      stage.runtime->Run();
      stage_outputs.emplace_back();
      for (int o = 0; o < stage.runtime->NumOutputs(); ++o) {
        Values v(kN);
        DLTensor t = View(v);
        stage.runtime->CopyOutputTo(o, &t);
        stage_outputs.back().push_back(v);
      }
    }
    std::vector<Values> outputs;
    for (auto [s, o] : config.outputs) outputs.push_back(stage_outputs[s][o]);
    return outputs;
  }

  /*! \brief Submit `inputs` in order and collect every output from one thread, never blocking forever. */
  static std::vector<std::vector<Values>> RunAll(PipelineExecutor& pipeline, std::vector<std::vector<Values>>& inputs) {
    std::vector<std::vector<Values>> results;
    for (std::vector<Values>& one : inputs) {
      Views views(one);
      while (!pipeline.Run(views.in, /*block=*/false)) results.push_back(Collect(pipeline));
    }
    while (results.size() < inputs.size()) results.push_back(Collect(pipeline));
    return results;
  }

  /*! \brief The next outputs (blocking GetOutput) as value vectors. */
  static std::vector<Values> Collect(PipelineExecutor& pipeline) {
    std::vector<Values> got(pipeline.NumOutputs(), Values(kN));
    pipeline.GetOutput(Views(got).out, /*block=*/true);
    return got;
  }

  /*! \brief StatsJSON, parsed. */
  static ffi::json::Object Stats(const PipelineExecutor& pipeline) {
    return ffi::json::Parse(pipeline.StatsJSON()).cast<ffi::json::Object>();
  }

  /*! \brief An integer field of a stats object. */
  static int64_t Field(const ffi::json::Object& obj, const char* key) {
    return obj.at(ffi::String(key)).cast<int64_t>();
  }

  /*! \brief Whether `pred` of the stats comes to hold and stays so for 50 ms (waiting 10 s at most). */
  template <typename Pred>
  static bool Settles(const PipelineExecutor& pipeline, Pred pred) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int stable = 0;
    while (std::chrono::steady_clock::now() < deadline && stable < 10) {
      stable = pred(Stats(pipeline)) ? stable + 1 : 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return stable >= 10;
  }

  /*! \brief `f` throws an ffi::Error whose message contains `expected`. */
  static void ExpectError(const std::function<void()>& f, const std::string& expected) {
    try {
      f();
      ADD_FAILURE() << "no error; expected: " << expected;
    } catch (const ffi::Error& err) {
      EXPECT_NE(err.message().find(expected), std::string::npos) << err.message();
    }
  }

  /*! \brief Init of `config` throws naming `expected`. */
  void ExpectInitError(PipelineConfig config, const std::string& expected) {
    ExpectError([&] { PipelineExecutor().Init(std::move(config)); }, expected);
  }

  /*! \brief The PipeKernels library. */
  ffi::Optional<ffi::Module> lib_;
};

std::vector<std::vector<Values>> RandomInputs(int count, int num_inputs, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<Values>> inputs(count);
  for (auto& one : inputs) {
    for (int i = 0; i < num_inputs; ++i) one.push_back(RandomValues(rng));
  }
  return inputs;
}

/*! \brief Make `guard`, in stage `back`, fail on this inference: r[0] = (x[0] + y[0]) * W[0] = kPoison. */
void Poison(std::vector<Values>* inputs) {
  (*inputs)[0][0] = 2 * kPoison - 1;
  (*inputs)[1][0] = 1;
}

void ExpectBitIdentical(const std::vector<Values>& got, const std::vector<Values>& want, int inference) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < got.size(); ++o) {
    ASSERT_EQ(std::memcmp(got[o].data(), want[o].data(), kN * sizeof(float)), 0)
        << "inference " << inference << " output " << o << " differs from the sequential result";
  }
}

TEST_F(PipelineExecutorTest, TwoStagesMatchSequentialBitExactlyInOrder) {
  Watchdog watchdog("two stages");
  PipelineConfig reference = TwoStages();
  PipelineExecutor pipeline;
  pipeline.Init(TwoStages());
  SetW(&pipeline, &reference);
  constexpr int kCount = 1000;
  auto inputs = RandomInputs(kCount, 2, 1);
  // A producer thread submits (blocking when full) while this thread collects.
  Producer producer(&pipeline, &inputs);
  for (int i = 0; i < kCount; ++i) {
    ExpectBitIdentical(Collect(pipeline), Sequential(reference, inputs[i]), i);
  }
  EXPECT_EQ(producer.Join(), "");
  Values unused(kN);
  DLTensor a = View(unused), b = View(unused);
  EXPECT_FALSE(pipeline.GetOutput({&a, &b}, /*block=*/false));  // nothing left: "not ready"
  ffi::json::Object stats = Stats(pipeline);
  EXPECT_EQ(Field(stats, "total_inferences"), kCount);
  EXPECT_EQ(Field(stats, "returned"), kCount);
  EXPECT_GT(stats.at(ffi::String("throughput")).cast<double>(), 0.0);
  for (const ffi::Any& s : stats.at(ffi::String("stages")).cast<ffi::json::Array>()) {
    auto stage = s.cast<ffi::json::Object>();
    EXPECT_EQ(Field(stage, "inferences"), kCount);
    EXPECT_LE(Field(stage, "queue_max"), pipeline.queue_capacity());
  }
}

TEST_F(PipelineExecutorTest, ThreeStagesWithSkipConnectionsMatchSequential) {
  Watchdog watchdog("three stages");
  PipelineConfig reference = ThreeStages();
  PipelineConfig config = ThreeStages();
  config.queue_capacity = 3;
  config.stages[1].num_threads = 1;  // exercises runtime.config_threadpool in the worker
  PipelineExecutor pipeline;
  pipeline.Init(std::move(config));
  SetW(&pipeline, &reference);
  constexpr int kCount = 1000;
  auto inputs = RandomInputs(kCount, 2, 2);
  auto results = RunAll(pipeline, inputs);
  ASSERT_EQ(results.size(), size_t(kCount));
  for (int i = 0; i < kCount; ++i) ExpectBitIdentical(results[i], Sequential(reference, inputs[i]), i);
}

TEST_F(PipelineExecutorTest, BoundariesOnMemorySharingDevicesBindAndOutputsNoStepWritesAreCopied) {
  // front(x, y) = [s, s, x]: s is two outputs (one tensor cannot be bound to two) and x is an input
  // passed through (no step writes it), so those three drains copy; every other boundary binds
  // (cpu:0 and cpu:1 share memory) and nothing at Init fails and is caught.
  Watchdog watchdog("copied boundaries");
  auto make = [this] {
    PipelineConfig config;
    config.inputs = {"x", "y"};
    PipelineStage front;
    front.name = "front";
    front.runtime = Runtime(GraphJSON({"x", "y"}, {{"s", "add", {0, 1}}}, {2, 2, 0}));
    front.inputs = {{"x", PipelineSource::Input("x")}, {"y", PipelineSource::Input("y")}};
    PipelineStage back;
    back.name = "back";
    back.runtime = Runtime(GraphJSON({"A", "B"}, {{"q", "mul", {0, 1}}}, {2}), {kDLCPU, 1});
    back.inputs = {{"A", PipelineSource::StageOutput(0, 0)}, {"B", PipelineSource::StageOutput(0, 2)}};
    config.stages = {front, back};
    config.outputs = {{1, 0}, {0, 1}};
    return config;
  };
  PipelineConfig reference = make();
  PipelineExecutor pipeline;
  pipeline.Init(make());
  auto inputs = RandomInputs(50, 2, 7);
  auto results = RunAll(pipeline, inputs);
  for (int i = 0; i < 50; ++i) ExpectBitIdentical(results[i], Sequential(reference, inputs[i]), i);
  ffi::json::Object stats = Stats(pipeline);
  EXPECT_EQ(Field(stats, "boundary_copies_without_frames"), 8);  // x, y, s, s, x; A, B; q
  EXPECT_EQ(Field(stats, "boundary_copies"), 3);
}

TEST_F(PipelineExecutorTest, BackpressureBoundsEveryQueueAndBlocksTheProducer) {
  Watchdog watchdog("backpressure");
  g_slow_us = 200;
  PipelineConfig reference = TwoStages("slow");
  PipelineExecutor pipeline;
  pipeline.Init(TwoStages("slow"));
  SetW(&pipeline, &reference);
  const int capacity = pipeline.queue_capacity();
  // Nobody collects: the output queue fills, then each stage holds one frame it cannot push, then
  // every queue is full and Run blocks. In flight at most: 3 queues of `capacity`, plus 2 stages.
  const int64_t full = 3 * capacity + 2;
  auto inputs = RandomInputs(40, 2, 3);
  std::atomic<int> submitted{0};
  Producer producer(&pipeline, &inputs, &submitted);
  EXPECT_TRUE(Settles(pipeline, [&](const ffi::json::Object& s) { return Field(s, "submitted") == full; }));
  EXPECT_EQ(submitted.load(), full);  // the producer is blocked in Run
  for (int i = 0; i < 40; ++i) {
    ExpectBitIdentical(Collect(pipeline), Sequential(reference, inputs[i]), i);
  }
  EXPECT_EQ(producer.Join(), "");
  ffi::json::Object stats = Stats(pipeline);
  EXPECT_LE(Field(stats, "output_queue_max"), capacity);
  EXPECT_EQ(Field(stats, "output_queue_max"), capacity);
  for (const ffi::Any& s : stats.at(ffi::String("stages")).cast<ffi::json::Array>()) {
    EXPECT_LE(Field(s.cast<ffi::json::Object>(), "queue_max"), capacity);
  }
}

TEST_F(PipelineExecutorTest, ErrorInStageOneSurfacesAtGetOutputNamingTheStage) {
  Watchdog watchdog("stage error");
  PipelineConfig reference = TwoStages();
  PipelineExecutor pipeline;
  pipeline.Init(TwoStages("guard"));
  SetW(&pipeline, &reference);
  auto inputs = RandomInputs(20, 2, 4);
  Poison(&inputs[9]);
  int returned = 0;
  std::string error;
  try {
    RunAll(pipeline, inputs);
  } catch (const ffi::Error&) {
    // Run or GetOutput saw the failure first; either way the finished outputs are still collected.
  }
  while (true) {
    try {
      Collect(pipeline);
    } catch (const ffi::Error& err) {
      EXPECT_EQ(err.kind(), "ValueError");
      error = err.message();
      break;
    }
    ++returned;
  }
  EXPECT_NE(error.find("pipeline stage 1 'back' failed"), std::string::npos) << error;
  EXPECT_NE(error.find("guard: poison value in the input"), std::string::npos) << error;
  EXPECT_NE(error.find("node 4 'q'"), std::string::npos) << error;  // the runtime's own context survives
  // The pipeline accepts no more work, and says why.
  DLTensor x = View(inputs[0][0]), y = View(inputs[0][1]);
  ExpectError([&] { pipeline.Run({&x, &y}); }, "pipeline stage 1 'back' failed");
  ExpectError([&] { pipeline.GetOutput(false); }, "pipeline stage 1 'back' failed");
  EXPECT_LE(returned, 9);
}

TEST_F(PipelineExecutorTest, ErrorKeepsEarlierOutputsInOrder) {
  // The last stage fails on inference 9: it finished 0..8 first, so all of them come out, then the error.
  Watchdog watchdog("earlier outputs");
  PipelineConfig reference = TwoStages();
  PipelineConfig config = TwoStages("guard");
  config.queue_capacity = 4;  // 3 * 4 + 2 frames: all 10 inferences fit without a consumer
  PipelineExecutor pipeline;
  pipeline.Init(std::move(config));
  SetW(&pipeline, &reference);
  auto inputs = RandomInputs(10, 2, 5);
  Poison(&inputs[9]);
  EXPECT_EQ(Producer(&pipeline, &inputs).Join(), "");
  for (int i = 0; i < 9; ++i) {
    ExpectBitIdentical(Collect(pipeline), Sequential(reference, inputs[i]), i);
  }
  ExpectError([&] { pipeline.GetOutput(true); }, "pipeline stage 1 'back' failed");
}

TEST_F(PipelineExecutorTest, DestructionWithWorkInFlightDoesNotHang) {
  Watchdog watchdog("destroy in flight");
  g_slow_us = 2000;
  auto pipeline = std::make_unique<PipelineExecutor>();
  pipeline->Init(TwoStages("slow"));
  auto inputs = RandomInputs(6, 2, 6);
  DLTensor w = View(inputs[0][0]);
  pipeline->SetParam(1, "W", &w);
  for (auto& one : inputs) {
    DLTensor x = View(one[0]), y = View(one[1]);
    pipeline->Run({&x, &y});
  }
  EXPECT_GT(pipeline->NumInFlight(), 0);
  pipeline.reset();
}

TEST_F(PipelineExecutorTest, DestructionWithBlockedProducersDoesNotHang) {
  Watchdog watchdog("destroy blocked");
  auto pipeline = std::make_unique<PipelineExecutor>();
  pipeline->Init(TwoStages());
  auto inputs = RandomInputs(1, 2, 7);
  DLTensor x = View(inputs[0][0]), y = View(inputs[0][1]);
  pipeline->SetParam(1, "W", &x);
  std::string producer_error;
  // Nothing collects: workers block pushing into full queues, and the producer blocks in Run.
  std::thread producer([&] {
    try {
      while (true) pipeline->Run({&x, &y});
    } catch (const ffi::Error& err) {
      producer_error = err.message();
    }
  });  // a plain thread: the pipeline is destroyed under it
  const int64_t full = 3 * pipeline->queue_capacity() + 2;
  EXPECT_TRUE(Settles(*pipeline, [&](const ffi::json::Object& s) { return Field(s, "submitted") == full; }));
  pipeline.reset();  // wakes the producer (it throws) and every worker, then waits for them
  producer.join();
  EXPECT_NE(producer_error.find("shut down"), std::string::npos) << producer_error;
}

TEST_F(PipelineExecutorTest, ShutdownStopsWorkAndIsIdempotent) {
  Watchdog watchdog("shutdown");
  PipelineExecutor pipeline;
  pipeline.Init(TwoStages());
  SetW(&pipeline, nullptr);
  auto inputs = RandomInputs(1, 2, 8);
  DLTensor x = View(inputs[0][0]), y = View(inputs[0][1]);
  // A consumer waiting with nothing in flight is woken by Shutdown.
  std::string consumer_error;
  std::thread consumer([&] {
    try {
      pipeline.GetOutput(true);
    } catch (const ffi::Error& err) {
      consumer_error = err.message();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pipeline.Shutdown();
  consumer.join();
  EXPECT_NE(consumer_error.find("shut down"), std::string::npos) << consumer_error;
  pipeline.Shutdown();
  ExpectError([&] { pipeline.Run({&x, &y}); }, "shut down");
  ExpectError([&] { pipeline.GetOutput(true); }, "shut down");
}

TEST_F(PipelineExecutorTest, RunChecksInputsAndParamsAreChecked) {
  PipelineExecutor pipeline;
  pipeline.Init(TwoStages());
  auto some_runtime = Runtime(GraphJSON({"x", "y"}, {{"s", "add", {0, 1}}}, {2}));
  Values short_values(kN / 2);
  int64_t shape[1] = {kN / 2};
  DLTensor bad{short_values.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  auto inputs = RandomInputs(1, 2, 9);
  DLTensor x = View(inputs[0][0]);
  ExpectError([&] { pipeline.Run({&x}); }, "expected 2 pipeline inputs, got 1");
  ExpectError([&] { pipeline.Run({&x, &bad}); }, "pipeline input 'y': expected (16,) float32, got (8,) float32");
  ExpectError([&] { pipeline.SetParam(1, "A", &x); }, "stage 1 'back': 'A' is not one of its declared parameters");
  ExpectError([&] { pipeline.SetParam(2, "W", &x); }, "there is no stage 2");
  ffi::Map<ffi::String, ffi::Tensor> params{{ffi::String("nope"), some_runtime->GetInput(0)}};
  ExpectError([&] { pipeline.SetParams(-1, params); }, "'nope' is a parameter of no stage");
  pipeline.SetParam(1, "W", &x);
  ASSERT_TRUE(pipeline.Run({&x, &x}));
  ExpectError([&] { pipeline.SetParam(1, "W", &x); }, "only while no inference is in flight (1 are)");
  EXPECT_TRUE(pipeline.GetOutput(true).has_value());
  pipeline.SetParam(1, "W", &x);
}

TEST_F(PipelineExecutorTest, WorkerHonoursItsCoreList) {
  Watchdog watchdog("affinity");
  PipelineConfig config = TwoStages("where");
  config.stages[1].cores = {0};
  config.stages[1].num_threads = 1;
  PipelineExecutor pipeline;
  pipeline.Init(std::move(config));
  SetW(&pipeline, nullptr);
  auto inputs = RandomInputs(20, 2, 10);
  RunAll(pipeline, inputs);
  EXPECT_EQ(g_where_cpu.load(), 0);
}

TEST_F(PipelineExecutorTest, WiringErrorsNameTheStageAndInput) {
  {
    PipelineConfig c = TwoStages();
    c.stages[1].inputs[0].first = "Q";
    ExpectInitError(c, "stage 1 'back': wiring names input 'Q', which the stage's graph does not have");
  }
  {
    PipelineConfig c = TwoStages();
    c.stages[1].inputs[0].second = PipelineSource::StageOutput(1, 0);
    ExpectInitError(c, "stage 1 'back' input 'A': comes from stage 1, which is not an earlier stage");
  }
  {
    PipelineConfig c = TwoStages();
    c.stages[1].inputs[0].second = PipelineSource::StageOutput(0, 5);
    ExpectInitError(c, "stage 1 'back' input 'A': stage 0 'front' has no output 5 (it has 2)");
  }
  {
    PipelineConfig c = TwoStages();
    c.stages[1].inputs[1].second = PipelineSource::Input("z");
    ExpectInitError(c, "stage 1 'back' input 'B': 'z' is not a pipeline input");
  }
  {
    PipelineConfig c = TwoStages();
    c.stages[1].params.clear();
    ExpectInitError(c, "stage 1 'back': input 'W' is neither wired nor declared a parameter");
  }
  {
    PipelineConfig c = TwoStages();
    c.stages[1].runtime = Runtime(GraphJSON({"A", "B", "W"}, {{"r", "mul", {0, 2}}, {"q", "add", {3, 1}}}, {4}, 8));
    ExpectInitError(c,
                    "stage 1 'back' input 'A': stage 0 'front' output 0 is (16,) float32, the input is (8,) float32");
  }
  {
    PipelineConfig c = TwoStages();
    c.stages[1].runtime =
        Runtime(GraphJSON({"A", "B", "W"}, {{"r", "mul", {0, 2}}, {"q", "add", {3, 1}}}, {4}, kN, "float64"));
    ExpectInitError(c,
                    "stage 1 'back' input 'A': stage 0 'front' output 0 is (16,) float32, the input is (16,) float64");
  }
  {
    PipelineConfig c = TwoStages();
    c.inputs.push_back("unused");
    ExpectInitError(c, "pipeline input 'unused' feeds no stage");
  }
  {
    PipelineConfig c = TwoStages();
    c.outputs.push_back({1, 3});
    ExpectInitError(c, "pipeline output 2: stage 1 'back' has no output 3");
  }
  {
    PipelineConfig c = TwoStages();
    c.stages[0].cores = {100000};
    ExpectInitError(c, "stage 0 'front': core 100000 does not exist");
  }
  {
    PipelineConfig c = TwoStages();
    c.stages[1].runtime = c.stages[0].runtime;
    ExpectInitError(c, "stage 1 'back': its runtime is also stage 'front'");
  }
}

TEST(PipelineConfigTest, ParsesTheWiringJSON) {
  PipelineConfig c = ParsePipelineConfig(R"({
    "inputs": ["x", "y"],
    "stages": [{"name": "front", "inputs": {"x": "x", "y": "y"}, "cores": [0], "num_threads": 2},
               {"inputs": {"A": {"stage": 0, "output": 0}, "B": {"stage": 0, "output": 1}}, "params": ["W"]}],
    "outputs": [{"stage": 1, "output": 0}, {"stage": 0}],
    "queue_capacity": 3})");
  ASSERT_EQ(c.stages.size(), 2u);
  EXPECT_EQ(c.inputs, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(c.stages[0].name, "front");
  EXPECT_EQ(c.stages[0].cores, (std::vector<int>{0}));
  EXPECT_EQ(c.stages[0].num_threads, 2);
  EXPECT_EQ(c.stages[1].params, (std::vector<std::string>{"W"}));
  ASSERT_EQ(c.stages[1].inputs.size(), 2u);
  std::map<std::string, PipelineSource> wiring(c.stages[1].inputs.begin(), c.stages[1].inputs.end());
  EXPECT_EQ(wiring["B"].stage, 0);
  EXPECT_EQ(wiring["B"].output, 1);
  EXPECT_EQ(c.outputs, (std::vector<std::pair<int, int>>{{1, 0}, {0, 0}}));
  EXPECT_EQ(c.queue_capacity, 3);
}

TEST(PipelineConfigTest, RejectsTyposAndWrongTypes) {
  auto expect = [](const std::string& json, const std::string& expected) {
    try {
      ParsePipelineConfig(json);
      ADD_FAILURE() << "no error for " << json;
    } catch (const ffi::Error& err) {
      EXPECT_NE(err.message().find(expected), std::string::npos) << err.message();
    }
  };
  expect(R"({"inputs": [], "stages": [{"num_thread": 1}], "outputs": []})", "stages[0]: unknown field 'num_thread'");
  expect(R"({"inputs": [], "stages": [], "outputs": [{"output": 0}]})", "outputs[0]: missing field 'stage'");
  expect(R"({"inputs": "x", "stages": [], "outputs": []})", "inputs: expected a list");
  expect(R"({"inputs": [], "stages": [{"inputs": {"A": 3}}], "outputs": []})",
         "stages[0].inputs.A: expected an object");
  expect(R"({"stages": []})", "'inputs', 'stages' and 'outputs' are required");
  expect("{", "invalid pipeline config: JSON");
}

}  // namespace
}  // namespace tvm_hetero
