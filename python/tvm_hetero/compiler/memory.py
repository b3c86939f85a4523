"""Memory planning: give every tensor entry a storage id and a byte offset in it, sharing memory
between tensors that are not live at the same time.

Liveness, over the node order (the execution order): an entry produced by node ``p`` is live on the
closed interval ``[p, last]``, where ``last`` is the position of its last consumer, ``len(nodes)``
for a graph output (it must survive the run) and ``p`` itself for an unused output (the kernel
still writes it). Two entries may share a slot only if their intervals are disjoint; because the
intervals are closed, a node's outputs never share with its own inputs nor with each other, while
they may reuse the slot of an input whose last use was an earlier node. Entries of "null" nodes
(inputs and params) get dedicated storage that is never shared.

Algorithm, per device (storage is never shared across devices), in two stages.

Stage 2 (the default, ``offsets=True``): the device's kernel entries are placed at byte offsets of
one arena by the portfolio of ``arena.py`` (greedy by size / breadth / start time, best and first
fit, gravity compaction), which starts from the stage-1 plan laid end to end. The arena is then cut
into storage ids where no entry's bytes cross (:func:`_arena_components`): they need no more than
the arena together, and a plan whose offsets are all 0 is a classic storage-id plan. The result is
kept only if it needs fewer bytes than stage 1 (offsets are rounded to 64 bytes, which can eat the
gain on tiny tensors), so stage 2 never needs more than stage 1.

Stage 1 (and the whole plan with ``offsets=False``, the classic format TVM's graph executor reads): a
portfolio of assignments of the device's kernel entries to slots, a slot sized by its largest user,
keeping the cheapest:
- best fit in execution order: at each node, first release the slots whose entry died at an
  earlier node, then give each output the smallest free slot that holds it; if none does, grow the
  largest free slot (cheaper than a new slot by that slot's size); only with no free slot at all
  open a new one.
- greedy by size: entries from the largest down, each into the slot (all big enough by then) with
  no overlapping interval and the smallest time gap to its neighbours there, else a new slot.
- best fit into reserved slots: the same best fit, starting with free slots sized like the slot
  bound's columns (below), so a small early tensor takes the small reserved slot and leaves the big
  ones for the big tensors to come.
- both best fits again backwards in time (on the mirrored intervals).
If none of these meets the slot bound (it then is optimal), and only then, within a work budget
(:data:`WORK`): slot-by-slot maximum-weight independent sets (:func:`_layers`); local search from
each plan (merge two compatible slots; empty a slot's items above a size level into other slots
when they grow by less; refit best fit into the slots found); finally a branch and bound over
entries by size that stops at the slot bound, when exhausted, or when the budget is spent.
The plan never costs more than either greedy plan alone (the former planner).

Guarantee: the plan is safe -- no two entries with overlapping live intervals share a byte of a
storage id, no storage id is used on two devices; ``verify_memory.py`` re-checks this on every plan
and raises otherwise -- and per device ``lower_bound_bytes <= planned_bytes <= stage 1's plan``; for
stage 1 alone, ``lower_bound_bytes <= slot_bound_bytes <= planned_bytes <= unshared_bytes``. ``lower_bound_bytes``
is the peak of bytes simultaneously live; ``slot_bound_bytes`` is the tighter bound for storage-id
plans without offsets (the ``j``-th largest slot is at least the ``j``-th largest size live at any
one time), since such a slot cannot be split the way offsets split it. Optimal slot assignment
(max-coloring of an interval graph) and optimal offsets (dynamic storage allocation) are NP-hard, so
neither gap is bounded in general; the measured ratios are in docs/performance.md ("Memory
planner: how close to the lower bound").

Accounting: ``planned_bytes``, both bounds and ``unshared_bytes`` cover kernel outputs only (the
memory this pass can save); the dedicated storage of inputs and params is reported separately, per
device, as ``input_bytes``.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from ..graph import Graph
from .arena import aligned, plan_arena
from .verify_memory import verify_memory_plan

#: Work allowed per device, in interval checks, for the passes run only when the greedy plans miss the
#: slot bound (local search, then branch and bound): a few tenths of a second of Python at most.
WORK = 200_000


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
    storage_offsets: list[int] | None = None  # per entry: byte offset in its storage id (None: all 0)

    def offset(self, eid: int) -> int:
        return self.storage_offsets[eid] if self.storage_offsets else 0

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


Plan = tuple[list[int], list[int]]  # (slot per item, bytes per slot: the size of its largest user)


def _cost(plan: Plan) -> int:
    return sum(plan[1])


def _normalise(items: list[_Item], slot_of: list[int]) -> Plan:
    """Slots renumbered 0.. by first item, unused ones dropped, each sized by its largest user."""
    number: dict[int, int] = {}
    sizes: list[int] = []
    out = []
    for item, slot in zip(items, slot_of):
        if slot not in number:
            number[slot] = len(sizes)
            sizes.append(0)
        s = number[slot]
        sizes[s] = max(sizes[s], item.size)
        out.append(s)
    return out, sizes


def _best_fit(items: list[_Item], reserve: list[int] | tuple[int, ...] = ()) -> Plan:
    """Best fit in execution order, optionally into slots reserved with the sizes ``reserve``.

    At each node, first release the slots whose entry died at an earlier node, then give each
    output the smallest free slot that holds it; if none does, grow the largest free slot; only
    with no free slot at all open a new one. Reserved slots start free with their given capacity
    (a slot nobody uses costs nothing, a used one costs its largest user).
    """
    capacity = sorted(reserve)
    slot_of = [0] * len(items)
    free = [(size, slot) for slot, size in enumerate(capacity)]  # sorted (capacity, slot)
    live: list[tuple[int, int]] = []  # heap (end, slot)
    for i in sorted(range(len(items)), key=lambda i: (items[i].start, items[i].entry)):
        item = items[i]
        while live and live[0][0] < item.start:
            slot = heapq.heappop(live)[1]
            bisect.insort(free, (capacity[slot], slot))
        at = bisect.bisect_left(free, (item.size, -1))
        if at < len(free):
            slot = free.pop(at)[1]
        elif free:
            slot = free.pop()[1]
            capacity[slot] = item.size
        else:
            slot = len(capacity)
            capacity.append(item.size)
        slot_of[i] = slot
        heapq.heappush(live, (item.end, slot))
    return _normalise(items, slot_of)


def _mirrored(items: list[_Item]) -> list[_Item]:
    """The items with time reversed: disjoint intervals stay disjoint, so a plan for these is one for
    ``items`` (best fit on them packs from the end of the run backwards)."""
    last = max((item.end for item in items), default=0)
    return [_Item(item.entry, item.size, last - item.end, last - item.start) for item in items]


def _fits(spans: list[tuple[int, int]], item: _Item) -> tuple[int, int] | None:
    """``(gap before, gap after)`` if ``item`` overlaps none of the sorted disjoint ``spans``, else None.

    A missing neighbour counts as a gap of ``1 << 40``.
    """
    at = bisect.bisect_left(spans, (item.start, item.end))
    if at and spans[at - 1][1] >= item.start:
        return None
    if at < len(spans) and spans[at][0] <= item.end:
        return None
    return (
        item.start - spans[at - 1][1] if at else _FAR,
        spans[at][0] - item.end if at < len(spans) else _FAR,
    )


_FAR = 1 << 40


def _by_size(items: list[_Item]) -> Plan:
    """Greedy by size: largest first, into the slot with no overlapping interval and the smallest time gap
    to a neighbour there, else a new slot."""
    spans: list[list[tuple[int, int]]] = []  # per slot: sorted disjoint (start, end)
    slot_of = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-items[i].size, items[i].start, items[i].entry)):
        item = items[i]
        best, best_gap = -1, 0
        for slot, taken in enumerate(spans):
            gaps = _fits(taken, item)
            if gaps is not None and (best < 0 or min(gaps) < best_gap):
                best, best_gap = slot, min(gaps)
        if best < 0:
            best = len(spans)
            spans.append([])
        bisect.insort(spans[best], (item.start, item.end))
        slot_of[i] = best
    return _normalise(items, slot_of)


def _layers(items: list[_Item]) -> Plan:
    """Slot by slot: the largest unplaced item plus the non-overlapping unplaced items of greatest total size.

    Each slot is an independent set of the interval graph, found exactly by the weighted
    interval-scheduling recurrence on each side of the slot's largest item.
    """
    left = sorted(range(len(items)), key=lambda i: (-items[i].size, items[i].start, items[i].entry))
    slot_of = [0] * len(items)
    slot = 0
    while left:
        big = items[left[0]]
        chosen = [left[0]]
        for side in (
            [i for i in left[1:] if items[i].end < big.start],
            [i for i in left[1:] if items[i].start > big.end],
        ):
            side.sort(key=lambda i: (items[i].end, items[i].start))
            ends = [items[i].end for i in side]
            total = [0] * (len(side) + 1)  # total[k]: best weight among the first k by end
            for k, i in enumerate(side):
                total[k + 1] = max(total[k], total[bisect.bisect_left(ends, items[i].start)] + items[i].size)
            k = len(side)
            while k:
                if total[k] == total[k - 1]:
                    k -= 1
                else:
                    chosen.append(side[k - 1])
                    k = bisect.bisect_left(ends, items[side[k - 1]].start)
        for i in chosen:
            slot_of[i] = slot
        taken = set(chosen)
        left = [i for i in left if i not in taken]
        slot += 1
    return _normalise(items, slot_of)


class _Budget:
    """Work left for the improvement passes of one device, in interval checks."""

    def __init__(self, checks: int) -> None:
        self.left = checks

    def spend(self, checks: int) -> bool:
        """Charge ``checks``; False once the budget is exhausted."""
        self.left -= checks
        return self.left >= 0


def _improve(items: list[_Item], plan: Plan, budget: _Budget) -> Plan:
    """Local search: merge two slots whose intervals are disjoint, or shrink a slot by moving its items
    above some size level into other slots, when the other slots grow by less than it shrinks.

    Stops when no move helps or the budget is spent; every accepted move lowers the cost.
    """
    members: list[list[int]] = [[] for _ in plan[1]]
    for i, slot in enumerate(plan[0]):
        members[slot].append(i)
    spans = [sorted((items[i].start, items[i].end) for i in m) for m in members]
    size = list(plan[1])

    def refresh(slot: int) -> None:
        spans[slot] = sorted((items[i].start, items[i].end) for i in members[slot])
        size[slot] = max((items[i].size for i in members[slot]), default=0)

    changed = True
    while changed and budget.left > 0:
        changed = False
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                if not (members[a] and members[b]):
                    continue
                checked = 0  # interval checks made, charged to the budget
                for i in members[b]:
                    checked += 1
                    if not _fits(spans[a], items[i]):
                        break
                else:
                    checked = -checked  # all fit
                if not budget.spend(abs(checked)):
                    break
                if checked < 0:
                    members[a] += members[b]
                    members[b] = []
                    refresh(a)
                    refresh(b)
                    changed = True
        for a in sorted(range(len(members)), key=lambda slot: -size[slot]):
            if not members[a]:  # an emptied slot: nothing to move (it would "change" on every pass)
                continue
            levels = sorted({items[i].size for i in members[a]}, reverse=True)[1:] + [0]
            for level in levels:
                movers = sorted(
                    (i for i in members[a] if items[i].size > level), key=lambda i: -items[i].size
                )
                others = [b for b in range(len(members)) if b != a and members[b]]
                grown = {b: size[b] for b in others}
                moved: list[tuple[int, int]] = []
                growth = 0
                for i in movers:
                    if not budget.spend(len(others)):
                        break
                    choice = min(
                        ((max(0, items[i].size - grown[b]), b) for b in others if _fits(spans[b], items[i])),
                        default=None,
                    )
                    if choice is None or growth + choice[0] >= size[a] - level:
                        break
                    growth += choice[0]
                    grown[choice[1]] = max(grown[choice[1]], items[i].size)
                    bisect.insort(spans[choice[1]], (items[i].start, items[i].end))
                    moved.append((i, choice[1]))
                for i, b in moved:
                    spans[b].remove((items[i].start, items[i].end))
                if len(moved) == len(movers):
                    for i, b in moved:
                        members[b].append(i)
                        refresh(b)
                    members[a] = [i for i in members[a] if items[i].size <= level]
                    refresh(a)
                    changed = True
                    break
    slot_of = [0] * len(items)
    for slot, m in enumerate(members):
        for i in m:
            slot_of[i] = slot
    return _normalise(items, slot_of)


def _search(items: list[_Item], best: Plan, target: int, budget: _Budget) -> Plan:
    """Depth-first branch and bound: items by size (largest first), each into a fitting slot (the
    closest neighbours first) or a new slot. Only opening a slot costs, since later items are
    smaller; a branch is cut when its cost reaches the best found. Stops at ``target`` (a lower
    bound), when the tree is exhausted (the result is then optimal) or when the budget is spent."""
    order = sorted(range(len(items)), key=lambda i: (-items[i].size, items[i].start, items[i].entry))
    best_cost = _cost(best)
    spans: list[list[tuple[int, int]]] = []
    slot_of = [0] * len(items)
    found: list[int] | None = None
    # Stack of (depth, cost, choices left at this depth); a choice is a slot, len(spans) meaning new.
    stack: list[tuple[int, int, list[int]]] = []

    def choices(depth: int, cost: int) -> list[int]:
        item = items[order[depth]]
        fitting = []
        for slot, taken in enumerate(spans):
            gaps = _fits(taken, item)
            if gaps is not None:
                fitting.append((gaps[0] + gaps[1], slot))
        out = [slot for _, slot in sorted(fitting)]
        if cost + item.size < best_cost:
            out.append(len(spans))
        return out[::-1]  # popped from the end

    if items:
        stack.append((0, 0, choices(0, 0)))
    while stack and best_cost > target and budget.spend(len(spans) + 1):
        depth, cost, left = stack[-1]
        if not left:
            stack.pop()
            if stack:  # undo the choice that led here
                i = order[stack[-1][0]]
                slot = slot_of[i]
                spans[slot].remove((items[i].start, items[i].end))
                if not spans[slot]:
                    spans.pop()
            continue
        slot = left.pop()
        i = order[depth]
        if slot == len(spans):
            spans.append([])
            cost += items[i].size
        if cost >= best_cost:
            if not spans[slot]:
                spans.pop()
            continue
        bisect.insort(spans[slot], (items[i].start, items[i].end))
        slot_of[i] = slot
        if depth + 1 == len(items):
            best_cost, found = cost, list(slot_of)
            spans[slot].remove((items[i].start, items[i].end))
            if not spans[slot]:
                spans.pop()
            continue
        stack.append((depth + 1, cost, choices(depth + 1, cost)))
    return _normalise(items, found) if found is not None else best


def _bounds(items: list[_Item], length: int) -> tuple[int, list[int]]:
    """``(peak bytes live at once, slot bound columns)`` over positions ``0..length``.

    Slot bound: at any time the ``j`` largest live entries sit in ``j`` distinct slots, so the
    ``j``-th largest slot is at least ``column[j]``, the largest ``j``-th largest live size over time;
    ``sum(column)`` bounds every storage-id plan, and is at least the peak.
    """
    peak = 0
    column: list[int] = []
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
    return peak, column


def _plan_device(items: list[_Item], column: list[int], work: int = WORK) -> Plan:
    """The cheapest plan of the portfolio (module docstring); stops once a plan meets the slot bound."""
    bound = sum(column)
    mirrored = _mirrored(items)
    greedy = [
        _best_fit(items),
        _by_size(items),
        _best_fit(items, column),
        _best_fit(mirrored),
        _best_fit(mirrored, column),
    ]
    best = min(greedy, key=_cost)  # the first on ties
    if _cost(best) <= bound:
        return best
    budget = _Budget(work)
    if budget.spend(len(items) * len(best[1])):  # about the cost of _layers
        greedy.append(_layers(items))
    for start in greedy:
        plan = _improve(items, start, budget)
        for _ in range(3):  # refit into slots reserved with the sizes found; keeps any improvement
            plan = min(plan, _improve(items, _best_fit(items, plan[1]), budget), key=_cost)
        best = min(best, plan, key=_cost)
        if _cost(best) <= bound:
            return best
    return _search(items, best, bound, budget)


def _arena_components(items: list[_Item], offsets: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Split an arena into storage ids: items whose byte ranges chain together share one.

    Returns (component per item, offset within it per item, bytes per component). Components
    occupy disjoint byte ranges of the arena, so together they need no more than the arena.
    """
    order = sorted(range(len(items)), key=lambda i: (offsets[i], -items[i].size))
    comp_of, local, sizes = [0] * len(items), [0] * len(items), []
    base, top = 0, -1
    for i in order:
        if offsets[i] >= top:  # no byte in common with anything below: a new storage id
            sizes.append(0)
            base, top = offsets[i], offsets[i]
        comp_of[i], local[i] = len(sizes) - 1, offsets[i] - base
        top = max(top, offsets[i] + aligned(items[i].size))
        sizes[-1] = max(sizes[-1], local[i] + items[i].size)
    return comp_of, local, sizes


