/*!
 * \file graph_runtime_test.cc
 * \brief The runtime in a pure C++ program (no Python): kernels come from a module written here.
 */
#include <gtest/gtest.h>

#include <random>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm_hetero/graph_runtime.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "test_graphs.h"
#include "test_kernels.h"

namespace tvm_hetero {
namespace {

namespace ffi = tvm::ffi;
using testing::SimplexJSON;

using testing::CallLog;
using testing::TestKernels;

template <typename F>
void ExpectThrows(F f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << text;
  } catch (const tvm::ffi::Error& err) {
    EXPECT_NE(err.message().find(text), std::string::npos) << err.message();
  }
}

class GraphRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { lib_ = ffi::Module(ffi::make_object<TestKernels>(&log_)); }
  void SetFloat(GraphRuntime& rt, const char* name, std::vector<float> values) {
    DLTensor t{values.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape_, nullptr, 0};
    rt.SetInput(rt.GetInputIndex(name), &t);
  }
  std::vector<float> Output(const GraphRuntime& rt) {
    std::vector<float> values(4);
    DLTensor t{values.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape_, nullptr, 0};
    rt.CopyOutputTo(0, &t);
    return values;
  }
  CallLog log_;
  ffi::Optional<ffi::Module> lib_;
  int64_t shape_[1] = {4};
};

TEST_F(GraphRuntimeTest, EntriesAtOffsetsOfOneStorageIdDoNotClobberEachOther) {
  // Per device, every entry in one storage id at its own offset; all are live together.
  GraphRuntime rt;
  rt.Init(SimplexJSON("[0, 0, 2, 0, 2, 2]", "[1, 1, 0, 1, 0, 0]", "[0, 64, 0, 128, 64, 128]"), *lib_,
          {{kDLCPU, 0}, {kDLCPU, 1}});
  EXPECT_EQ(rt.storage_plan().slots.size(), 2u);
  const char* base = static_cast<const char*>(rt.GetEntry(0).data_ptr());
  EXPECT_EQ(static_cast<const char*>(rt.GetEntry(1).data_ptr()), base + 64);
  EXPECT_EQ(static_cast<const char*>(rt.GetEntry(3).data_ptr()), base + 128);
  SetFloat(rt, "A", {1, 2, 3, 4});
  SetFloat(rt, "B", {10, 20, 30, 40});
  SetFloat(rt, "C", {1, 1, 1, 1});
  rt.Run();
  EXPECT_EQ(Output(rt), (std::vector<float>{10, 21, 32, 43}));
}

TEST_F(GraphRuntimeTest, ConcurrentRunsAreBitIdenticalToSerialOnTwoAndThreeDevices) {
  // Two devices (add on cpu:1, copy + sub on cpu:0) and three (sub on cpu:2 reading cpu:0's copy
  // and its own C in place); 1000 varied inferences each, concurrent against serial.
  for (const char* devices : {"[1, 1, 0, 1, 0, 0]", "[1, 1, 2, 1, 0, 2]"}) {
    std::vector<DLDevice> list{{kDLCPU, 0}, {kDLCPU, 1}, {kDLCPU, 2}};
    GraphRuntime serial, concurrent;
    serial.Init(SimplexJSON("[0, 1, 2, 3, 4, 5]", devices), *lib_, list);
    serial.SetExecution(ExecutionMode::kSerial);
    concurrent.Init(SimplexJSON("[0, 1, 2, 3, 4, 5]", devices), *lib_, list);
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> value(-100.0f, 100.0f);
    for (int i = 0; i < 1000; ++i) {
      for (const char* name : {"A", "B", "C"}) {
        std::vector<float> v{value(rng), value(rng), value(rng), value(rng)};
        SetFloat(serial, name, v);
        SetFloat(concurrent, name, v);
      }
      serial.Run();
      concurrent.Run();
      ASSERT_EQ(Output(concurrent), Output(serial)) << devices << " inference " << i;
    }
  }
}

