"""``tvm-hetero demo``: it measures afresh (an earlier run's cost cache cannot decide its placement),
says which devices work together or why one was kept, and compares with one device fairly."""

from __future__ import annotations

import pytest
from tvm_hetero import cli
from tvm_hetero.compiler.autoplace.explanation import AutoplaceReport, DeviceShare, OneDeviceCheck


class Stop(Exception):
    """Raised by the fake build once it has seen its arguments."""


def test_the_demo_ignores_an_earlier_runs_cost_cache(monkeypatch, tmp_path):
    import tvm_hetero

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # where a stale cache would be found
    seen = {}

    def fake_build(mod, targets, placement=None, **kwargs):
        seen.update(kwargs, placement=placement)
        raise Stop

    monkeypatch.setattr(tvm_hetero, "build", fake_build)
    with pytest.raises(Stop):
        cli.main(["demo", "--model", "squeezenet", "--debug"])
    assert seen["placement"] == "auto" and seen["cost_cache"] is False
    with pytest.raises(Stop):  # asked for, a cache file is used
        cli.main(["demo", "--model", "squeezenet", "--cost-cache", str(tmp_path / "c.sqlite"), "--debug"])
    assert seen["cost_cache"] == str(tmp_path / "c.sqlite")


class Report:
    def __init__(self, autoplace):
        self.autoplace = autoplace


class Art:
    def __init__(self, autoplace):
        self.build_report = Report(autoplace)


def report(*ops, **fields) -> AutoplaceReport:
    """An automatic placement's report with ``ops`` relax ops per device."""
    shares = [DeviceShare(f"cpu:{d}", 1 if n else 0, n, 0.0, 0.0) for d, n in enumerate(ops)]
    return AutoplaceReport("latency", 0.01, 0.01, 0, shares, [], [], 1, 0, **fields)


def test_the_demo_says_which_devices_work_together_or_why_one_was_kept():
    split = cli._placement_verdict(Art(report(40, 60)))
    assert split == "choice: cpu:0 + cpu:1 working together (ops and backends per device above)"
    checked = cli._placement_verdict(Art(report(40, 60, one_device_check=OneDeviceCheck(
        device="cpu:1", measured_seconds=0.010, split_measured_seconds=0.012, kept_one_device=True))))
    assert "everything on cpu:1" in checked and "split measured 12.0 ms, slower than cpu:1 alone (10.0 ms)" in checked
    predicted = cli._placement_verdict(Art(report(0, 100, split_predicted_seconds=0.0115, min_gain=0.05)))
    assert predicted.startswith("choice: everything on cpu:1 -- the best split found was predicted 11.5 ms")


class Clocked:
    """A runtime that records when it ran."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def run(self):
        self.log.append(self.name)

    def close(self):
        self.log.append(f"close {self.name}")


def test_the_demo_times_ours_and_each_single_device_in_turns():
    log: list[str] = []
    singles = {"cpu:0 alone": Clocked("a", log), "cpu:1 alone": Clocked("b", log)}
    ours, alone = cli._interleaved_latencies(Clocked("ours", log), singles, 3)
    assert log == ["ours", "a", "b"] * 3 + ["close a", "close b"]
    assert len(ours) == 3 and set(alone) == set(singles)
