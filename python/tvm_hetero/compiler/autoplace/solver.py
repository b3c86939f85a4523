"""Choose a device for every kernel so that one inference finishes first.

Problem. Given a kernel DAG with measured per-device costs (:class:`CostModel`), find a placement
minimising the latency that :func:`~tvm_hetero.compiler.schedule_model.simulate` predicts for the
concurrent runtime (per-device in-order executors, copies between devices that do not share memory,
a call latency per group on devices entered by a call). The problem contains makespan scheduling on
unrelated machines, so it is NP-hard; we solve it heuristically and say exactly what is guaranteed.

Algorithm (:func:`solve`).

1. Starts: every feasible single-device placement, and an earliest-finish-time greedy that walks
   the kernels in graph order and puts each on the device where it would finish first given the
   kernels already placed (HEFT's rule with the runtime's in-order executors; O((n + e) * D)).
2. Local search from each start: repeatedly apply the best improving move among
   - moving one kernel to another device, and
   - moving a window of consecutive kernels (in graph order, up to ``max_window`` long, plus every
     maximal same-device run) to one device -- what relocating a fused chain or a branch needs,
     since a single-kernel move there first pays a copy and only later gains,
   - on graphs of at most ``pair_limit`` kernels, moving two kernels at once (to any two devices):
     escapes the local optima where two branches must swap devices together,
   until no move improves the predicted latency by more than a relative ``1e-9``, or ``max_rounds``.
3. The best result over all starts is returned.

Guarantees. The result is feasible (every kernel on a device allowed to run it) whenever some
placement is; its predicted latency is never worse than the best single-device placement (those
are starts and local search only accepts improvements), nor than the greedy start; it is a local
optimum for the moves above. Cost per round: O(n * (max_window + 1) * D) simulations of O(n + e), plus O(n^2 D^2) of them on
graphs of at most ``pair_limit`` kernels.
Measured against exhaustive search on random DAGs (tests/python/test_autoplace_solver.py): within
5% of the optimum on at least 95% of 200 DAGs of at most 12 kernels.

Objective ``"throughput"``: the smallest bottleneck (the largest time one device spends on an
inference: kernels, copies into it, calls into it), then the lowest latency -- what bounds the rate
of inferences streamed through the devices' executors (a pipeline). The same local search on the
key ``(bottleneck, latency)``, started from the latency optimum and every start above; it is never
worse than those starts on that key.

Objective ``"calls"`` (:func:`solve` with ``objective="calls"``): among placements found within
``calls_slack`` (10%) of the best latency found, the fewest remote calls, then the lowest latency:
the same local search on the key ``(remote_calls, latency)`` restricted to that latency bound,
started from the latency optimum and from every single-device placement inside the bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..schedule_model import CostModel, Schedule, Timeline, simulate

OBJECTIVES = ("latency", "calls", "throughput")


@dataclass
class Solution:
    """A placement and its predicted schedule."""

    placement: list[int]
    schedule: Schedule

    @property
    def latency(self) -> float:
        return self.schedule.makespan


def single_device_placements(model: CostModel) -> list[list[int]]:
    """Every placement that puts all kernels on one device, for the devices able to run them all."""
    n = model.num_kernels
    return [[d] * n for d in range(model.num_devices) if model.feasible([d] * n)]


def earliest_finish_placement(model: CostModel) -> list[int]:
    """Graph order; each kernel on the device where it would finish first (ties: lower device)."""
    timeline = Timeline(model)
    for _ in range(model.num_kernels):
        finishes = [timeline.finish_if(d) for d in range(model.num_devices)]
        best = min(range(model.num_devices), key=lambda d: finishes[d])
        timeline.place(best)
    return timeline.placement


def _windows(placement: Sequence[int], max_window: int) -> list[tuple[int, int]]:
    """Windows [i, j) of consecutive kernels: all up to ``max_window`` long, and every maximal run."""
    n = len(placement)
    windows = {(i, j) for i in range(n) for j in range(i + 2, min(n, i + max_window) + 1)}
    i = 0
    while i < n:
        j = i
        while j < n and placement[j] == placement[i]:
            j += 1
        windows.add((i, j))
        i = j
    return sorted(windows)


def _moves(model: CostModel, current: list[int], max_window: int, pair_limit: int):
    """Every placement one move away: a kernel or a window to one device, or (small graphs) two
    kernels to two devices at once."""
    n, devices = len(current), range(model.num_devices)
    allowed = [[math.isfinite(model.kernel_cost[k][d]) for d in devices] for k in range(n)]
    for i, j in [(k, k + 1) for k in range(n)] + _windows(current, max_window):
        for d in devices:
            if all(current[k] == d for k in range(i, j)) or not all(allowed[k][d] for k in range(i, j)):
                continue
            yield current[:i] + [d] * (j - i) + current[j:]
    if n > pair_limit:
        return
    for a in range(n):
        for b in range(a + 1, n):
            for da in devices:
                for db in devices:
                    if da == current[a] or db == current[b] or not (allowed[a][da] and allowed[b][db]):
                        continue
                    trial = list(current)
                    trial[a], trial[b] = da, db
                    yield trial


def _local_search(model: CostModel, placement: list[int], key, max_window: int, max_rounds: int,
                  pair_limit: int) -> list[int]:
    """Best-improvement descent on ``key(schedule)`` over the moves of :func:`_moves`."""
    current = list(placement)
    current_key = key(simulate(model, current))
    for _ in range(max_rounds):
        best_move, best_key = None, current_key
        for trial in _moves(model, current, max_window, pair_limit):
            trial_key = key(simulate(model, trial))
            if _improves(trial_key, best_key):
                best_move, best_key = trial, trial_key
        if best_move is None:
            break
        current, current_key = best_move, best_key
    return current


def _improves(new, old) -> bool:
    """Lexicographic improvement with a relative tolerance on floats (no cycling on round-off)."""
    for a, b in zip(new, old):
        if isinstance(a, float) or isinstance(b, float):
            if a < b - 1e-9 * max(abs(b), 1e-30):
                return True
            if a > b + 1e-9 * max(abs(b), 1e-30):
                return False
        elif a != b:
            return a < b
    return False


def solve(
    model: CostModel,
    objective: str = "latency",
    *,
    max_window: int = 8,
    max_rounds: int = 200,
    pair_limit: int = 32,
    calls_slack: float = 0.10,
) -> Solution:
    """The placement this module's algorithm finds (see the module docstring)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    if model.num_kernels == 0:
        return Solution([], simulate(model, []))
    starts = single_device_placements(model)
    greedy = earliest_finish_placement(model)
    if model.feasible(greedy):
        starts.append(greedy)
    if not starts:
        raise ValueError("no placement can run every kernel: some kernel has no device allowed to run it")

    def latency_key(schedule: Schedule) -> tuple[float]:
        return (schedule.makespan,)

    results = [_local_search(model, s, latency_key, max_window, max_rounds, pair_limit) for s in starts]
    best = min(results, key=lambda p: simulate(model, p).makespan)
    if objective == "latency":
        return Solution(best, simulate(model, best))
    if objective == "throughput":
        def throughput_key(schedule: Schedule) -> tuple[float, float]:
            return (schedule.bottleneck, schedule.makespan)

        starts = [best, *starts]
        results = [_local_search(model, s, throughput_key, max_window, max_rounds, pair_limit) for s in starts]
        chosen = min(results, key=lambda p: throughput_key(simulate(model, p)))
        return Solution(chosen, simulate(model, chosen))

    bound = simulate(model, best).makespan * (1.0 + calls_slack)

    def calls_key(schedule: Schedule) -> tuple[int, int, float]:
        over = schedule.makespan > bound
        return (int(over), schedule.remote_calls, schedule.makespan)

    call_starts = [best] + [s for s in single_device_placements(model) if simulate(model, s).makespan <= bound]
    results = [_local_search(model, s, calls_key, max_window, max_rounds, pair_limit) for s in call_starts]
    chosen = min(results, key=lambda p: calls_key(simulate(model, p)))
    return Solution(chosen, simulate(model, chosen))

