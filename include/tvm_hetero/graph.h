/*!
 * \file tvm_hetero/graph.h
 * \brief The parsed, validated graph (docs/graph-format.md): plain data, no device or kernel yet.
 */
#ifndef TVM_HETERO_GRAPH_H_
#define TVM_HETERO_GRAPH_H_

#include <dlpack/dlpack.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tvm_hetero {

/*! \brief Every `storage_offset` is a multiple of this (the pool's alignment; kernels may assume it). */
inline constexpr int64_t kStorageOffsetAlignment = 64;

/*! \brief One output of one node. */
struct EntryRef {
  /*! \brief Producing node. */
  uint32_t node_id = 0;
  /*! \brief Output index within that node. */
  uint32_t index = 0;
};

/*! \brief What the `device_index` column holds. */
enum class DeviceIndexKind {
  /*! \brief Position in the device list given to create (tvm-hetero). */
  kPosition,
  /*! \brief A DLDeviceType, mapped to the first listed device of that type (TVM <= 0.19). */
  kDeviceType,
};

/*! \brief One node of the graph. */
struct GraphNode {
  /*! \brief "null" (input or parameter) or "tvm_op" (kernel call). */
  std::string op;
  /*! \brief Unique node name. */
  std::string name;
  /*! \brief Kernel symbol, "__copy" or "__nop"; empty for null nodes. */
  std::string func_name;
  /*! \brief Input entries, each produced by an earlier node. */
  std::vector<EntryRef> inputs;
  /*! \brief Number of outputs (1 for null nodes). */
  uint32_t num_outputs = 1;

  bool is_input() const { return op == "null"; }
};

/*! \brief A graph as loaded from JSON, checked for internal consistency. */
struct Graph {
  /*! \brief Nodes in execution order. */
  std::vector<GraphNode> nodes;
  /*! \brief Ids of the null nodes (inputs and parameters). */
  std::vector<uint32_t> arg_nodes;
  /*! \brief First entry id of each node, plus the total number of entries. */
  std::vector<uint32_t> node_row_ptr;
  /*! \brief Graph outputs. */
  std::vector<EntryRef> heads;
  /*! \brief Shape of each entry. */
  std::vector<std::vector<int64_t>> shapes;
  /*! \brief Dtype of each entry. */
  std::vector<DLDataType> dtypes;
  /*! \brief Storage slot of each entry. */
  std::vector<int64_t> storage_ids;
  /*! \brief Byte offset of each entry within its storage slot (all 0 when the column is absent). */
  std::vector<int64_t> storage_offsets;
  /*! \brief Raw `device_index` value of each node; empty when the column is absent. */
  std::vector<int64_t> node_device_values;
  /*! \brief The graph's own `device_index_kind` attribute, if it has one. */
  std::optional<DeviceIndexKind> device_index_kind;

  size_t num_entries() const { return node_row_ptr.empty() ? 0 : node_row_ptr.back(); }
  uint32_t entry_id(uint32_t nid, uint32_t index) const { return node_row_ptr[nid] + index; }
  uint32_t entry_id(const EntryRef& e) const { return entry_id(e.node_id, e.index); }
  /*! \brief "node 3 'add0'", for error messages. */
  std::string describe_node(uint32_t nid) const;
};

/*!
 * \brief Parse and validate graph JSON.
 * \throws tvm::ffi::Error (ValueError) naming the node and field at fault.
 */
Graph ParseGraphJSON(const std::string& json);

}  // namespace tvm_hetero

#endif  // TVM_HETERO_GRAPH_H_