def plan_memory(graph: Graph, offsets: bool = True) -> MemoryPlan:
    """Storage ids (and byte offsets within them) for ``graph`` in its node order (module docstring).

    With ``offsets=False`` every entry sits at offset 0 of its storage id: the classic graph format,
    which TVM's own graph executor reads, at the cost of the slot bound instead of the peak.
    """
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

    bounds = [_bounds(dev_items, n) for dev_items in items]
    # Per device, the cheapest assignment found; slot keys are (device, local slot).
    slot_key: dict[int, tuple[int, int]] = {}
    entry_offset = [0] * num_entries
    local_size: dict[tuple[int, int], int] = {}
    planned = [0] * num_devices
    for dev, dev_items in enumerate(items):
        slot_of, sizes = _plan_device(dev_items, bounds[dev][1])
        if offsets and dev_items:
            spans = [(aligned(item.size), item.start, item.end) for item in dev_items]
            base = [0]
            for size in sizes:
                base.append(base[-1] + aligned(size))
            peak = _bounds([_Item(0, s[0], s[1], s[2]) for s in spans], n)[0]
            arena = plan_arena(spans, n, peak, [base[slot] for slot in slot_of])
            parts, local, part_sizes = _arena_components(dev_items, arena)
            if sum(part_sizes) < sum(sizes):  # else alignment ate the gain: keep stage 1 as it is
                slot_of, sizes = parts, part_sizes
                for item, off in zip(dev_items, local):
                    entry_offset[item.entry] = off
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

    plan = MemoryPlan(
        storage_ids=storage_ids,
        storage_device=storage_device,
        storage_bytes=storage_bytes,
        planned_bytes=planned,
        lower_bound_bytes=[peak for peak, _ in bounds],
        slot_bound_bytes=[sum(column) for _, column in bounds],
        unshared_bytes=[sum(item.size for item in dev_items) for dev_items in items],
        input_bytes=input_bytes,
        storage_offsets=entry_offset,
    )
    verify_memory_plan(graph, plan)
    return plan


def planned_json(graph: Graph) -> str:
    """``graph`` as JSON with its memory plan (storage ids and offsets)."""
    plan = plan_memory(graph)
    return graph.to_json(plan.storage_ids, plan.storage_offsets)
