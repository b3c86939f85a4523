"""Test oracles: exact answers by exhaustive search, to check the compiler's fast algorithms.

Exponential; for small graphs only (about 15 kernels for ``optimal_switches``, D^n placements
for ``exhaustive_placement``).
"""

from __future__ import annotations

import itertools
import math
from functools import cache

from ..compiler.autoplace.solver import Solution
from ..compiler.reorder import KernelDag
from ..compiler.schedule_model import CostModel, simulate
from ..graph import Graph


def optimal_switches(graph: Graph) -> int:
    """Fewest device switches over ALL topological orders, by exhaustive search.

    Tries every ready kernel at every step (no drain lemma), memoised on (done set, last device):
    exponential, for graphs of up to about 15 kernel nodes.
    """
    dag = KernelDag.of(graph)
    pred_mask = [sum(1 << p for p in ps) for ps in dag.preds]
    full = (1 << dag.size) - 1

    @cache
    def best(mask: int, last: int | None) -> int:
        if mask == full:
            return 0
        return min(
            best(mask | 1 << k, dag.device[k]) + (last is not None and last != dag.device[k])
            for k in range(dag.size)
            if not mask >> k & 1 and pred_mask[k] & ~mask == 0
        )

    return best(0, None)


def exhaustive_placement(model: CostModel, objective: str = "latency", calls_slack: float = 0.10) -> Solution:
    """The exact optimum by enumerating every placement (D^n of them): a test oracle for small DAGs."""
    schedules = []
    for placement in itertools.product(range(model.num_devices), repeat=model.num_kernels):
        schedule = simulate(model, placement)
        if math.isfinite(schedule.makespan):
            schedules.append((list(placement), schedule))
    if not schedules:
        raise ValueError("no placement can run every kernel")
    best = min(schedules, key=lambda ps: ps[1].makespan)
    if objective == "latency":
        return Solution(*best)
    if objective == "throughput":
        return Solution(*min(schedules, key=lambda ps: (ps[1].bottleneck, ps[1].makespan)))
    bound = best[1].makespan * (1.0 + calls_slack)
    inside = [ps for ps in schedules if ps[1].makespan <= bound]
    return Solution(*min(inside, key=lambda ps: (ps[1].remote_calls, ps[1].makespan)))
