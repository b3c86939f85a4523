"""Measuring for automatic placement: a time enters the cost cache only when its re-measurement
agrees with it (placement_measurer.py); outliers are measured again."""

from __future__ import annotations

import json
from collections.abc import Callable

import tvm
import tvm_hetero
from test_autoplace import MLP, PARAMS, TWO_CPUS, FakeMeasurer
from tvm_hetero import placement_measurer as autoplace_measure
from tvm_hetero.compiler.autoplace.cost_cache import CostCache
from tvm_hetero.compiler.autoplace.kernel_times import KernelCall, MeasureJob
from tvm_hetero.placement_measurer import RuntimeMeasurer

MS = 1e-3


class ScriptedRuns:
    """Stands in for the measuring runtimes: each traced run reports, for every node, its call's
    script ``(job, call) -> sample number -> seconds`` at the call's next sample (warm-ups count)."""

    def __init__(self, scripts: dict[tuple[int, int], Callable[[int], float]]):
        self.scripts = scripts
        self.samples: dict[tuple[int, int], int] = {}

    def next_time(self, job: int, call: int) -> float:
        n = self.samples.get((job, call), 0)
        self.samples[(job, call)] = n + 1
        return self.scripts[(job, call)](n)

    def prepare(self, _jobs, _lib, picked, _repeats):
        where, kernel_ids = {}, []
        for j, indices in enumerate(picked):
            kernel_ids.append([])
            for i in indices:
                where[len(where)] = (j, i)
                kernel_ids[-1].append(len(where) - 1)

        def trace(_runs):
            spans = [{"node": nid, "kind": "kernel", "device": j, "start_us": 0.0,
                      "end_us": self.next_time(j, i) * 1e6} for nid, (j, i) in where.items()]
            return json.dumps({"runs": [spans]})

        return trace, kernel_ids


def one_job(num_calls: int) -> list[MeasureJob]:
    calls = [KernelCall(f"k{i}", [], []) for i in range(num_calls)]
    return [MeasureJob(0, tvm.IRModule(), calls, tvm.cpu(0), tvm.target.Target("llvm"), None)]


def scripted(monkeypatch, scripts) -> ScriptedRuns:
    runs = ScriptedRuns(scripts)
    monkeypatch.setattr(autoplace_measure, "compile_jobs", lambda _jobs: None)
    monkeypatch.setattr(RuntimeMeasurer, "_prepare", lambda _self, *args: runs.prepare(*args))
    return runs


def test_a_long_first_sample_its_second_sample_disagrees_with_is_measured_again(monkeypatch):
    # Call 0 ran 0.1 ms but its first timed sample was stretched to 50 ms (a descheduled thread);
    # call 1 is a genuinely long kernel (an untuned convolution) and keeps its single-pass time.
    scripted(monkeypatch, {(0, 0): lambda n: 50 * MS if n == 1 else 0.1 * MS, (0, 1): lambda _n: 40 * MS})
    measurer = RuntimeMeasurer()
    jobs = one_job(2)
    fast, slow = measurer.kernel_seconds(jobs)[0]
    assert abs(fast - 0.1 * MS) < 1e-9
    assert slow == 40 * MS
    assert measurer.unconfirmed(jobs[0]) == set()


