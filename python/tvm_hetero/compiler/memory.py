"""Memory planning: give every tensor entry a storage id, sharing storage between dead tensors.

Liveness, over the node order (the execution order): an entry produced by node ``p`` is live on the
closed interval ``[p, last]``, where ``last`` is the position of its last consumer, ``len(nodes)``
for a graph output (it must survive the run) and ``p`` itself for an unused output (the kernel
still writes it). Two entries may share a slot only if their intervals are disjoint; because the
intervals are closed, a node's outputs never share with its own inputs nor with each other, while
they may reuse the slot of an input whose last use was an earlier node. Entries of "null" nodes
(inputs and params) get dedicated storage that is never shared.

Algorithm, per device (slots are never shared across devices), keeping the cheaper of two greedy
assignments of the device's kernel entries to slots, a slot sized by its largest user:
- best fit in execution order: at each node, first release the slots whose entry died at an
  earlier node, then give each output the smallest free slot that holds it; if none does, grow the
  largest free slot (cheaper than a new slot by that slot's size); only with no free slot at all
  open a new one.
- greedy by size: entries from the largest down, each into the slot (all big enough by then) with
  no overlapping interval and the smallest time gap to its neighbours there, else a new slot.

Guarantee: the plan is safe -- no two entries with overlapping live intervals, nor on two devices,
share a slot -- and per device ``lower_bound_bytes <= slot_bound_bytes <= planned_bytes <=
unshared_bytes``. ``lower_bound_bytes`` is the peak of bytes simultaneously live; ``slot_bound_bytes``
is the tighter bound for storage-id plans (the ``j``-th largest slot is at least the ``j``-th largest
size live at any one time), since a slot cannot be split the way an arena offset could. Optimal slot
assignment is NP-hard, so the gap is not bounded in general; planned equals the slot bound on
chains of equal or monotone sizes and on the ResNet-like graphs of the tests, where the peak-live bound can be 20 % lower
(a large early tensor's slot cannot hold two later tensors at once).

Accounting: ``planned_bytes``, both bounds and ``unshared_bytes`` cover kernel outputs only (the
memory this pass can save); the dedicated storage of inputs and params is reported separately, per
device, as ``input_bytes``.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from .graph import Graph


@dataclass
class MemoryPlan:
    """Storage ids per entry and, per device, the bytes the plan needs."""

    storage_ids: list[int]  # per entry, in Graph.entry_ids() order
    storage_device: list[int]  # per storage id
    storage_bytes: list[int]  # per storage id: the size of its largest user
    planned_bytes: list[int]  # per device: shared slots for kernel outputs
    lower_bound_bytes: list[int]  # per device: peak bytes of kernel outputs live at once
    slot_bound_bytes: list[int]  # per device: tighter bound for storage-id plans (see _bounds)
    unshared_bytes: list[int]  # per device: all kernel outputs, one slot each
    input_bytes: list[int]  # per device: dedicated storage of inputs and params

    def report(self) -> str:
        """One line per device: planned vs the two bounds vs unshared, plus inputs/params."""
        lines = []
        for dev, planned in enumerate(self.planned_bytes):
            peak, slot = self.lower_bound_bytes[dev], self.slot_bound_bytes[dev]
            ids = sum(1 for d in self.storage_device if d == dev)
            lines.append(
                f"dev{dev}: planned {_mib(planned)} ({_ratio(planned, peak)} of peak-live bound "
                f"{_mib(peak)}, {_ratio(planned, slot)} of slot bound {_mib(slot)}), "
                f"unshared {_mib(self.unshared_bytes[dev])}; inputs/params {_mib(self.input_bytes[dev])} "
                f"dedicated; {ids} storage ids"
            )
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _ratio(planned: int, bound: int) -> str:
    return f"{planned / bound:.3f}x" if bound else "-"


@dataclass
class _Item:
    """A kernel entry to place: its entry id, bytes and closed live interval."""

    entry: int
    size: int
    start: int
    end: int


def _best_fit(items: list[_Item]) -> tuple[list[int], list[int]]:
    """Slot per item (index into the returned slot sizes), best fit in execution order."""
    sizes: list[int] = []
    slot_of = [0] * len(items)
    free: list[tuple[int, int]] = []  # sorted (size, slot)
    live: list[tuple[int, int]] = []  # heap (end, slot)
    for i in sorted(range(len(items)), key=lambda i: (items[i].start, items[i].entry)):
        item = items[i]
        while live and live[0][0] < item.start:
            slot = heapq.heappop(live)[1]
            bisect.insort(free, (sizes[slot], slot))
        at = bisect.bisect_left(free, (item.size, -1))
        if at < len(free):
            slot = free.pop(at)[1]
        elif free:
            slot = free.pop()[1]
            sizes[slot] = item.size
        else:
            slot = len(sizes)
            sizes.append(item.size)
        slot_of[i] = slot
        heapq.heappush(live, (item.end, slot))
    return slot_of, sizes


def _by_size(items: list[_Item]) -> tuple[list[int], list[int]]:
    """Slot per item, greedy by size: largest first, into the tightest non-overlapping slot."""
    sizes: list[int] = []
    spans: list[list[tuple[int, int]]] = []  # per slot: sorted disjoint (start, end)
    slot_of = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-items[i].size, items[i].start, items[i].entry)):
        item = items[i]
        best, best_gap = -1, 0
        for slot, taken in enumerate(spans):
            at = bisect.bisect_left(taken, (item.start, item.end))
            prev_end = taken[at - 1][1] if at else None
            next_start = taken[at][0] if at < len(taken) else None
            if (prev_end is not None and prev_end >= item.start) or (
                next_start is not None and next_start <= item.end
            ):
                continue
            gaps = [item.start - prev_end] if prev_end is not None else []
            gaps += [next_start - item.end] if next_start is not None else []
            gap = min(gaps) if gaps else 1 << 62
            if best < 0 or gap < best_gap:
                best, best_gap = slot, gap
        if best < 0:
            best = len(sizes)
            sizes.append(item.size)
            spans.append([])
        bisect.insort(spans[best], (item.start, item.end))
        slot_of[i] = best
    return slot_of, sizes


def _bounds(items: list[_Item], length: int) -> tuple[int, int]:
    """``(peak bytes live at once, slot bound)`` over positions ``0..length``.

    Slot bound: at any time the ``j`` largest live entries sit in ``j`` distinct slots, so the
    ``j``-th largest slot is at least the ``j``-th largest live size at every time; summing over
    ``j`` bounds every storage-id plan, and is at least the peak.
    """
    peak = 0
    column: list[int] = []  # column[j]: max over time of the j-th largest live size
    live: list[tuple[int, int]] = []  # heap (end, size)
    by_start = sorted(items, key=lambda item: item.start)
    at = 0
    for t in range(length + 1):
        while live and live[0][0] < t:
            heapq.heappop(live)
        while at < len(by_start) and by_start[at].start == t:
            heapq.heappush(live, (by_start[at].end, by_start[at].size))
            at += 1
        sizes = sorted((size for _, size in live), reverse=True)
        peak = max(peak, sum(sizes))
        column.extend([0] * (len(sizes) - len(column)))
        column[: len(sizes)] = [max(c, s) for c, s in zip(column, sizes)]
    return peak, sum(column)


def plan_memory(graph: Graph) -> MemoryPlan:
    """Storage ids and per-device byte counts for ``graph`` in its node order (module docstring)."""
    graph.validate()
    n = len(graph.nodes)
    row_ptr = graph.entry_ids()
    num_entries = row_ptr[-1] + graph.nodes[-1].num_outputs if n else 0
    last = [-1] * num_entries
    for nid, node in enumerate(graph.nodes):
        for e in node.inputs:
            last[row_ptr[e.node] + e.index] = nid
    for e in graph.heads:
        last[row_ptr[e.node] + e.index] = n
    num_devices = max((node.device for node in graph.nodes), default=-1) + 1

    items: list[list[_Item]] = [[] for _ in range(num_devices)]
    for nid, node in enumerate(graph.nodes):
        if node.is_input:
            continue
        for j in range(node.num_outputs):
            eid = row_ptr[nid] + j
            items[node.device].append(_Item(eid, node.output_bytes(j), nid, max(nid, last[eid])))

    # Per device, the cheaper assignment; slot keys are (device, local slot).
    slot_key: dict[int, tuple[int, int]] = {}
    local_size: dict[tuple[int, int], int] = {}
    planned = [0] * num_devices
    for dev, dev_items in enumerate(items):
        plans = [_best_fit(dev_items), _by_size(dev_items)]
        slot_of, sizes = min(plans, key=lambda plan: sum(plan[1]))  # first (best fit) on ties
        for item, slot in zip(dev_items, slot_of):
            slot_key[item.entry] = (dev, slot)
        local_size.update({(dev, slot): size for slot, size in enumerate(sizes)})
        planned[dev] = sum(sizes)

    # Number storage ids by first use in entry order; each input/param entry gets its own.
    storage_ids: list[int] = []
    storage_device: list[int] = []
    storage_bytes: list[int] = []
    input_bytes = [0] * num_devices
    numbered: dict[tuple[int, int], int] = {}
    for nid, node in enumerate(graph.nodes):
        for j in range(node.num_outputs):
            eid = row_ptr[nid] + j
            if node.is_input:
                storage_ids.append(len(storage_device))
                storage_device.append(node.device)
                storage_bytes.append(node.output_bytes(j))
                input_bytes[node.device] += node.output_bytes(j)
                continue
            key = slot_key[eid]
            if key not in numbered:
                numbered[key] = len(storage_device)
                storage_device.append(key[0])
                storage_bytes.append(local_size[key])
            storage_ids.append(numbered[key])

    bounds = [_bounds(dev_items, n) for dev_items in items]
    return MemoryPlan(
        storage_ids=storage_ids,
        storage_device=storage_device,
        storage_bytes=storage_bytes,
        planned_bytes=planned,
        lower_bound_bytes=[peak for peak, _ in bounds],
        slot_bound_bytes=[slot for _, slot in bounds],
        unshared_bytes=[sum(item.size for item in dev_items) for dev_items in items],
        input_bytes=input_bytes,
    )
