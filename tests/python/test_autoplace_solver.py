"""Automatic placement's solver against exhaustive search, and the latency model it optimises."""

from __future__ import annotations

import math
import random

import pytest
from tvm_hetero.compiler.autoplace.solver import single_device_placements, solve
from tvm_hetero.compiler.schedule_model import CostModel, simulate
from tvm_hetero.testing.oracles import exhaustive_placement


def random_model(rng: random.Random, num_kernels: int, num_devices: int, remote: bool = False) -> CostModel:
    """A random DAG (each kernel reads 0-3 earlier ones) with random costs; some kernels pinned."""
    preds = [sorted(rng.sample(range(k), rng.randint(0, min(3, k)))) if k else [] for k in range(num_kernels)]
    cost = []
    for _ in range(num_kernels):
        base = rng.uniform(0.1, 10.0)
        row = [base * rng.uniform(0.2, 3.0) for _ in range(num_devices)]
        if num_devices > 1 and rng.random() < 0.15:  # an op only the primary can run
            row[rng.randrange(1, num_devices)] = math.inf
        cost.append(row)
    d = num_devices
    shares = [[a == b or (not remote and rng.random() < 0.5) for b in range(d)] for a in range(d)]
    return CostModel(
        kernel_cost=cost,
        preds=preds,
        out_bytes=[rng.randint(1, 1 << 20) for _ in range(num_kernels)],
        copy_latency=[[0.0 if a == b else rng.uniform(0.0, 2.0) for b in range(d)] for a in range(d)],
        copy_seconds_per_byte=[[0.0 if a == b else rng.uniform(0.0, 2e-6) for b in range(d)] for a in range(d)],
        call_latency=[0.0] + [rng.uniform(0.0, 3.0) if remote else 0.0 for _ in range(d - 1)],
        shares_memory=shares,
    )


def test_simulate_runs_independent_branches_at_the_same_time():
    # Two independent kernels of 5 s joined by a 1 s kernel: 6 s on two devices, 11 s on one.
    model = CostModel(kernel_cost=[[5.0, 5.0], [5.0, 5.0], [1.0, 1.0]], preds=[[], [], [0, 1]], out_bytes=[8, 8, 8])
    assert simulate(model, [0, 1, 0]).makespan == pytest.approx(6.0)
    assert simulate(model, [0, 0, 0]).makespan == pytest.approx(11.0)


def test_simulate_charges_copies_once_per_destination_and_calls_per_group():
    model = CostModel(
        kernel_cost=[[1.0, 1.0]] * 3,
        preds=[[], [0], [0]],
        out_bytes=[100, 100, 100],
        copy_latency=[[0.0, 2.0], [2.0, 0.0]],
        copy_seconds_per_byte=[[0.0, 0.01], [0.01, 0.0]],
        call_latency=[0.0, 0.5],
        shares_memory=[[True, False], [False, True]],
    )
    schedule = simulate(model, [0, 1, 1])
    assert schedule.copies == 1  # kernel 0's output crosses once for both consumers on device 1
    # kernel 1: output of 0 at 1.0, copy 2 + 100 * 0.01 = 3 -> 4.0, call 0.5 -> starts 4.5.
    assert schedule.start[1] == pytest.approx(4.5)
    assert schedule.remote_calls == 1  # kernel 2 continues the same group
    assert schedule.makespan == pytest.approx(6.5)


def test_simulate_rejects_a_forbidden_device():
    model = CostModel(kernel_cost=[[1.0, math.inf]], preds=[[]], out_bytes=[4])
    assert math.isinf(simulate(model, [1]).makespan)
    assert solve(model).placement == [0]


def test_cost_model_rejects_a_predecessor_after_its_consumer():
    with pytest.raises(ValueError, match="kernel 0 has a predecessor"):
        CostModel(kernel_cost=[[1.0], [1.0]], preds=[[1], []], out_bytes=[4, 4])


@pytest.mark.parametrize("remote", [False, True], ids=["shared-or-copy", "remote-calls"])
def test_solver_is_near_optimal_on_random_dags(remote):
    """>= 95% of 200 random DAGs (<= 12 kernels) within 5% of the exhaustive optimum; never worse than
    the best single-device placement."""
    rng = random.Random(20261122 + remote)
    within, total = 0, 200
    for case in range(total):
        num_devices = 2 if case % 4 else 3
        num_kernels = rng.randint(2, 12 if num_devices == 2 else 8)
        model = random_model(rng, num_kernels, num_devices, remote=remote)
        found = solve(model)
        best = exhaustive_placement(model)
        singles = [simulate(model, p).makespan for p in single_device_placements(model)]
        assert model.feasible(found.placement)
        assert found.latency >= best.latency * (1 - 1e-9), "the solver cannot beat the exact optimum"
        if singles:
            assert found.latency <= min(singles) * (1 + 1e-9), f"case {case}: worse than one device"
        within += found.latency <= best.latency * 1.05
    assert within >= 0.95 * total, f"only {within}/{total} within 5% of the optimum"


