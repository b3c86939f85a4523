// The shared device layer, tensor check and JSON reader (src/support/).
#include <gtest/gtest.h>
#include <tvm/ffi/error.h>
#include <tvm_hetero/backends/dnnl_region.h>

#include <string>
#include <vector>

#include "support/device.h"
#include "support/json_reader.h"
#include "support/tensor_check.h"

namespace tvm_hetero {
namespace {

namespace ffi = tvm::ffi;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const ffi::Error& err) {
    return err.message();
  }
  return "(no error)";
}

/*! \brief What each kind's record must say (one row per kind; the HTP and CUDA among them). */
struct KindCase {
  DLDevice device;
  const char* name;
  bool remote, asynchronous, host_memory, offsets_usable, runs_tvm_kernels;
  support::WaitMode wait;
};

class SupportDeviceKinds : public ::testing::TestWithParam<KindCase> {};

TEST_P(SupportDeviceKinds, RecordSaysWhatTheRuntimeDoes) {
  const KindCase& c = GetParam();
  const support::DeviceKindTraits& t = support::TraitsOf(c.device);
  EXPECT_STREQ(t.name, c.name);
  EXPECT_EQ(t.remote, c.remote);
  EXPECT_EQ(t.asynchronous, c.asynchronous);
  EXPECT_EQ(t.host_memory, c.host_memory);
  EXPECT_EQ(t.offsets_usable, c.offsets_usable);
  EXPECT_EQ(t.runs_tvm_kernels, c.runs_tvm_kernels);
  EXPECT_EQ(t.wait, c.wait);
  // The derived rules follow the record.
  DLDevice cpu0{kDLCPU, 0};
  EXPECT_EQ(support::IsRemote(c.device), c.remote);
  EXPECT_EQ(support::SharesMemory(cpu0, c.device), c.host_memory && !c.remote);
  EXPECT_EQ(support::OffsetsUsable(c.device), c.offsets_usable);
  EXPECT_EQ(support::NeedsDrain(c.device), c.wait != support::WaitMode::kReturn);
}

