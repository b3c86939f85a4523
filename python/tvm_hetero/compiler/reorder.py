"""Reordering: choose an execution order of the nodes that minimises device switches.

Problem. The kernel nodes form a DAG, each node on one device; a *switch* is a pair of consecutive
kernels on different devices (:meth:`Graph.device_switches`). We want a topological order with the
fewest switches, i.e. the fewest same-device runs. Input/parameter ("null") nodes do not count: each
is placed right before its first consumer (unconsumed ones stay at the front), in id order.

Key lemma (drain). From any partial schedule whose last kernel ran on device ``d``, running every
ready node of ``d`` next -- and, recursively, every node of ``d`` that becomes ready -- is never worse.
Why: take any optimal completion and move a ready ``d`` node ``v`` to its front. The front joins the
current ``d`` run, so nothing is added there; removing ``v`` from its old place cannot add a switch
(``[a, v, b] -> [a, b]``: ``a != b`` implies ``a != v`` or ``v != b``); ``v``'s predecessors are done,
so the order stays topological. Hence only *which device to drain next* is a real decision.

Two devices: after draining ``d`` every ready node is on the other device, so the whole schedule is
forced once the first device is chosen. Greedy drain, tried from both starting devices, keeping the
better, is therefore OPTIMAL for two devices (the beam search below does exactly that when there
are two devices: each state has one child, so no state is ever cut).

Three or more devices: the choice of the next device matters (the problem is NP-hard in general).
We use (a) exact breadth-first search over drained states ``(done set, last device)`` -- optimal by
the lemma -- when the graph has at most ``exact_limit`` kernel nodes, and (b) in all cases a beam
search over drained states: start from the drain of every device, then repeatedly drain each ready
device from each kept state, keeping the ``beam_width`` states with the lowest ``runs so far + lower
bound on the runs still needed`` (lower bound: the most runs any remaining dependency chain needs,
and at least one run per remaining device). Guarantee for (b): a valid order, never worse than the
original order nor than ONNX-Runtime-style Kahn waves (:func:`kahn_wave_order`), both of which are
kept as candidates; cost O(runs * beam_width * devices * (nodes + edges)).

Stability: within a drain, ready nodes of the device run in original id order; beam states that
tie keep the lexicographically smallest order (closest to the original); among candidate orders
with equal switches the earliest of (original, beam, exact, Kahn) wins, so an already optimal
order is returned unchanged (up to null placement). Everything is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from ..graph import Graph


@dataclass
class KernelDag:
    """The kernel-only DAG, kernels numbered 0..m-1 in their original (topological) order."""

    kernels: list[int]  # node id of each kernel
    device: list[int]  # device of each kernel
    preds: list[list[int]]  # kernel predecessors (each once)
    succs: list[list[int]]  # kernel successors (each once)

    @classmethod
    def of(cls, graph: Graph) -> KernelDag:
        graph.validate()
        kernels = [nid for nid, node in enumerate(graph.nodes) if not node.is_input]
        local = {nid: k for k, nid in enumerate(kernels)}
        preds = [
            list(dict.fromkeys(local[e.node] for e in graph.nodes[nid].inputs if e.node in local))
            for nid in kernels
        ]
        succs: list[list[int]] = [[] for _ in kernels]
        for k, ps in enumerate(preds):
            for p in ps:
                succs[p].append(k)
        return cls(kernels, [graph.nodes[nid].device for nid in kernels], preds, succs)

    @property
    def size(self) -> int:
        return len(self.kernels)

    def devices(self) -> list[int]:
        return sorted(set(self.device))


class DrainState:
    """A partial schedule: done kernels, per-device heaps of ready kernels, the order so far."""

    def __init__(self, dag: KernelDag) -> None:
        self.dag = dag
        self.missing = [len(p) for p in dag.preds]  # unfinished predecessors per kernel
        self.done = [False] * dag.size
        self.ready: dict[int, list[int]] = {d: [] for d in dag.devices()}
        for k, n in enumerate(self.missing):
            if n == 0:
                self.ready[dag.device[k]].append(k)  # ascending k: already a heap
        self.order: list[int] = []
        self.last: int | None = None
        self.runs = 0

    def clone(self) -> DrainState:
        other = object.__new__(DrainState)
        other.dag = self.dag
        other.missing = list(self.missing)
        other.done = list(self.done)
        other.ready = {d: list(h) for d, h in self.ready.items()}
        other.order = list(self.order)
        other.last = self.last
        other.runs = self.runs
        return other

    def ready_devices(self) -> list[int]:
        return [d for d, heap in self.ready.items() if heap]

    def finished(self) -> bool:
        return len(self.order) == self.dag.size

    def run(self, k: int) -> None:
        dag = self.dag
        if self.last != dag.device[k]:
            self.runs += 1
            self.last = dag.device[k]
        self.done[k] = True
        self.order.append(k)
        for s in dag.succs[k]:
            self.missing[s] -= 1
            if self.missing[s] == 0:
                heapq.heappush(self.ready[dag.device[s]], s)

    def drain(self, device: int) -> None:
        """Run ready kernels of ``device`` (lowest id first) until none of that device is ready."""
        heap = self.ready[device]
        while heap:
            self.run(heapq.heappop(heap))

    def runs_lower_bound(self) -> int:
        """Runs still needed, assuming no ready kernel is on ``last`` (true right after a drain)."""
        dag = self.dag
        need = [0] * dag.size
        best = 0
        devices = set()
        for k in range(dag.size):  # ids are topological
            if self.done[k]:
                continue
            devices.add(dag.device[k])
            v = 1
            for p in dag.preds[k]:
                if not self.done[p]:
                    v = max(v, need[p] + (dag.device[p] != dag.device[k]))
            need[k] = v
            best = max(best, v)
        return max(best, len(devices))


def _replay(dag: KernelDag, devices: list[int]) -> list[int]:
    """Kernel order given by draining ``devices`` in turn (the drains must finish the graph)."""
    sched = DrainState(dag)
    for d in devices:
        sched.drain(d)
    assert sched.finished()
    return sched.order


def _beam_drain(dag: KernelDag, width: int) -> list[int]:
    """Beam search over drained states; every state of a level has the same number of runs.

    Level 1 holds the drain of every starting device; each next level drains one more device
    from each kept state, merges children with the same (done set, last device), and keeps the
    ``max(width, number of starting devices)`` children with the lowest ``runs + lower bound``
    (then most kernels done, then the lexicographically smallest order, i.e. the one closest to
    the original). The first finished state found is returned.
    """
    if dag.size == 0:
        return []
    level = []
    for d in DrainState(dag).ready_devices():
        sched = DrainState(dag)
        sched.drain(d)
        level.append(sched)
    keep = max(width, len(level))  # with two devices a state has one child: nothing is ever cut
    while True:
        level.sort(key=lambda sched: (sched.runs + sched.runs_lower_bound(), -len(sched.order), sched.order))
        level = level[:keep]
        if level[0].finished():
            return level[0].order
        children: dict[tuple[tuple[bool, ...], int], DrainState] = {}
        for sched in level:
            for d in sched.ready_devices():
                child = sched.clone()
                child.drain(d)
                children.setdefault((tuple(child.done), d), child)
        level = list(children.values())


def _exact_devices(dag: KernelDag) -> list[int]:
    """Fewest-runs drain sequence, by breadth-first search over (done mask, last device)."""
    if dag.size == 0:
        return []
    pred_mask = [sum(1 << p for p in ps) for ps in dag.preds]
    full = (1 << dag.size) - 1

    def drain(mask: int, device: int) -> int:
        grown = True
        while grown:
            grown = False
            for k in range(dag.size):
                if not mask >> k & 1 and dag.device[k] == device and pred_mask[k] & ~mask == 0:
                    mask |= 1 << k
                    grown = True
        return mask

    def ready_devices(mask: int) -> list[int]:
        found = {dag.device[k] for k in range(dag.size) if not mask >> k & 1 and pred_mask[k] & ~mask == 0}
        return sorted(found)

    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {}
    frontier: list[tuple[int, int]] = []
    for d in ready_devices(0):
        state = (drain(0, d), d)
        if state not in parent:
            parent[state] = None
            frontier.append(state)
    while True:
        for state in frontier:
            if state[0] == full:
                seq = []
                cur: tuple[int, int] | None = state
                while cur is not None:
                    seq.append(cur[1])
                    link = parent[cur]
                    cur = link[0] if link else None
                return seq[::-1]
        nxt = []
        for state in frontier:
            mask, last = state
            for d in ready_devices(mask):
                if d == last:
                    continue
                child = (drain(mask, d), d)
                if child not in parent:
                    parent[child] = (state, d)
                    nxt.append(child)
        frontier = nxt


def _kahn_kernel_order(dag: KernelDag) -> list[int]:
    """Kahn waves: all currently ready kernels form a wave, emitted grouped by device."""
    missing = [len(p) for p in dag.preds]
    wave = [k for k in range(dag.size) if missing[k] == 0]
    order: list[int] = []
    last: int | None = None
    while wave:
        # Continue the current device first, then the others by device id; stable within a device.
        wave.sort(key=lambda k: (dag.device[k] != last, dag.device[k], k))
        order.extend(wave)
        last = dag.device[wave[-1]]
        nxt = []
        for k in wave:
            for s in dag.succs[k]:
                missing[s] -= 1
                if missing[s] == 0:
                    nxt.append(s)
        wave = nxt
    return order


def with_inputs(graph: Graph, dag: KernelDag, kernel_order: list[int]) -> list[int]:
    """Full node order: each null node right before its first consumer, unconsumed ones first."""
    local = {nid: k for k, nid in enumerate(dag.kernels)}
    position = {k: i for i, k in enumerate(kernel_order)}
    before: list[list[int]] = [[] for _ in kernel_order]
    front: list[int] = []
    consumers = graph.consumers()
    for nid, node in enumerate(graph.nodes):
        if not node.is_input:
            continue
        users = [position[local[u]] for u in consumers[nid] if u in local]
        (before[min(users)] if users else front).append(nid)
    order = front
    for i, k in enumerate(kernel_order):
        order.extend(before[i])
        order.append(dag.kernels[k])
    return order


def count_switches(dag: KernelDag, kernel_order: list[int]) -> int:
    devs = [dag.device[k] for k in kernel_order]
    return sum(1 for a, b in itertools.pairwise(devs) if a != b)


def kahn_wave_order(graph: Graph) -> list[int]:
    """ONNX-Runtime-style Kahn-wave order (old node ids), the baseline ``reorder_for_devices`` beats.

    Each wave is every kernel whose predecessors ran in earlier waves; a wave runs grouped by
    device (the device that ran last first, then by device id). Null nodes go right before their
    first consumer.
    """
    dag = KernelDag.of(graph)
    return with_inputs(graph, dag, _kahn_kernel_order(dag))


def reorder_for_devices(graph: Graph, exact_limit: int = 10, beam_width: int = 8) -> Graph:
    """The graph in a topological order with few device switches (see the module docstring).

    Optimal for one or two devices, and for any number of devices when the graph has at most
    ``exact_limit`` kernel nodes; otherwise a heuristic (beam search of ``beam_width`` drained
    states) that is never worse than the original order nor than :func:`kahn_wave_order`.
    Input/parameter nodes go right before their first consumer (unconsumed ones first).
    """
    dag = KernelDag.of(graph)
    candidates = [list(range(dag.size)), _beam_drain(dag, beam_width)]
    if len(dag.devices()) > 2 and dag.size <= exact_limit:
        candidates.append(_replay(dag, _exact_devices(dag)))
    candidates.append(_kahn_kernel_order(dag))
    best = min(candidates, key=lambda order: count_switches(dag, order))  # min keeps the first of ties
    return graph.permuted(with_inputs(graph, dag, best))

