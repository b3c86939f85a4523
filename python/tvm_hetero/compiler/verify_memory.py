"""Re-check a finished memory plan from the graph alone, independently of how it was made.

Run at the end of every plan (memory.py). Liveness is recomputed here from the node order: an
entry is live from its node to its last reader (the end of the run for a graph output, for ever for
an input or param). The plan is rejected, naming both entries or the storage id, when:
- two entries live at one node overlap in bytes of the same storage id;
- a storage id is used by nodes of two devices;
- an entry does not fit its storage id, or sits at a negative or misaligned offset.
A sweep over entries in start order keeps only the live ones, so the check costs about
``entries x (entries live at once)``.
"""

from __future__ import annotations

from ..graph import Graph
from .arena import ALIGNMENT


class MemoryPlanError(ValueError):
    """A memory plan that would let two live tensors clobber each other."""


def verify_memory_plan(graph: Graph, plan) -> None:
    """Raise :class:`MemoryPlanError` unless ``plan`` (a memory.MemoryPlan) is safe for ``graph``."""
    n = len(graph.nodes)
    row_ptr = graph.entry_ids()
    owners: list[tuple[int, int]] = []  # (node id, output index) per entry
    for nid, node in enumerate(graph.nodes):
        owners += [(nid, j) for j in range(node.num_outputs)]
    if len(plan.storage_ids) != len(owners):
        raise MemoryPlanError(
            f"memory plan has {len(plan.storage_ids)} storage ids for {len(owners)} entries"
        )

    def name(eid: int) -> str:
        nid, j = owners[eid]
        return f"entry {eid} (output {j} of node {nid} '{graph.nodes[nid].name}')"

    end = [nid for nid, _ in owners]
    for nid, node in enumerate(graph.nodes):
        for e in node.inputs:
            end[row_ptr[e.node] + e.index] = max(end[row_ptr[e.node] + e.index], nid)
    for e in graph.heads:
        end[row_ptr[e.node] + e.index] = n
    for eid, (nid, _) in enumerate(owners):
        if graph.nodes[nid].is_input:
            end[eid] = n + 1  # inputs and params outlive every run

    device_of: dict[int, tuple[int, int]] = {}  # storage id -> (device, first entry)
    live: dict[int, list[tuple[int, int, int, int]]] = {}  # storage id -> (end, offset, top, entry)
    for eid, (nid, j) in enumerate(owners):
        node = graph.nodes[nid]
        sid, offset, size = plan.storage_ids[eid], plan.offset(eid), node.output_bytes(j)
        if not 0 <= sid < len(plan.storage_bytes):
            raise MemoryPlanError(f"{name(eid)}: storage id {sid} does not exist")
        dev, first = device_of.setdefault(sid, (node.device, eid))
        if dev != node.device:
            raise MemoryPlanError(
                f"storage id {sid} crosses devices: {name(first)} on device {dev}, {name(eid)} on device {node.device}"
            )
        if offset < 0 or offset % ALIGNMENT:
            raise MemoryPlanError(
                f"{name(eid)}: offset {offset} is not a non-negative multiple of {ALIGNMENT}"
            )
        if offset + size > plan.storage_bytes[sid]:
            raise MemoryPlanError(
                f"{name(eid)}: bytes [{offset}, {offset + size}) exceed storage id {sid} of "
                f"{plan.storage_bytes[sid]} bytes"
            )
        # Entries are produced in node order, so the others still live at node nid end at or after it.
        others = [o for o in live.get(sid, []) if o[0] >= nid]
        for _, lo, hi, other in others:
            if lo < offset + size and offset < hi and size and hi > lo:
                raise MemoryPlanError(
                    f"{name(eid)} and {name(other)} are live at once but overlap in bytes of storage id {sid}: "
                    f"[{offset}, {offset + size}) and [{lo}, {hi})"
                )
        others.append((end[eid], offset, offset + size, eid))
        live[sid] = others
