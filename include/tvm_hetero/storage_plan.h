/*!
 * \file tvm_hetero/storage_plan.h
 * \brief From the graph's storage ids and offsets to pool slots: one slot per storage id, on one
 *        device, sized to hold every user at its offset; then a check that no two entries live at
 *        once share bytes.
 */
#ifndef TVM_HETERO_STORAGE_PLAN_H_
#define TVM_HETERO_STORAGE_PLAN_H_

#include <tvm_hetero/graph.h>

#include <cstddef>
#include <vector>

namespace tvm_hetero {

/*! \brief One pool allocation. */
struct StorageSlot {
  /*! \brief Device position it lives on. */
  int device = 0;
  /*! \brief Bytes: the largest offset + size among the entries that use it. */
  size_t nbytes = 0;
};

/*! \brief Where every entry's memory comes from. */
struct StoragePlan {
  /*! \brief The pool, densely numbered. */
  std::vector<StorageSlot> slots;
  /*! \brief Slot of each entry. */
  std::vector<uint32_t> entry_slot;
  /*! \brief Byte offset of each entry within its slot. */
  std::vector<size_t> entry_offset;
  /*! \brief Device position of each entry (its node's). */
  std::vector<int> entry_device;

  /*! \brief Total pool bytes on each of `num_devices` devices. */
  std::vector<size_t> BytesPerDevice(size_t num_devices) const;
};

/*! \brief Bytes an entry of this shape and dtype needs. \throws on overflow. */
size_t EntryBytes(const std::vector<int64_t>& shape, DLDataType dtype);

/*!
 * \brief Re-check a pool against the graph's own liveness, independently of whoever planned the
 *        storage ids (the compiler's memory.py, TVM's old planner, a hand-written graph): an entry
 *        is live from its node to its last reader (the end of the run for a graph output, always
 *        for an input or parameter; a `__nop` output is never written). Costs about entries x
 *        entries live at once in one slot.
 * \throws tvm::ffi::Error (ValueError) naming both nodes, the storage id and both byte ranges when
 *         two entries live at once overlap in bytes of one slot.
 */
void VerifyStoragePlan(const Graph& graph, const StoragePlan& plan);

/*!
 * \brief Build the pool, then check it with VerifyStoragePlan (always: a plan that lets two live
 *        tensors share bytes would corrupt results silently).
 * \param node_device Device position of each node (from AssignDevices).
 * \param offsets_usable Per device position: whether a view may start inside an allocation (a
 *        pointer plus an offset is a valid data pointer there). Where it may not, each distinct
 *        (storage id, offset) gets a slot of its own -- safe, as entries at one offset never live
 *        at once, but without the savings. Empty: usable everywhere.
 * \throws tvm::ffi::Error (ValueError) naming both nodes when a storage id is used on two devices,
 *         or as VerifyStoragePlan.
 */
StoragePlan PlanStorage(const Graph& graph, const std::vector<int>& node_device,
                        const std::vector<bool>& offsets_usable = {});

}  // namespace tvm_hetero

#endif  // TVM_HETERO_STORAGE_PLAN_H_
