/*!
 * \file storage_plan.cc
 * \brief Pool slots from storage ids and offsets; rejects a storage id shared across devices and,
 *        re-checking the finished pool, two live entries sharing bytes.
 */
#include <tvm/ffi/error.h>
#include <tvm_hetero/storage_plan.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace tvm_hetero {

size_t EntryBytes(const std::vector<int64_t>& shape, DLDataType dtype) {
  size_t count = 1;
  for (int64_t dim : shape) {
    if (dim != 0 && count > std::numeric_limits<size_t>::max() / static_cast<size_t>(dim)) {
      TVM_FFI_THROW(ValueError) << "tensor size overflows";
    }
    count *= static_cast<size_t>(dim);
  }
  size_t bits_per_element = static_cast<size_t>(dtype.bits) * dtype.lanes;
  return (count * bits_per_element + 7) / 8;
}

std::vector<size_t> StoragePlan::BytesPerDevice(size_t num_devices) const {
  std::vector<size_t> total(num_devices, 0);
  for (const StorageSlot& slot : slots) total[slot.device] += slot.nbytes;
  return total;
}

StoragePlan PlanStorage(const Graph& graph, const std::vector<int>& node_device,
                        const std::vector<bool>& offsets_usable) {
  StoragePlan plan;
  plan.entry_slot.resize(graph.num_entries());
  plan.entry_offset.resize(graph.num_entries());
  plan.entry_device.resize(graph.num_entries());
  // (storage id, offset kept apart or -1) -> (slot index, first node that used it)
  std::map<std::pair<int64_t, int64_t>, std::pair<uint32_t, uint32_t>> slot_of_sid;
  for (uint32_t nid = 0; nid < graph.nodes.size(); ++nid) {
    int device = node_device[nid];
    bool usable = offsets_usable.empty() || (device < static_cast<int>(offsets_usable.size()) && offsets_usable[device]);
    for (uint32_t k = 0; k < graph.nodes[nid].num_outputs; ++k) {
      uint32_t eid = graph.entry_id(nid, k);
      int64_t sid = graph.storage_ids[eid];
      size_t offset = graph.storage_offsets.empty() ? 0 : static_cast<size_t>(graph.storage_offsets[eid]);
      size_t nbytes = EntryBytes(graph.shapes[eid], graph.dtypes[eid]);
      std::pair<int64_t, int64_t> key{sid, usable ? -1 : static_cast<int64_t>(offset)};
      if (!usable) offset = 0;
      auto [it, inserted] = slot_of_sid.emplace(key, std::make_pair(uint32_t(plan.slots.size()), nid));
      if (inserted) plan.slots.push_back(StorageSlot{device, 0});
      StorageSlot& slot = plan.slots[it->second.first];
      if (slot.device != device) {
        uint32_t other = it->second.second;
        TVM_FFI_THROW(ValueError) << "storage_id " << sid << " is shared across devices: "
                                  << graph.describe_node(other) << " on device " << slot.device << " and "
                                  << graph.describe_node(nid) << " on device " << device;
      }
      if (nbytes > std::numeric_limits<size_t>::max() - offset) {
        TVM_FFI_THROW(ValueError) << graph.describe_node(nid) << ": storage_offset " << offset << " overflows";
      }
      slot.nbytes = std::max(slot.nbytes, offset + nbytes);
      plan.entry_slot[eid] = it->second.first;
      plan.entry_offset[eid] = offset;
      plan.entry_device[eid] = device;
    }
  }
  VerifyStoragePlan(graph, plan);
  return plan;
}

void VerifyStoragePlan(const Graph& graph, const StoragePlan& plan) {
  const uint32_t num_nodes = static_cast<uint32_t>(graph.nodes.size());
  // The last node at which each entry is live (num_nodes: a graph output; past it: an input).
  std::vector<uint32_t> last_use(graph.num_entries());
  for (uint32_t nid = 0; nid < num_nodes; ++nid) {
    for (uint32_t k = 0; k < graph.nodes[nid].num_outputs; ++k) {
      last_use[graph.entry_id(nid, k)] = graph.nodes[nid].is_input() ? num_nodes + 1 : nid;
    }
    for (const EntryRef& e : graph.nodes[nid].inputs) {
      uint32_t& last = last_use[graph.entry_id(e)];
      last = std::max(last, nid);
    }
  }
  for (const EntryRef& e : graph.heads) {
    uint32_t& last = last_use[graph.entry_id(e)];
    last = std::max(last, num_nodes);
  }
  struct Live {
    uint32_t last_use;
    size_t begin, end;
    uint32_t nid;
  };
  std::vector<std::vector<Live>> live(plan.slots.size());  // per slot, the entries not yet dead
  for (uint32_t nid = 0; nid < num_nodes; ++nid) {
    if (graph.nodes[nid].func_name == "__nop") continue;  // its outputs are never written
    for (uint32_t k = 0; k < graph.nodes[nid].num_outputs; ++k) {
      uint32_t eid = graph.entry_id(nid, k);
      size_t begin = plan.entry_offset[eid];
      size_t end = begin + EntryBytes(graph.shapes[eid], graph.dtypes[eid]);
      if (end == begin) continue;
      std::vector<Live>& others = live[plan.entry_slot[eid]];
      others.erase(std::remove_if(others.begin(), others.end(), [&](const Live& o) { return o.last_use < nid; }),
                   others.end());
      for (const Live& o : others) {
        if (o.begin < end && begin < o.end) {
          TVM_FFI_THROW(ValueError) << "storage_id " << graph.storage_ids[eid] << ": "
                                    << graph.describe_node(o.nid) << " (bytes [" << o.begin << ", " << o.end
                                    << ")) and " << graph.describe_node(nid) << " (bytes [" << begin << ", "
                                    << end << ")) are live at once but share bytes";
        }
      }
      others.push_back(Live{last_use[eid], begin, end, nid});
    }
  }
}

}  // namespace tvm_hetero