TEST_F(GraphRuntimeTest, SimplexRunsAcrossTwoCPUDevices) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), *lib_, {{kDLCPU, 0}, {kDLCPU, 1}});
  SetFloat(rt, "A", {1, 2, 3, 4});
  SetFloat(rt, "B", {10, 20, 30, 40});
  SetFloat(rt, "C", {1, 1, 1, 1});
  rt.Run();
  EXPECT_EQ(Output(rt), (std::vector<float>{10, 21, 32, 43}));
  EXPECT_EQ(log_.device_ids, (std::vector<int>{1, 0}));  // add on cpu:1, sub on cpu:0
  ASSERT_EQ(rt.groups().size(), 2u);
  EXPECT_EQ(rt.groups()[0].device, 1);
  EXPECT_EQ(rt.groups()[1].device, 0);
  EXPECT_EQ(rt.groups()[1].end - rt.groups()[1].begin, 2u);  // copy + sub
}

TEST_F(GraphRuntimeTest, RunIsRepeatableAndInputsPersist) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), *lib_, {{kDLCPU, 0}, {kDLCPU, 1}});
  SetFloat(rt, "A", {1, 1, 1, 1});
  SetFloat(rt, "B", {2, 2, 2, 2});
  SetFloat(rt, "C", {3, 3, 3, 3});
  for (int i = 0; i < 3; ++i) rt.Run();
  EXPECT_EQ(Output(rt), (std::vector<float>{0, 0, 0, 0}));
}

TEST_F(GraphRuntimeTest, ReadingAnotherCpusOutputWithoutACopyReadsItInPlace) {
  // sub (cpu:0) reads add's output (cpu:1) directly: both are CPUs of this process, so the kernel
  // gets a view carrying cpu:0 (TVM kernels check the device) and no copy is needed.
  std::string json = SimplexJSON();
  json.replace(json.find("[[4, 0, 0], [2, 0, 0]]"), 22, "[[3, 0, 0], [2, 0, 0]]");
  for (ExecutionMode mode : {ExecutionMode::kSerial, ExecutionMode::kConcurrent}) {
    GraphRuntime rt;
    rt.Init(json, *lib_, {{kDLCPU, 0}, {kDLCPU, 1}});
    rt.SetExecution(mode);
    SetFloat(rt, "A", {1, 2, 3, 4});
    SetFloat(rt, "B", {1, 1, 1, 1});
    SetFloat(rt, "C", {2, 2, 2, 2});
    rt.Run();
    EXPECT_EQ(Output(rt), (std::vector<float>{0, 1, 2, 3}));
  }
}

TEST_F(GraphRuntimeTest, MissingKernelIsALoadError) {
  std::string json = SimplexJSON();
  json.replace(json.find("\"func_name\": \"sub\""), 19, "\"func_name\": \"mul\"");
  GraphRuntime rt;
  EXPECT_THROW(rt.Init(json, *lib_, {{kDLCPU, 0}, {kDLCPU, 1}}), ffi::Error);
}

TEST_F(GraphRuntimeTest, WrongInputShapeNamesTheInput) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), *lib_, {{kDLCPU, 0}, {kDLCPU, 1}});
  std::vector<float> values(3);
  int64_t shape[1] = {3};
  DLTensor t{values.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  try {
    rt.SetInput(0, &t);
    FAIL() << "no error";
  } catch (const ffi::Error& err) {
    EXPECT_NE(err.message().find("input 'A': expected shape (4,), got (3,)"), std::string::npos) << err.message();
  }
}

TEST_F(GraphRuntimeTest, StatsCountGroupsCopiesAndBytes) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), *lib_, {{kDLCPU, 0}, {kDLCPU, 1}});
  std::string stats = rt.StatsJSON();
  EXPECT_NE(stats.find("\"num_groups\":2"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"num_copies\":1"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"storage_bytes\":[48,48]"), std::string::npos) << stats;
}

/*! \brief Bytes in `tvm.runtime.save_param_dict` layout, for float32 1-d tensors. */
std::string ParamBlob(const std::vector<std::pair<std::string, std::vector<float>>>& params,
                      int64_t claimed_length = -1) {
  std::string out;
  auto put = [&](const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint64_t{0xF7E58D4F05049CB7ULL});
  put(uint64_t{0});
  put(uint64_t(params.size()));
  for (const auto& [name, values] : params) {
    put(uint64_t(name.size()));
    out += name;
  }
  put(uint64_t(params.size()));
  for (const auto& [name, values] : params) {
    put(uint64_t{0xDD5E40F096B4A13FULL});
    put(uint64_t{0});
    put(int32_t{kDLCPU});
    put(int32_t{0});
    put(int32_t{1});
    put(uint8_t{kDLFloat});
    put(uint8_t{32});
    put(uint16_t{1});
    int64_t length = claimed_length >= 0 ? claimed_length : int64_t(values.size());
    put(length);
    put(int64_t(length * 4));
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }
  return out;
}