INSTANTIATE_TEST_SUITE_P(
    EveryKind, SupportDeviceKinds,
    ::testing::Values(
        KindCase{{kDLCPU, 1}, "cpu", false, false, true, true, true, support::WaitMode::kReturn},
        KindCase{{kDLCUDA, 0}, "cuda", false, true, false, true, true, support::WaitMode::kStreamSync},
        KindCase{{kDLHexagon, 0}, "qnn-htp", false, false, true, true, false, support::WaitMode::kReturn},
        KindCase{{static_cast<DLDeviceType>(kDLCPU + support::kRPCSessMask), 0}, "remote", true, false, false, false,
                 true, support::WaitMode::kStreamSync},
        KindCase{{static_cast<DLDeviceType>(kDLCUDA + 2 * support::kRPCSessMask), 0}, "remote", true, false, false,
                 false, true, support::WaitMode::kStreamSync},
        KindCase{{kDLOpenCL, 0}, "opencl", false, true, false, false, true, support::WaitMode::kStreamSync},
        KindCase{{kDLExtDev, 0}, "other", false, true, false, false, true, support::WaitMode::kStreamSync}),
    [](const ::testing::TestParamInfo<KindCase>& info) {
      std::string name = support::DeviceName(info.param.device);
      for (char& ch : name) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

TEST(SupportDevice, HtpTensorsAreHostMemoryReadInPlace) {
  DLDataType f32{kDLFloat, 32, 1};
  DLDevice htp{kDLHexagon, 0};
  // No TVM device API for the HTP is needed: its tensors are allocated on the host.
  ffi::Tensor t = support::AllocTensor(ffi::Shape({4}), f32, htp);
  EXPECT_EQ(t.device().device_type, kDLHexagon);
  ffi::Tensor host = support::AllocTensor(ffi::Shape({4}), f32, DLDevice{kDLCPU, 0});
  for (int i = 0; i < 4; ++i) static_cast<float*>(host.data_ptr())[i] = 2.0f * i;
  support::CopyOnce(host.GetDLTensorPtr(), support::Mutable(t));  // a memcpy, no staging
  EXPECT_EQ(static_cast<float*>(t.data_ptr())[3], 6.0f);
  EXPECT_FALSE(support::NeedsStaging(htp, DLDevice{kDLCPU, 0}));
  EXPECT_NO_THROW(support::WaitForCompletion(htp));
}

TEST(SupportDevice, KindsAndCopyRules) {
  DLDevice cpu0{kDLCPU, 0}, cpu1{kDLCPU, 1}, cuda{kDLCUDA, 0}, opencl{kDLOpenCL, 0};
  DLDevice remote_cpu{static_cast<DLDeviceType>(kDLCPU + support::kRPCSessMask), 0};
  EXPECT_TRUE(support::SharesMemory(cpu0, cpu1));
  EXPECT_FALSE(support::SharesMemory(cpu0, cuda));
  EXPECT_FALSE(support::SharesMemory(cpu0, remote_cpu));
  EXPECT_FALSE(support::NeedsStaging(cpu0, cuda));
  EXPECT_TRUE(support::NeedsStaging(cuda, opencl));
  EXPECT_FALSE(support::StagingBuffer(cpu0, cuda, ffi::Shape({4}), DLDataType{kDLFloat, 32, 1}).defined());
  EXPECT_TRUE(support::StagingBuffer(cuda, opencl, ffi::Shape({4}), DLDataType{kDLFloat, 32, 1}).defined());
  EXPECT_EQ(support::DeviceName(remote_cpu), "remote[0]:cpu:0");
}

TEST(SupportDevice, ReadableInPlaceIsTheSameLocalDeviceOrTwoSharingMemory) {
  // What the pipeline asks before binding a boundary tensor instead of copying it.
  const DLDevice cpu0{kDLCPU, 0}, cpu1{kDLCPU, 1}, cuda0{kDLCUDA, 0};
  const DLDevice remote{static_cast<DLDeviceType>(kDLCPU + support::kRPCSessMask), 0};
  EXPECT_TRUE(support::ReadableInPlace(cpu0, cpu1));
  EXPECT_TRUE(support::ReadableInPlace(cpu0, cpu0));
  EXPECT_TRUE(support::ReadableInPlace(cuda0, cuda0));
  EXPECT_FALSE(support::ReadableInPlace(cpu0, cuda0));
  EXPECT_FALSE(support::ReadableInPlace(cuda0, cpu0));
  EXPECT_FALSE(support::ReadableInPlace(remote, remote));  // another process's memory
  EXPECT_FALSE(support::ReadableInPlace(cpu0, remote));
}

TEST(SupportDevice, CopyBetweenHostDevicesAndViews) {
  DLDataType f32{kDLFloat, 32, 1};
  ffi::Tensor a = support::AllocTensor(ffi::Shape({3}), f32, DLDevice{kDLCPU, 0});
  ffi::Tensor b = support::AllocTensor(ffi::Shape({3}), f32, DLDevice{kDLCPU, 1});
  for (int i = 0; i < 3; ++i) static_cast<float*>(a.data_ptr())[i] = 1.5f * i;
  support::CopyOnce(a.GetDLTensorPtr(), support::Mutable(b));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(static_cast<float*>(b.data_ptr())[i], 1.5f * i);
  ffi::Tensor view = support::ViewOf(a, sizeof(float), ffi::Shape({2}), f32, DLDevice{kDLCPU, 1});
  EXPECT_EQ(static_cast<float*>(view.data_ptr())[0], 1.5f);
  EXPECT_EQ(view.device().device_id, 1);
}

TEST(SupportTensorCheck, MessagesNameTheTensor) {
  DLDataType f32{kDLFloat, 32, 1};
  ffi::Tensor t = support::AllocTensor(ffi::Shape({2, 3}), f32, DLDevice{kDLCPU, 0});
  EXPECT_NO_THROW(support::CheckTensor(t.GetDLTensorPtr(), {2, 3}, f32, "input 'x'"));
  EXPECT_EQ(ErrorOf([&] { support::CheckTensor(t.GetDLTensorPtr(), {3}, f32, "input 'x'"); }),
            "input 'x': expected shape (3,), got (2, 3)");
  EXPECT_EQ(ErrorOf([&] { support::CheckTensor(t.GetDLTensorPtr(), {2, 3}, DLDataType{kDLInt, 8, 1}, "w"); }),
            "w: expected dtype int8, got float32");
  DLTensor strided = *t.GetDLTensorPtr();
  int64_t strides[2] = {1, 2};
  strided.strides = strides;
  EXPECT_EQ(ErrorOf([&] { support::CheckTensor(&strided, {2, 3}, f32, "w"); }), "w: tensor must be contiguous");
}

TEST(SupportJsonReader, ErrorsCarryDocumentAndPlace) {
  support::JsonReader reader("invalid thing");
  ffi::json::Object obj = reader.Object(reader.Parse(R"({"a": [1, "x"], "b": true})"), "document");
  EXPECT_EQ(ErrorOf([&] { reader.IntList(reader.Require(obj, "a", "document"), "a"); }),
            "invalid thing: a[1]: expected an integer");
  EXPECT_EQ(ErrorOf([&] { reader.Require(obj, "c", "document"); }), "invalid thing: document: missing field 'c'");
  EXPECT_EQ(ErrorOf([&] { reader.CheckKeys(obj, {"a"}, "top"); }), "invalid thing: top: unknown field 'b'");
  EXPECT_NE(ErrorOf([&] { reader.Parse("{"); }).find("invalid thing: document: not valid JSON"), std::string::npos);
}

TEST(SupportJsonReader, OneDnnRegionErrorsNameTheRegionAndField) {
  EXPECT_EQ(ErrorOf([] { dnnl_backend::ParseRegions(R"({"regions": [{"name": "r0", "op": "conv2d", "strides": [1, "2"]}]})"); }),
            "invalid oneDNN regions: region 'r0'.strides[1]: expected an integer");
  EXPECT_EQ(ErrorOf([] { dnnl_backend::ParseRegions(R"({"regions": [{"op": "conv2d"}]})"); }),
            "invalid oneDNN regions: regions[0]: missing field 'name'");
  EXPECT_EQ(ErrorOf([] { dnnl_backend::ParseRegions(R"({})"); }), "invalid oneDNN regions: document: missing field 'regions'");
}

TEST(SupportJsonReader, OneDnnBlockStepsReadOnlyValuesMadeBefore) {
  // Two inputs; step 0 (value 2) reads input 0, step 1 (value 3) reads value 2: a valid chain.
  auto regions = dnnl_backend::ParseRegions(
      R"({"regions": [{"name": "b", "op": "block", "num_inputs": 2, "steps": [)"
      R"({"op": "softmax", "axis": 1, "args": [0], "shape": [2, 3]},)"
      R"({"op": "concat", "axis": 1, "inputs": [0, 1], "args": [2, 1]}]}]})");
  ASSERT_EQ(regions.size(), 1u);
  ASSERT_EQ(regions[0].steps.size(), 2u);
  EXPECT_EQ(regions[0].steps[1].inputs, (std::vector<int>{2, 1}));  // positions in args -> value ids
  EXPECT_EQ(ErrorOf([] {
              dnnl_backend::ParseRegions(R"({"regions": [{"name": "b", "op": "block", "num_inputs": 1, "steps": [)"
                                         R"({"op": "softmax", "args": [1], "shape": [2]}]}]})");
            }),
            "invalid oneDNN regions: region 'b'.steps[0]: args[0] is value 1, not an input nor an earlier step's "
            "output (1 values so far)");
  EXPECT_EQ(ErrorOf([] {
              dnnl_backend::ParseRegions(R"({"regions": [{"name": "b", "op": "block", "num_inputs": 1, "steps": [)"
                                         R"({"op": "conv2d", "weight": 1, "args": [0]}]}]})");
            }),
            "invalid oneDNN regions: region 'b'.steps[0]: weight: argument 1 of 1");
  EXPECT_EQ(ErrorOf([] { dnnl_backend::ParseRegions(R"({"regions": [{"name": "r", "op": "dance"}]})"); }),
            "invalid oneDNN regions: region 'r': unknown op 'dance'");
}

}  // namespace
}  // namespace tvm_hetero
