/*! \file test_graphs.h \brief Small graph JSON documents shared by the C++ tests. */
#ifndef TVM_HETERO_TESTS_TEST_GRAPHS_H_
#define TVM_HETERO_TESTS_TEST_GRAPHS_H_

#include <string>

namespace tvm_hetero::testing {

/*!
 * \brief add on device 1 -> copy -> sub on device 0; `sids` and `devices` replace the columns, and a
 *        nonempty `offsets` adds a storage_offset column.
 */
inline std::string SimplexJSON(const std::string& sids = "[0, 1, 2, 3, 4, 5]",
                               const std::string& devices = "[1, 1, 0, 1, 0, 0]", const std::string& offsets = "") {
  return R"({"nodes": [
    {"op": "null", "name": "A", "inputs": []},
    {"op": "null", "name": "B", "inputs": []},
    {"op": "null", "name": "C", "inputs": []},
    {"op": "tvm_op", "name": "add", "inputs": [[0, 0, 0], [1, 0, 0]],
     "attrs": {"func_name": "add", "num_inputs": "2", "num_outputs": "1", "flatten_data": "0"}},
    {"op": "tvm_op", "name": "copy", "inputs": [[3, 0, 0]],
     "attrs": {"func_name": "__copy", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}},
    {"op": "tvm_op", "name": "sub", "inputs": [[4, 0, 0], [2, 0, 0]],
     "attrs": {"func_name": "sub", "num_inputs": "2", "num_outputs": "1", "flatten_data": "0"}}],
  "arg_nodes": [0, 1, 2], "node_row_ptr": [0, 1, 2, 3, 4, 5, 6], "heads": [[5, 0, 0]],
  "attrs": {"shape": ["list_shape", [[4], [4], [4], [4], [4], [4]]],
            "dltype": ["list_str", ["float32", "float32", "float32", "float32", "float32", "float32"]],
            "storage_id": ["list_int", )" +
         sids + R"(], "device_index": ["list_int", )" + devices + "]" +
         (offsets.empty() ? "" : R"(, "storage_offset": ["list_int", )" + offsets + "]") + "}}";
}

/*!
 * \brief x -> a -> b -> c on device 0 (each node reads the one before; c is the output), float32
 *        entries of `lengths` elements; `sids` gives the storage ids and a nonempty `offsets` a
 *        storage_offset column.
 */
inline std::string ChainJSON(const std::string& sids, const std::string& lengths = "[4], [4], [4], [4]",
                             const std::string& offsets = "") {
  auto op = [](const char* name, int input) {
    return std::string(R"({"op": "tvm_op", "name": ")") + name + R"(", "inputs": [[)" + std::to_string(input) +
           R"(, 0, 0]], "attrs": {"func_name": "f", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}})";
  };
  return R"({"nodes": [{"op": "null", "name": "x", "inputs": []}, )" + op("a", 0) + ", " + op("b", 1) + ", " +
         op("c", 2) + R"(], "arg_nodes": [0], "node_row_ptr": [0, 1, 2, 3, 4], "heads": [[3, 0, 0]],
  "attrs": {"shape": ["list_shape", [)" + lengths + R"(]],
            "dltype": ["list_str", ["float32", "float32", "float32", "float32"]],
            "storage_id": ["list_int", )" + sids + R"(], "device_index": ["list_int", [0, 0, 0, 0]])" +
         (offsets.empty() ? "" : R"(, "storage_offset": ["list_int", )" + offsets + "]") + "}}";
}

}  // namespace tvm_hetero::testing

#endif  // TVM_HETERO_TESTS_TEST_GRAPHS_H_
