"""Predicted latency of one inference under the concurrent runtime, from per-kernel costs.

The model is the runtime's own execution rule, stated on a kernel DAG:

- each device runs its kernels one at a time, in the global order (kernels are numbered in the
  order the graph lists them, which is a topological order);
- a kernel starts when its device is free and every input has arrived: an input made on the same
  device, or on a device that shares memory with this one, arrives when its producer finishes; an
  input from a device with separate memory is copied once per destination device, by the
  destination's executor (the runtime puts the copy at the start of the consumer's group), taking
  ``copy_latency[src][dst] + bytes * copy_seconds_per_byte[src][dst]`` of that device's time;
- an input made on another device is published when its producer finishes. A device that gets
  to it later (busy until then) sees it at once; one that waits for it spins for
  ``spin_window[dst]`` seconds, then sleeps: published within the window, it is seen at once,
  later it reaches the device ``sync_latency[src][dst]`` after its producer finished (the
  sleeping executor is woken up; with or without a copy). Between two cores of a machine a
  wake-up costs tens of microseconds, more on a loaded one: measured, like the kernels and the
  window (the runtime's own spin loop, timed);
- kernel times: a placement on one device uses each kernel's time measured with no other device
  computing (``alone_cost``); a placement over several devices, the time measured with the
  devices computing together (``kernel_cost``): they share caches and memory bandwidth, and on a
  machine other processes load, one of them must share its core with that load;
- kernels that a backend joins into one block when they share a device (docs/byoc.md: values
  between them stay in the backend's layouts) save ``edge_saving``: kernel ``k`` costs
  ``edge_saving[k][p][d]`` less on device ``d`` for each predecessor ``p`` placed on ``d`` too
  (never below zero); automatic placement calibrates it from blocks it measured;
- a device entered through a call into another processor (a remote device: an RPC server, a DSP)
  pays ``call_latency[d]`` once per *group*: a run of its kernels entered once. A kernel continues
  its device's current group when every input it takes from another device was finished when the
  group was entered (such inputs travel with the group's call); otherwise it starts a new group.

:func:`simulate` evaluates this rule exactly in O(kernels + edges). It is the objective of automatic
placement (:mod:`tvm_hetero.compiler.autoplace`) and the yardstick for group orders that overlap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

INFEASIBLE = math.inf


@dataclass
class CostModel:
    """Per-kernel and per-transfer costs (seconds) of a kernel DAG over ``num_devices`` devices."""

    #: ``kernel_cost[k][d]``: time of kernel ``k`` on device ``d``; ``math.inf`` where not allowed.
    kernel_cost: list[list[float]]
    #: ``preds[k]``: kernels whose outputs kernel ``k`` reads; each ``< k`` (topological numbering).
    preds: list[list[int]]
    #: ``out_bytes[k]``: bytes of kernel ``k``'s outputs (what a copy of them moves).
    out_bytes: list[int]
    #: ``copy_latency[a][b]``: fixed cost of one copy from device ``a`` to ``b`` (0 when shared).
    copy_latency: list[list[float]] = field(default_factory=list)
    #: ``copy_seconds_per_byte[a][b]``: per-byte cost of a copy from ``a`` to ``b`` (0 when shared).
    copy_seconds_per_byte: list[list[float]] = field(default_factory=list)
    #: ``call_latency[d]``: cost of entering device ``d`` once (0 for a device the host drives).
    call_latency: list[float] = field(default_factory=list)
    #: ``shares_memory[a][b]``: tensors cross without a copy (all CPU devices of one process).
    shares_memory: list[list[bool]] = field(default_factory=list)
    #: ``sync_latency[a][b]``: from a kernel's end on ``a`` until ``b``'s executor waiting for it runs.
    sync_latency: list[list[float]] = field(default_factory=list)
    #: ``alone_cost[k][d]``: time of kernel ``k`` on device ``d`` while no other device computes
    #: (``kernel_cost`` is measured with the devices computing together); empty: the same.
    alone_cost: list[list[float]] = field(default_factory=list)
    #: ``edge_saving[k]``: ``{p: seconds saved per device}`` for predecessors ``p`` whose sharing a
    #: device with ``k`` joins them into one block; empty: nothing saved.
    edge_saving: list[dict[int, list[float]]] = field(default_factory=list)
    #: ``spin_window[d]``: how long device ``d``'s executor spins in a wait before it sleeps
    #: (an input published within it costs no wake-up); empty: zero (every wait sleeps).
    spin_window: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n, d = len(self.kernel_cost), self.num_devices
        if len(self.preds) != n or len(self.out_bytes) != n:
            raise ValueError(f"cost model: {n} kernels but {len(self.preds)} pred lists, {len(self.out_bytes)} sizes")
        for k, ps in enumerate(self.preds):
            if any(not 0 <= p < k for p in ps):
                raise ValueError(f"cost model: kernel {k} has a predecessor outside [0, {k})")
            if len(self.kernel_cost[k]) != d:
                raise ValueError(f"cost model: kernel {k} has {len(self.kernel_cost[k])} costs, expected {d}")
        zeros = [[0.0] * d for _ in range(d)]
        self.copy_latency = self.copy_latency or [row[:] for row in zeros]
        self.copy_seconds_per_byte = self.copy_seconds_per_byte or [row[:] for row in zeros]
        self.call_latency = self.call_latency or [0.0] * d
        self.shares_memory = self.shares_memory or [[a == b for b in range(d)] for a in range(d)]
        self.sync_latency = self.sync_latency or [row[:] for row in zeros]
        self.alone_cost = self.alone_cost or self.kernel_cost
        self.edge_saving = self.edge_saving or [{} for _ in range(n)]
        self.spin_window = self.spin_window or [0.0] * d
        if len(self.edge_saving) != n or any(p not in self.preds[k] for k, s in enumerate(self.edge_saving) for p in s):
            raise ValueError("cost model: an edge saving names no edge of the graph")
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for k, ps in enumerate(self.preds):
            for p in ps:
                self.succs[p].append(k)

    @property
    def num_devices(self) -> int:
        return len(self.kernel_cost[0]) if self.kernel_cost else 0

    @property
    def num_kernels(self) -> int:
        return len(self.kernel_cost)

    def transfer(self, producer: int, src: int, dst: int) -> float:
        """Time for kernel ``producer``'s output to reach device ``dst`` from ``src``."""
        if src == dst or self.shares_memory[src][dst]:
            return 0.0
        return self.copy_latency[src][dst] + self.out_bytes[producer] * self.copy_seconds_per_byte[src][dst]

    def feasible(self, placement: Sequence[int]) -> bool:
        return all(math.isfinite(self.kernel_cost[k][d]) for k, d in enumerate(placement))


