// The message of an index outside its tensor (support/index_error.h) and the registered function
// that index-check kernels call.
#include <gtest/gtest.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <string>

#include "support/index_error.h"

namespace tvm_hetero {
namespace support {
namespace {

TEST(IndexError, ElementNameUnravelsRowMajor) {
  EXPECT_EQ(ElementName("ids", 5, {2, 3}), "ids[1, 2]");
  EXPECT_EQ(ElementName("ids", 0, {4}), "ids[0]");
  EXPECT_EQ(ElementName("idx", 7, {2, 2, 2}), "idx[1, 1, 1]");
}

TEST(IndexError, ElementNameOfAScalarAndOfAPositionOutsideTheShape) {
  EXPECT_EQ(ElementName("k", 0, {}), "k[]");
  EXPECT_EQ(ElementName("ids", 6, {2, 3}), "ids[6]");
  EXPECT_EQ(ElementName("ids", -1, {2, 3}), "ids[-1]");
}

TEST(IndexError, MessageNamesOpValueElementAndBound) {
  EXPECT_EQ(IndexErrorMessage("node 'embed' (relax.take 'gv'), input 'indices'", "ids", 1000, 1, {2}, -1000, 1000),
            "node 'embed' (relax.take 'gv'), input 'indices': index 1000 at ids[1] is outside [-1000, 1000)");
}

TEST(IndexError, RegisteredFunctionThrowsIndexError) {
  auto fn = tvm::ffi::Function::GetGlobal("tvm_hetero.index_out_of_range");
  ASSERT_TRUE(fn.has_value());
  try {
    (*fn)("op 'x', input 'indices'", "ids", int64_t{-1001}, int64_t{3}, int64_t{-1000}, int64_t{1000}, int64_t{2},
          int64_t{2});
    FAIL() << "no error";
  } catch (const tvm::ffi::Error& err) {
    EXPECT_EQ(err.kind(), "IndexError");
    EXPECT_EQ(err.message(), "op 'x', input 'indices': index -1001 at ids[1, 1] is outside [-1000, 1000)");
  }
}

TEST(IndexError, RegisteredFunctionRejectsTooFewArguments) {
  auto fn = tvm::ffi::Function::GetGlobal("tvm_hetero.index_out_of_range");
  ASSERT_TRUE(fn.has_value());
  try {
    (*fn)("where", "ids");
    FAIL() << "no error";
  } catch (const tvm::ffi::Error& err) {
    EXPECT_EQ(err.kind(), "TypeError");
  }
}

}  // namespace
}  // namespace support
}  // namespace tvm_hetero
