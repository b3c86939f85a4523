/*!
 * \file tvm_hetero/device_assignment.h
 * \brief Which of the devices given to create each node runs on.
 */
#ifndef TVM_HETERO_DEVICE_ASSIGNMENT_H_
#define TVM_HETERO_DEVICE_ASSIGNMENT_H_

#include <dlpack/dlpack.h>
#include <tvm_hetero/graph.h>

#include <vector>

namespace tvm_hetero {

/*!
 * \brief The device position (into `devices`) of every node.
 * \param graph The loaded graph.
 * \param devices The devices given to create; devices[0] is the fallback.
 * \param requested_kind The caller's reading of `device_index`; the graph's own attribute wins.
 * \throws tvm::ffi::Error (ValueError) naming the node whose value names no given device.
 */
std::vector<int> AssignDevices(const Graph& graph, const std::vector<DLDevice>& devices,
                               DeviceIndexKind requested_kind);

}  // namespace tvm_hetero

#endif  // TVM_HETERO_DEVICE_ASSIGNMENT_H_