@dataclass
class Schedule:
    """The outcome of :func:`simulate`."""

    #: Finish time of the last kernel (the predicted latency); ``math.inf`` if infeasible.
    makespan: float
    start: list[float]
    finish: list[float]
    #: Number of groups entered on devices with a call latency (remote calls per inference).
    remote_calls: int
    #: Number of cross-device edges that need a copy.
    copies: int
    #: Time each device spends on one inference (kernels, copies into it, calls into it). With
    #: inferences streamed through per-device executors (a pipeline), the largest bounds the
    #: throughput: one inference per ``bottleneck`` seconds at best.
    device_busy: list[float] = field(default_factory=list)

    @property
    def bottleneck(self) -> float:
        return max(self.device_busy, default=0.0)


class Timeline:
    """The runtime's rule applied kernel by kernel, in graph order (kernel ``k`` after ``0..k-1``),
    with the kernel times ``costs`` (default: the model's, measured with the devices together)."""

    def __init__(self, model: CostModel, costs: list[list[float]] | None = None):
        self.model = model
        self.costs = costs if costs is not None else model.kernel_cost
        self.placement: list[int] = []
        self.start: list[float] = []
        self.finish: list[float] = []
        self.device_free = [0.0] * model.num_devices
        self.device_used = [False] * model.num_devices
        self.group_entered = [0.0] * model.num_devices  # when the device's current group was entered
        self.copied: dict[tuple[int, int], float] = {}  # (producer, device) -> when its copy landed
        self.remote_calls = 0
        self.busy = [0.0] * model.num_devices  # kernels, copies and calls per device

    def _timing(self, d: int) -> tuple[float, float, list[tuple[int, float]], float, bool]:
        """(start, finish, new copies, group entry time, whether a call enters the device) of the
        next kernel on device ``d``, without placing it."""
        model, k = self.model, len(self.placement)
        busy_until = self.device_free[d]  # copies into d run on d's executor, in predecessor order
        inputs_ready = 0.0
        waits_elsewhere = False  # an input from another device that the current group did not have
        new_copies: list[tuple[int, float]] = []
        waits_from = self.device_free[d]  # when the device gets to this kernel and starts waiting
        for p in model.preds[k]:
            src = self.placement[p]
            waits_elsewhere |= src != d and self.finish[p] > self.group_entered[d]
            delay = model.transfer(p, src, d)
            arrives = self.finish[p]
            if src != d and self.finish[p] - waits_from > model.spin_window[d]:  # the waiter slept: woken
                arrives += model.sync_latency[src][d]
            if delay == 0.0:
                inputs_ready = max(inputs_ready, arrives)
                continue
            landed = self.copied.get((p, d))
            if landed is None:
                landed = next((t for q, t in new_copies if q == p), None)
            if landed is None:
                busy_until = max(busy_until, arrives) + delay
                landed = busy_until
                new_copies.append((p, landed))
            inputs_ready = max(inputs_ready, landed)
        ready = max(busy_until, inputs_ready)
        new_group = not self.device_used[d] or waits_elsewhere
        entered = ready if new_group else self.group_entered[d]
        called = new_group and model.call_latency[d] > 0.0
        if called:
            ready += model.call_latency[d]
        return ready, ready + self._cost(k, d), new_copies, entered, called

    def _cost(self, k: int, d: int) -> float:
        """Kernel ``k``'s time on ``d``, less what sharing ``d`` with its predecessors saves."""
        seconds = self.costs[k][d]
        savings = self.model.edge_saving[k]
        if savings:
            seconds = max(0.0, seconds - sum(saved[d] for p, saved in savings.items() if self.placement[p] == d))
        return seconds

    def finish_if(self, d: int) -> float:
        """When the next kernel would finish on device ``d``."""
        if not math.isfinite(self.costs[len(self.placement)][d]):
            return INFEASIBLE
        return self._timing(d)[1]

    def place(self, d: int) -> None:
        """Run the next kernel on device ``d``."""
        start, finish, new_copies, self.group_entered[d], called = self._timing(d)
        self.remote_calls += called
        k = len(self.placement)
        self.busy[d] += self._cost(k, d) + (self.model.call_latency[d] if called else 0.0)
        for p, landed in new_copies:
            self.copied[(p, d)] = landed
            self.busy[d] += self.model.transfer(p, self.placement[p], d)
        self.placement.append(d)
        self.start.append(start)
        self.finish.append(finish)
        self.device_free[d] = finish
        self.device_used[d] = True


def simulate(model: CostModel, placement: Sequence[int]) -> Schedule:
    """Predicted schedule of one inference with kernel ``k`` on device ``placement[k]``."""
    n = model.num_kernels
    if len(placement) != n:
        raise ValueError(f"placement has {len(placement)} devices for {n} kernels")
    one_device = len(set(placement)) == 1
    timeline = Timeline(model, model.alone_cost if one_device else None)
    for k, d in enumerate(placement):
        if not math.isfinite(model.kernel_cost[k][d]):
            return Schedule(INFEASIBLE, [], [], 0, 0, [INFEASIBLE])
        timeline.place(d)
    return Schedule(max(timeline.finish, default=0.0), timeline.start, timeline.finish, timeline.remote_calls,
                    len(timeline.copied), timeline.busy)


def predicted_latency(model: CostModel, placement: Sequence[int]) -> float:
    return simulate(model, placement).makespan