TEST_F(GraphRuntimeTest, RunNamesTheInputsNeverSet) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), *lib_, {{kDLCPU, 0}, {kDLCPU, 1}});
  SetFloat(rt, "B", {1, 2, 3, 4});
  ExpectThrows([&] { rt.Run(); }, "run: 2 input(s) never set: 'A', 'C'");
  EXPECT_TRUE(log_.device_ids.empty());  // no kernel saw the unset inputs
  rt.LoadParams(ParamBlob({{"A", {1, 1, 1, 1}}, {"C", {0, 0, 0, 0}}}));
  rt.Run();
  EXPECT_EQ(Output(rt), (std::vector<float>{2, 3, 4, 5}));
}

TEST_F(GraphRuntimeTest, LoadParamsValidatesTheWholeBlobBeforeWriting) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), *lib_, {{kDLCPU, 0}, {kDLCPU, 1}});
  std::string blob = ParamBlob({{"A", {1, 2, 3, 4}}, {"C", {5, 6, 7, 8}}});
  ExpectThrows([&] { rt.LoadParams(blob.substr(0, blob.size() - 3), "params.bin"); },
               "params.bin: truncated or corrupt: parameter 'C' data needs 16 bytes");
  ExpectThrows([&] { rt.LoadParams(ParamBlob({{"A", {1, 2, 3, 4}}, {"Z", {1, 2, 3, 4}}})); },
               "load_params: parameter 'Z' is not an input of the graph");
  ExpectThrows([&] { rt.LoadParams(ParamBlob({{"A", {1, 2, 3, 4}}, {"C", {1, 2}}})); },
               "parameter 'C': expected shape (4,), got (2,)");
  // A header claiming 2^40 elements is an error, not an allocation.
  ExpectThrows([&] { rt.LoadParams(ParamBlob({{"A", {1, 2, 3, 4}}}, int64_t{1} << 40)); },
               "parameter 'A' data needs 4398046511104 bytes");
  // Nothing was written by the failed loads: 'A' is still unset.
  SetFloat(rt, "B", {1, 2, 3, 4});
  SetFloat(rt, "C", {1, 2, 3, 4});
  ExpectThrows([&] { rt.Run(); }, "never set: 'A'");
}

TEST_F(GraphRuntimeTest, CallsDuringARunAreBusyAndCorruptNothing) {
  GraphRuntime rt;
  rt.Init(SimplexJSON(), *lib_, {{kDLCPU, 0}, {kDLCPU, 1}});
  SetFloat(rt, "A", {1, 2, 3, 4});
  SetFloat(rt, "B", {10, 20, 30, 40});
  SetFloat(rt, "C", {1, 1, 1, 1});
  std::atomic<bool> entered{false}, release{false};
  log_.on_call = [&] {
    entered = true;
    while (!release) std::this_thread::yield();
  };
  std::thread runner([&] { rt.Run(); });
  while (!entered) std::this_thread::yield();
  ExpectThrows([&] { rt.Run(); }, "runtime is busy: run was called while another call");
  ExpectThrows([&] { SetFloat(rt, "A", {0, 0, 0, 0}); }, "runtime is busy: set_input");
  ExpectThrows([&] { Output(rt); }, "runtime is busy: get_output");
  ExpectThrows([&] { rt.LoadParams(ParamBlob({{"C", {0, 0, 0, 0}}})); }, "runtime is busy: load_params");
  release = true;
  runner.join();
  log_.on_call = nullptr;
  EXPECT_EQ(Output(rt), (std::vector<float>{10, 21, 32, 43}));  // the refused calls changed nothing
  rt.Run();
  EXPECT_EQ(Output(rt), (std::vector<float>{10, 21, 32, 43}));
}

}  // namespace
}  // namespace tvm_hetero
