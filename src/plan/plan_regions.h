/*!
 * \file plan/plan_regions.h
 * \brief The bytes a graph entry occupies in its pool slot (what a step reads or writes).
 */
#ifndef TVM_HETERO_PLAN_PLAN_REGIONS_H_
#define TVM_HETERO_PLAN_PLAN_REGIONS_H_

#include <tvm_hetero/graph.h>
#include <tvm_hetero/storage_plan.h>

#include "concurrency/step_schedule.h"

namespace tvm_hetero {

inline MemoryRegion EntryRegion(const Graph& graph, const StoragePlan& storage, uint32_t eid) {
  size_t begin = storage.entry_offset[eid];
  return MemoryRegion{storage.entry_slot[eid], begin, begin + EntryBytes(graph.shapes[eid], graph.dtypes[eid])};
}

}  // namespace tvm_hetero

#endif  // TVM_HETERO_PLAN_PLAN_REGIONS_H_
