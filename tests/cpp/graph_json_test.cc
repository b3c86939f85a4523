/*! \file graph_json_test.cc \brief The graph JSON loader, directly. */
#include <gtest/gtest.h>
#include <tvm/ffi/error.h>
#include <tvm_hetero/graph.h>

#include <regex>

#include "test_graphs.h"

namespace tvm_hetero {
namespace {

using testing::SimplexJSON;

/*! \brief Expect ParseGraphJSON to throw a ValueError whose message matches `pattern`. */
void ExpectParseError(const std::string& json, const std::string& pattern) {
  try {
    ParseGraphJSON(json);
    ADD_FAILURE() << "no error; expected /" << pattern << "/";
  } catch (const tvm::ffi::Error& err) {
    EXPECT_EQ(err.kind(), "ValueError");
    EXPECT_TRUE(std::regex_search(err.message(), std::regex(pattern)))
        << "message: " << err.message() << "\nexpected /" << pattern << "/";
  }
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  size_t pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return text.replace(pos, from.size(), to);
}

TEST(GraphJSON, ParsesNodesEntriesAndColumns) {
  Graph g = ParseGraphJSON(SimplexJSON());
  ASSERT_EQ(g.nodes.size(), 6u);
  EXPECT_EQ(g.num_entries(), 6u);
  EXPECT_EQ(g.nodes[3].func_name, "add");
  EXPECT_EQ(g.nodes[3].inputs.size(), 2u);
  EXPECT_EQ(g.nodes[4].func_name, "__copy");
  EXPECT_EQ(g.arg_nodes, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(g.heads[0].node_id, 5u);
  EXPECT_EQ(g.shapes[0], (std::vector<int64_t>{4}));
  EXPECT_EQ(g.dtypes[0].code, kDLFloat);
  EXPECT_EQ(g.dtypes[0].bits, 32);
  EXPECT_EQ(g.node_device_values, (std::vector<int64_t>{1, 1, 0, 1, 0, 0}));
  EXPECT_FALSE(g.device_index_kind.has_value());
}

TEST(GraphJSON, StorageOffsetsDefaultToZeroAndAreRead) {
  EXPECT_EQ(ParseGraphJSON(SimplexJSON()).storage_offsets, (std::vector<int64_t>(6, 0)));
  Graph g = ParseGraphJSON(SimplexJSON("[0, 0, 2, 0, 4, 5]", "[1, 1, 0, 1, 0, 0]", "[0, 64, 0, 128, 0, 0]"));
  EXPECT_EQ(g.storage_offsets, (std::vector<int64_t>{0, 64, 0, 128, 0, 0}));
}

TEST(GraphJSON, RejectsBadStorageOffsets) {
  const std::string devices = "[1, 1, 0, 1, 0, 0]";
  ExpectParseError(SimplexJSON("[0, 1, 2, 3, 4, 5]", devices, "[0, 0, 0, 8, 0, 0]"),
                   R"(attrs\.storage_offset\[3\]: 8 is not a non-negative multiple of 64 bytes)");
  ExpectParseError(SimplexJSON("[0, 1, 2, 3, 4, 5]", devices, "[0, 0, 0, -64, 0, 0]"),
                   R"(attrs\.storage_offset\[3\]: -64 is not a non-negative multiple of 64 bytes)");
  ExpectParseError(SimplexJSON("[0, 1, 2, 3, 4, 5]", devices, "[0, 0]"),
                   R"(attrs\.storage_offset: has 2 values, expected 6 \(one per entry\))");
}

TEST(GraphJSON, RejectsCyclesAndForwardReferences) {
  ExpectParseError(Replace(SimplexJSON(), "[[0, 0, 0], [1, 0, 0]]", "[[3, 0, 0], [1, 0, 0]]"),
                   "node 3 'add' field 'inputs'\\[0\\].*cycle or forward reference");
  ExpectParseError(Replace(SimplexJSON(), "[[0, 0, 0], [1, 0, 0]]", "[[5, 0, 0], [1, 0, 0]]"),
                   "forward reference");
}

TEST(GraphJSON, RejectsMissingNodesAndOutputs) {
  ExpectParseError(Replace(SimplexJSON(), "[[4, 0, 0], [2, 0, 0]]", "[[40, 0, 0], [2, 0, 0]]"),
                   "node 5 'sub'.*node 40, which does not exist");
  ExpectParseError(Replace(SimplexJSON(), "[[4, 0, 0], [2, 0, 0]]", "[[4, 1, 0], [2, 0, 0]]"),
                   "node 5 'sub'.*output 1 of node 4 'copy'");
}

TEST(GraphJSON, RejectsColumnsOfWrongLength) {
  ExpectParseError(SimplexJSON("[0, 1]"), "attrs.storage_id: has 2 values, expected 6");
  ExpectParseError(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[0, 1, 0]"), "attrs.device_index: has 3 values");
  ExpectParseError(Replace(SimplexJSON(), "[[4], [4], [4], [4], [4], [4]]", "[[4]]"), "attrs.shape: has 1");
}

TEST(GraphJSON, RejectsBadFieldValues) {
  ExpectParseError(SimplexJSON("[0, 1, -2, 3, 4, 5]"), "attrs.storage_id\\[2\\]: is negative");
  ExpectParseError(Replace(SimplexJSON(), "\"num_inputs\": \"2\"", "\"num_inputs\": \"3\""),
                   "node 3 'add' attrs.num_inputs: says 3 but the node has 2 inputs");
  ExpectParseError(Replace(SimplexJSON(), "[\"float32\", \"float32\", \"float32\"",
                           "[\"floaty\", \"float32\", \"float32\""),
                   "attrs.dltype\\[0\\]: unknown dtype 'floaty'");
  ExpectParseError(Replace(SimplexJSON(), "\"func_name\": \"add\", ", ""), "node 3 'add' attrs: missing field 'func_name'");
  ExpectParseError("{\"nodes\": 3}", "field 'nodes': expected a list");
  ExpectParseError("not json", "not valid JSON");
}

TEST(GraphJSON, AcceptsPerEntryDeviceColumnAndKindAttribute) {
  // Legacy graphs wrote one device value per entry; with one output per node it is per node too.
  std::string doc = Replace(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 1, 1, 1, 1]"),
                            "\"device_index\"", "\"device_index_kind\": [\"str\", \"device_type\"], \"device_index\"");
  Graph g = ParseGraphJSON(doc);
  ASSERT_TRUE(g.device_index_kind.has_value());
  EXPECT_EQ(*g.device_index_kind, DeviceIndexKind::kDeviceType);
}

}  // namespace
}  // namespace tvm_hetero
