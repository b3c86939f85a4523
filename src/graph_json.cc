/*!
 * \file graph_json.cc
 * \brief The one loader of graph JSON (docs/graph-format.md). Every rule of the schema is checked
 *        here, so the runtime can trust the Graph it receives; each error names the node and field.
 */
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm_hetero/graph.h>

#include "support/json_reader.h"

#include <sstream>
#include <string>
#include <vector>

namespace tvm_hetero {

namespace json = tvm::ffi::json;
using tvm::ffi::Any;
using tvm::ffi::String;

namespace {

const support::JsonReader kReader{"invalid graph JSON"};

/*! \brief An integer, also accepted as a decimal string (the classic format writes "2"). */
int64_t AsInt(const Any& v, const std::string& where) { return kReader.Int(v, where, /*decimal_strings=*/true); }

/*! \brief `[nid, index]` or `[nid, index, version]`, checked against the nodes before `limit`. */
EntryRef ParseEntry(const Any& v, const std::string& where, uint32_t limit, const Graph& g) {
  json::Array arr = kReader.Array(v, where);
  if (arr.size() != 2 && arr.size() != 3) kReader.Fail(where, "an entry is [node_id, output_index, version]");
  int64_t nid = AsInt(arr[0], where + " node_id");
  int64_t index = AsInt(arr[1], where + " output_index");
  if (nid < 0 || nid >= static_cast<int64_t>(g.nodes.size())) {
    kReader.Fail(where, "refers to node " + std::to_string(nid) + ", which does not exist");
  }
  if (nid >= limit) {
    kReader.Fail(where, "refers to node " + std::to_string(nid) +
                    ", which does not come earlier (cycle or forward reference)");
  }
  const GraphNode& src = g.nodes[nid];
  if (index < 0 || index >= src.num_outputs) {
    kReader.Fail(where, "refers to output " + std::to_string(index) + " of " + g.describe_node(nid) +
                    ", which has " + std::to_string(src.num_outputs) + " output(s)");
  }
  return EntryRef{static_cast<uint32_t>(nid), static_cast<uint32_t>(index)};
}

/*! \brief A column `[tag, values]` of `attrs`, checked for its tag. */
json::Array ParseColumn(const Any& v, const std::string& name, const char* tag) {
  std::string where = "attrs." + name;
  json::Array pair = kReader.Array(v, where);
  if (pair.size() != 2) kReader.Fail(where, "a column is [type_tag, values]");
  std::string got = kReader.String(pair[0], where + " type tag");
  if (got != tag) kReader.Fail(where, std::string("type tag must be '") + tag + "', got '" + got + "'");
  return kReader.Array(pair[1], where + " values");
}

void CheckColumnLength(const json::Array& col, size_t expected, const std::string& name) {
  if (col.size() != expected) {
    kReader.Fail("attrs." + name, "has " + std::to_string(col.size()) + " values, expected " +
                              std::to_string(expected) + " (one per entry)");
  }
}

GraphNode ParseNode(const Any& v, uint32_t nid) {
  std::string where = "node " + std::to_string(nid);
  json::Object obj = kReader.Object(v, where);
  GraphNode node;
  node.name = kReader.String(kReader.Require(obj, "name", where), where + " field 'name'");
  where += " '" + node.name + "'";
  node.op = kReader.String(kReader.Require(obj, "op", where), where + " field 'op'");
  if (node.op != "null" && node.op != "tvm_op") {
    kReader.Fail(where + " field 'op'", "must be 'null' or 'tvm_op', got '" + node.op + "'");
  }
  if (node.op == "tvm_op") {
    json::Object attrs = kReader.Object(kReader.Require(obj, "attrs", where), where + " field 'attrs'");
    node.func_name = kReader.String(kReader.Require(attrs, "func_name", where + " attrs"), where + " attrs.func_name");
    if (node.func_name.empty()) kReader.Fail(where + " attrs.func_name", "is empty");
    int64_t outs = AsInt(kReader.Require(attrs, "num_outputs", where + " attrs"), where + " attrs.num_outputs");
    if (outs < 1 || outs > (1 << 20)) kReader.Fail(where + " attrs.num_outputs", "must be >= 1");
    node.num_outputs = static_cast<uint32_t>(outs);
  }
  return node;
}

}  // namespace

std::string Graph::describe_node(uint32_t nid) const {
  std::ostringstream os;
  os << "node " << nid;
  if (nid < nodes.size()) os << " '" << nodes[nid].name << "'";
  return os.str();
}

Graph ParseGraphJSON(const std::string& text) {
  json::Value root = kReader.Parse(text, "document");
  json::Object top = kReader.Object(root, "document");
  Graph g;

  // Nodes: parse headers first (so inputs can name any node in messages), then inputs.
  json::Array json_nodes = kReader.Array(kReader.Require(top, "nodes", "document"), "field 'nodes'");
  for (size_t i = 0; i < json_nodes.size(); ++i) g.nodes.push_back(ParseNode(json_nodes[i], i));
  for (uint32_t nid = 0; nid < g.nodes.size(); ++nid) {
    json::Object obj = kReader.Object(json_nodes[nid], "node");
    std::string where = g.describe_node(nid) + " field 'inputs'";
    json::Array inputs = kReader.Array(kReader.Require(obj, "inputs", g.describe_node(nid)), where);
    GraphNode& node = g.nodes[nid];
    for (size_t k = 0; k < inputs.size(); ++k) {
      node.inputs.push_back(ParseEntry(inputs[k], where + "[" + std::to_string(k) + "]", nid, g));
    }
    if (node.is_input() && !node.inputs.empty()) kReader.Fail(where, "a null node takes no inputs");
    if (!node.is_input()) {
      json::Object attrs = kReader.Object(kReader.Require(obj, "attrs", g.describe_node(nid)), "attrs");
      if (auto n = support::JsonReader::Find(attrs, "num_inputs")) {
        int64_t declared = AsInt(*n, g.describe_node(nid) + " attrs.num_inputs");
        if (declared != static_cast<int64_t>(node.inputs.size())) {
          kReader.Fail(g.describe_node(nid) + " attrs.num_inputs",
               "says " + std::to_string(declared) + " but the node has " +
                   std::to_string(node.inputs.size()) + " inputs");
        }
      }
      if (node.func_name == "__copy" && (node.inputs.size() != 1 || node.num_outputs != 1)) {
        kReader.Fail(g.describe_node(nid), "__copy takes one input and has one output");
      }
    }
  }

  // node_row_ptr must be the prefix sum of num_outputs: it defines the entry ids.
  json::Array row_ptr = kReader.Array(kReader.Require(top, "node_row_ptr", "document"), "field 'node_row_ptr'");
  if (row_ptr.size() != g.nodes.size() + 1) {
    kReader.Fail("field 'node_row_ptr'", "has " + std::to_string(row_ptr.size()) + " values, expected " +
                                     std::to_string(g.nodes.size() + 1) + " (nodes + 1)");
  }
  uint32_t total = 0;
  for (uint32_t nid = 0; nid <= g.nodes.size(); ++nid) {
    int64_t value = AsInt(row_ptr[nid], "node_row_ptr[" + std::to_string(nid) + "]");
    if (value != total) {
      kReader.Fail("field 'node_row_ptr'[" + std::to_string(nid) + "]",
           "is " + std::to_string(value) + ", expected " + std::to_string(total) +
               " (running sum of num_outputs)");
    }
    g.node_row_ptr.push_back(total);
    if (nid < g.nodes.size()) total += g.nodes[nid].num_outputs;
  }
  const size_t num_entries = g.num_entries();

  json::Array args = kReader.Array(kReader.Require(top, "arg_nodes", "document"), "field 'arg_nodes'");
  for (size_t i = 0; i < args.size(); ++i) {
    std::string where = "arg_nodes[" + std::to_string(i) + "]";
    int64_t nid = AsInt(args[i], where);
    if (nid < 0 || nid >= static_cast<int64_t>(g.nodes.size()) || !g.nodes[nid].is_input()) {
      kReader.Fail(where, std::to_string(nid) + " is not a null node");
    }
    g.arg_nodes.push_back(static_cast<uint32_t>(nid));
  }

  json::Array heads = kReader.Array(kReader.Require(top, "heads", "document"), "field 'heads'");
  for (size_t i = 0; i < heads.size(); ++i) {
    g.heads.push_back(ParseEntry(heads[i], "heads[" + std::to_string(i) + "]", g.nodes.size(), g));
  }

  json::Object attrs = kReader.Object(kReader.Require(top, "attrs", "document"), "field 'attrs'");
  json::Array shapes = ParseColumn(kReader.Require(attrs, "shape", "attrs"), "shape", "list_shape");
  CheckColumnLength(shapes, num_entries, "shape");
  for (size_t e = 0; e < num_entries; ++e) {
    std::string where = "attrs.shape[" + std::to_string(e) + "]";
    std::vector<int64_t> shape;
    for (const Any& dim : kReader.Array(shapes[e], where)) {
      int64_t d = AsInt(dim, where);
      if (d < 0) kReader.Fail(where, "has a negative dimension");
      shape.push_back(d);
    }
    g.shapes.push_back(std::move(shape));
  }

  json::Array dtypes = ParseColumn(kReader.Require(attrs, "dltype", "attrs"), "dltype", "list_str");
  CheckColumnLength(dtypes, num_entries, "dltype");
  for (size_t e = 0; e < num_entries; ++e) {
    std::string where = "attrs.dltype[" + std::to_string(e) + "]";
    std::string name = kReader.String(dtypes[e], where);
    try {
      g.dtypes.push_back(tvm::ffi::StringToDLDataType(String(name)));
    } catch (const tvm::ffi::Error&) {
      kReader.Fail(where, "unknown dtype '" + name + "'");
    }
  }

  json::Array sids = ParseColumn(kReader.Require(attrs, "storage_id", "attrs"), "storage_id", "list_int");
  CheckColumnLength(sids, num_entries, "storage_id");
  for (size_t e = 0; e < num_entries; ++e) {
    int64_t sid = AsInt(sids[e], "attrs.storage_id[" + std::to_string(e) + "]");
    if (sid < 0) kReader.Fail("attrs.storage_id[" + std::to_string(e) + "]", "is negative");
    g.storage_ids.push_back(sid);
  }

  g.storage_offsets.assign(num_entries, 0);
  if (auto column = support::JsonReader::Find(attrs, "storage_offset")) {
    json::Array offsets = ParseColumn(*column, "storage_offset", "list_int");
    CheckColumnLength(offsets, num_entries, "storage_offset");
    for (size_t e = 0; e < num_entries; ++e) {
      std::string where = "attrs.storage_offset[" + std::to_string(e) + "]";
      int64_t offset = AsInt(offsets[e], where);
      if (offset < 0 || offset % kStorageOffsetAlignment != 0) {
        kReader.Fail(where, std::to_string(offset) + " is not a non-negative multiple of " +
                        std::to_string(kStorageOffsetAlignment) + " bytes");
      }
      g.storage_offsets[e] = offset;
    }
  }

  if (auto column = support::JsonReader::Find(attrs, "device_index")) {
    json::Array values = ParseColumn(*column, "device_index", "list_int");
    // Per node (tvm-hetero) or per entry (legacy); per-entry values must agree within a node.
    bool per_entry = values.size() == num_entries && values.size() != g.nodes.size();
    if (!per_entry && values.size() != g.nodes.size()) {
      kReader.Fail("attrs.device_index", "has " + std::to_string(values.size()) + " values, expected " +
                                     std::to_string(g.nodes.size()) + " (one per node) or " +
                                     std::to_string(num_entries) + " (one per entry)");
    }
    for (uint32_t nid = 0; nid < g.nodes.size(); ++nid) {
      size_t first = per_entry ? g.node_row_ptr[nid] : nid;
      int64_t value = AsInt(values[first], "attrs.device_index[" + std::to_string(first) + "]");
      for (uint32_t k = 1; per_entry && k < g.nodes[nid].num_outputs; ++k) {
        if (AsInt(values[first + k], "attrs.device_index") != value) {
          kReader.Fail("attrs.device_index", "outputs of " + g.describe_node(nid) + " name different devices");
        }
      }
      g.node_device_values.push_back(value);
    }
  }
  if (auto kind = support::JsonReader::Find(attrs, "device_index_kind")) {
    json::Array pair = kReader.Array(*kind, "attrs.device_index_kind");
    if (pair.size() != 2) kReader.Fail("attrs.device_index_kind", "expected [\"str\", value]");
    std::string value = kReader.String(pair[1], "attrs.device_index_kind");
    if (value == "position") {
      g.device_index_kind = DeviceIndexKind::kPosition;
    } else if (value == "device_type") {
      g.device_index_kind = DeviceIndexKind::kDeviceType;
    } else {
      kReader.Fail("attrs.device_index_kind", "must be 'position' or 'device_type', got '" + value + "'");
    }
  }
  return g;
}

}  // namespace tvm_hetero