def test_a_time_whose_halves_never_agree_is_used_unconfirmed_at_its_lowest(monkeypatch):
    # Every round of timed runs drifts: its first half at 1 ms, its second at 3 ms (samples 0-2 are
    # the first pass's warm-up and sample and the timed runs' warm-up).
    def drifting(n: int) -> float:
        return 0.5 * MS if n < 3 else (1 * MS if ((n - 3) // 2) % 2 == 0 else 3 * MS)

    scripted(monkeypatch, {(0, 0): drifting, (0, 1): lambda _n: 0.2 * MS})
    measurer = RuntimeMeasurer()
    jobs = one_job(2)
    drifting_time, steady_time = measurer.kernel_seconds(jobs)[0]
    assert measurer.unconfirmed(jobs[0]) == {0}
    assert drifting_time <= 2 * MS  # the lowest median seen, never the inflated one
    assert abs(steady_time - 0.2 * MS) < 1e-9


class DoubtfulFake(FakeMeasurer):
    """Fake costs, every device's first call reported as never confirmed."""

    def unconfirmed(self, job):
        return {0}


def test_unconfirmed_times_are_used_but_never_cached(tmp_path):
    cache_file = tmp_path / "c.sqlite"
    first = DoubtfulFake(lambda _name, d: 1e-3 * (1 + d))
    tvm_hetero.build(MLP, TWO_CPUS, placement="auto", params=PARAMS, cost_cache=cache_file, measurer=first)
    asked = len(first.asked)
    cache = CostCache(cache_file)
    rows = cache._db.execute("SELECT COUNT(*) FROM costs WHERE kind='kernel'").fetchone()[0]
    cache.close()
    assert 0 < rows < asked  # the doubtful times were left out
    again = FakeMeasurer(lambda _name, d: 1e-3 * (1 + d))
    tvm_hetero.build(MLP, TWO_CPUS, placement="auto", params=PARAMS, cost_cache=cache_file, measurer=again)
    assert 0 < len(again.asked) < asked  # a rebuild measures exactly what was not confirmed


def test_targets_auto_measures_the_built_graph_with_the_settings_its_kernels_were_timed_with(monkeypatch):
    from tvm_hetero.compiler.build import runs_tvm_kernels

    measured_with = []

    def fake_latency(artifact, device_options=None, runs=10):
        measured_with.append(device_options)
        return 1e-3

    monkeypatch.setattr(autoplace_measure, "measure_latency", fake_latency)
    art = tvm_hetero.build(MLP, targets="auto", placement="auto", params=PARAMS, cost_cache=False,
                           backends=())
    discovered = [d.options for d in tvm_hetero.devices() if runs_tvm_kernels(d.device)]
    assert art.build_report.autoplace.measured_seconds == 1e-3
    assert measured_with and measured_with[0] == discovered  # not None: the caller gave no options
    assert art.build_report.autoplace.device_options == discovered  # what to run the artifact with


def test_a_built_graph_measured_with_other_discovered_settings_is_measured_again(tmp_path, monkeypatch):
    from test_autoplace import LatencyFake
    from tvm_hetero.compiler import build as build_module
    from tvm_hetero.devices import DeviceInfo

    def discovered(threads):
        return lambda: [DeviceInfo(tvm.cpu(0), "llvm", {"cores": [0], "num_threads": threads}, "cpu")]

    measurer = LatencyFake(1e-3, 1e-3)
    for threads, measured_before in ((1, 0), (2, 1)):  # the machine's discovered settings change
        monkeypatch.setattr(build_module, "discover_devices", discovered(threads))
        art = tvm_hetero.build(MLP, targets="auto", placement="auto", params=PARAMS, backends=(),
                               cost_cache=tmp_path / "c.sqlite", measurer=measurer)
        assert measurer.latencies_measured == measured_before + 1
        assert not art.build_report.autoplace.measured_cached


def test_a_measurement_far_from_its_prediction_is_pointed_out_in_the_report():
    from tvm_hetero.compiler.autoplace.explanation import AutoplaceReport
    from tvm_hetero.compiler.autoplace.report import explain

    def report(measured: float) -> AutoplaceReport:
        return AutoplaceReport("latency", 3.8e-3, 3.8e-3, 0, [], [], [], 1, 0, measured_seconds=measured, min_gain=0.05)

    far = explain(report(117.7e-3))
    near = explain(report(4.5e-3))
    assert any("measured far from predicted" in line and "OMP_WAIT_POLICY=PASSIVE" in line for line in far)
    assert not any("far from predicted" in line for line in near)
