/*!
 * \file device_assignment.cc
 * \brief Map `device_index` values to positions in the device list (docs/graph-format.md).
 */
#include <tvm/ffi/error.h>
#include <tvm_hetero/device_assignment.h>

#include "support/device.h"

#include <string>

namespace tvm_hetero {

std::vector<int> AssignDevices(const Graph& graph, const std::vector<DLDevice>& devices,
                               DeviceIndexKind requested_kind) {
  if (devices.empty()) TVM_FFI_THROW(ValueError) << "create needs at least one device";
  std::vector<int> position(graph.nodes.size(), 0);
  if (graph.node_device_values.empty()) return position;
  DeviceIndexKind kind = graph.device_index_kind.value_or(requested_kind);
  for (uint32_t nid = 0; nid < graph.nodes.size(); ++nid) {
    int64_t value = graph.node_device_values[nid];
    if (kind == DeviceIndexKind::kPosition) {
      if (value < 0 || value >= static_cast<int64_t>(devices.size())) {
        TVM_FFI_THROW(ValueError) << graph.describe_node(nid) << ": device_index " << value
                                  << " is out of range for " << devices.size() << " device(s)";
      }
      position[nid] = static_cast<int>(value);
      continue;
    }
    // Legacy: a DLDeviceType, resolved to the first listed device of that type, as TVM did.
    int found = -1;
    for (size_t k = 0; k < devices.size() && found < 0; ++k) {
      if (support::HasDeviceType(devices[k], value)) found = static_cast<int>(k);
    }
    if (found < 0) {
      TVM_FFI_THROW(ValueError) << graph.describe_node(nid) << ": device_index " << value
                                << " is a device type (legacy graph) that no given device has";
    }
    position[nid] = found;
  }
  return position;
}

}  // namespace tvm_hetero