def test_calls_objective_trades_latency_for_fewer_remote_calls():
    rng = random.Random(7)
    exact_hits = 0
    for case in range(60):
        model = random_model(rng, rng.randint(3, 10), 2, remote=True)
        fast = solve(model, "latency")
        few = solve(model, "calls")
        assert few.latency <= fast.latency * 1.10 * (1 + 1e-9)
        assert few.schedule.remote_calls <= fast.schedule.remote_calls
        exact = exhaustive_placement(model, "calls")
        exact_hits += few.schedule.remote_calls <= exact.schedule.remote_calls
    assert exact_hits >= 0.9 * 60


def test_simulate_counts_each_device_s_busy_time_for_the_bottleneck():
    # a chain of four 1 s kernels: 2 + 2 on two devices halves the bottleneck, not the latency
    model = CostModel(kernel_cost=[[1.0, 1.0]] * 4, preds=[[], [0], [1], [2]], out_bytes=[4] * 4)
    assert simulate(model, [0, 0, 0, 0]).bottleneck == pytest.approx(4.0)
    split = simulate(model, [0, 0, 1, 1])
    assert split.bottleneck == pytest.approx(2.0) and split.makespan == pytest.approx(4.0)
    assert solve(model, "throughput").schedule.bottleneck == pytest.approx(2.0)
    assert solve(model, "latency").latency == pytest.approx(4.0)


def test_throughput_objective_is_near_the_exact_bottleneck_on_random_dags():
    """>= 90% of 150 random DAGs within 5% of the exhaustive smallest bottleneck; never a larger
    bottleneck than the latency optimum or the best single device."""
    rng = random.Random(4242)
    within, total = 0, 150
    for case in range(total):
        model = random_model(rng, rng.randint(2, 10), 2 if case % 3 else 3)
        found = solve(model, "throughput").schedule
        exact = exhaustive_placement(model, "throughput").schedule
        assert found.bottleneck >= exact.bottleneck * (1 - 1e-9)
        assert found.bottleneck <= solve(model, "latency").schedule.bottleneck * (1 + 1e-9)
        for p in single_device_placements(model):
            assert found.bottleneck <= simulate(model, p).bottleneck * (1 + 1e-9), f"case {case}"
        within += found.bottleneck <= exact.bottleneck * 1.05
    assert within >= 0.9 * total, f"only {within}/{total} within 5% of the smallest bottleneck"


def test_unknown_objective_is_named():
    model = CostModel(kernel_cost=[[1.0]], preds=[[]], out_bytes=[4])
    with pytest.raises(ValueError, match="objective 'speed'"):
        solve(model, "speed")


def test_one_device_uses_times_measured_alone_and_a_split_the_times_measured_together():
    # two independent 1 s kernels joined by a 1 s kernel; on a loaded machine each runs in 0.6 s
    # alone but 1 s while the other device computes too: the split (2 s) loses to one device (1.8 s)
    together = [[1.0, 1.0]] * 3
    alone = [[0.6, 0.6]] * 3
    model = CostModel(kernel_cost=together, preds=[[], [], [0, 1]], out_bytes=[8] * 3, alone_cost=alone)
    assert simulate(model, [0, 0, 0]).makespan == pytest.approx(1.8)
    assert simulate(model, [0, 1, 0]).makespan == pytest.approx(2.0)
    assert solve(model).placement in ([0, 0, 0], [1, 1, 1])
    quiet = CostModel(kernel_cost=together, preds=[[], [], [0, 1]], out_bytes=[8] * 3)
    assert len(set(solve(quiet).placement)) == 2  # without the difference the split wins


def test_the_hand_off_latency_delays_a_consumer_on_another_device():
    model = CostModel(kernel_cost=[[1.0, 1.0], [1.0, 1.0]], preds=[[], [0]], out_bytes=[8, 8],
                      sync_latency=[[0.0, 0.25], [0.25, 0.0]])
    assert simulate(model, [0, 1]).start[1] == pytest.approx(1.25)
    assert simulate(model, [0, 0]).start[1] == pytest.approx(1.0)


def test_a_wait_within_the_spin_window_costs_no_wake_up():
    # kernel 1 on device 1 waits for kernel 0 (1 s on device 0) from time 0: a wait of 1 s
    sync = [[0.0, 0.25], [0.25, 0.0]]
    sleeps = CostModel(kernel_cost=[[1.0, 1.0], [1.0, 1.0]], preds=[[], [0]], out_bytes=[8, 8], sync_latency=sync,
                       spin_window=[0.0, 0.5])
    assert simulate(sleeps, [0, 1]).start[1] == pytest.approx(1.25)  # waited 1 s > 0.5 s: slept, woken
    spins = CostModel(kernel_cost=[[1.0, 1.0], [1.0, 1.0]], preds=[[], [0]], out_bytes=[8, 8], sync_latency=sync,
                      spin_window=[0.0, 1.5])
    assert simulate(spins, [0, 1]).start[1] == pytest.approx(1.0)  # still spinning: seen at once


def test_an_input_published_before_the_device_gets_to_it_costs_nothing():
    # device 1 runs kernel 1 (2 s) first; kernel 0 (1 s, device 0) finished long before kernel 2 reads it
    model = CostModel(kernel_cost=[[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]], preds=[[], [], [0, 1]], out_bytes=[8] * 3,
                      sync_latency=[[0.0, 0.25], [0.25, 0.0]])
    assert simulate(model, [0, 1, 1]).start[2] == pytest.approx(2.0)
