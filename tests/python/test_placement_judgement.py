"""One way to judge a placement (tvm_hetero.placement_judgement): the rule, its labels and its tie,
and both automatic placements (CPU clusters, an offload device) deciding through it."""

from __future__ import annotations

import pytest
import tvm
import tvm_hetero
from tvm_hetero import build_driver, placement_judgement
from tvm_hetero.compiler.autoplace import as_built
from tvm_hetero.ep_offload import auto_placement
from tvm_hetero.ep_offload.offload_report import OffloadRegion, OffloadReport
from tvm_hetero.placement_judgement import MEASURED, MEASURED_ON_A_DEVICE, MODELED, Cost, Verdict, judge
from tvm_hetero.testing import models

TWO_CPUS = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]


def test_the_candidate_is_kept_only_where_it_is_faster() -> None:
    device = Cost(1e-3, MODELED, "2.0 M cycles")
    faster_host = judge(device, Cost(0.5e-3, MEASURED), candidate_name="the NPU", baseline_name="the host")
    assert not faster_host.kept
    assert faster_host.explain() == ("the NPU 1.000 ms (modeled: 2.0 M cycles) against the host 0.500 ms (measured): "
                                     "the NPU not faster: the host kept")
    faster_device = judge(device, Cost(2e-3, MEASURED))
    assert faster_device.kept and faster_device.explain().endswith("the candidate faster: the candidate kept")


def test_a_tie_goes_to_the_baseline_and_min_gain_is_a_margin() -> None:
    assert not judge(Cost(1e-3, MEASURED), Cost(1e-3, MEASURED)).kept
    assert not judge(Cost(0.96e-3, MODELED), Cost(1e-3, MODELED), min_gain=0.05).kept  # 4% faster: not enough
    assert judge(Cost(0.94e-3, MODELED), Cost(1e-3, MODELED), min_gain=0.05).kept
    assert "by more than 5%" in judge(Cost(0.94e-3, MODELED), Cost(1e-3, MODELED), min_gain=0.05).explain()


def test_a_cost_names_its_source_from_one_vocabulary() -> None:
    assert set(placement_judgement.SOURCES) == {MEASURED, MEASURED_ON_A_DEVICE, MODELED}
    with pytest.raises(ValueError, match="labelled 'emulated'"):
        Cost(1e-3, "emulated")
    with pytest.raises(ValueError, match="finite number of seconds"):
        Cost(float("nan"), MEASURED)
    with pytest.raises(ValueError, match="min_gain"):
        judge(Cost(1e-3, MEASURED), Cost(1e-3, MEASURED), min_gain=1.0)
    verdict = judge(Cost(1e-3, MEASURED_ON_A_DEVICE, "table.json"), Cost(2e-3, MEASURED))
    assert Verdict.from_dict(verdict.to_dict()) == verdict


class _Check:
    cycles = 4e6


class _Artifact:
    offload_references = {"g0": b"group zero", "g1": b"group one"}


def _offload_decision(monkeypatch, host_seconds: dict[bytes, float]) -> list[auto_placement.GroupChoice]:
    """The offload device's automatic placement on two groups whose device cost is 1 ms (modeled),
    against the host times given; the judge it calls is recorded."""
    calls = []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return judge(*args, **kwargs)

    costs = {"graph_key": lambda model, _options: model.decode().replace(" ", "-"),
             "graph_seconds": lambda key, cycles, _options: Cost(1e-3, MODELED, f"{cycles / 1e6:.1f} M cycles")}
    monkeypatch.setattr(auto_placement, "resolve", lambda name: costs[name.rsplit(":", 1)[1]])
    monkeypatch.setattr(auto_placement, "host_time", lambda model, _target: host_seconds[model])
    monkeypatch.setattr(auto_placement, "judge", spy)
    offload = OffloadReport(backend="npu", vendor="Vendor", device="NPU", sdk="vendor.sdk", costs="vendor.costs",
                            elements_per_call=0, options={}, options_text="", process="same", asked=8, accepted=8,
                            refused=[], in_context=0, regions=[OffloadRegion("g0", 3, 1, ["a"]),
                                                               OffloadRegion("g1", 5, 1, ["b"])],
                            graph_executions=2, excluded={}, unplaced=[], flops=0.0, flops_on_device=0.0)
    choices = auto_placement.decide(_Artifact(), offload, {"g0": _Check(), "g1": _Check()}, TWO_CPUS[0])
    assert len(calls) == 2, "every group is judged by placement_judgement.judge"
    return choices


def test_the_offload_placement_judges_each_group_device_against_measured_host(monkeypatch) -> None:
    host_wins, device_wins = _offload_decision(monkeypatch, {b"group zero": 0.4e-3, b"group one": 3e-3})
    assert not host_wins.on_device and device_wins.on_device
    assert host_wins.verdict.baseline == Cost(0.4e-3, MEASURED, f"the fastest of {auto_placement.HOST_RUNS} runs")
    row = host_wins.to_dict()  # the report's and manifest's form, read back whole
    assert row["device_source"] == "modeled: 4.0 M cycles" and row["host_source"].startswith("measured")
    assert row["on_device"] is False and row["verdict"].endswith("the host kept")
    assert auto_placement.GroupChoice.from_dict(row) == host_wins
    (tie,) = _offload_decision(monkeypatch, {b"group zero": 1e-3, b"group one": 1e-3})[:1]
    assert not tie.on_device, "a tie goes to the host"


class _EqualCosts:
    """Every kernel, and every step of a block, 1 ms on either CPU; built graphs measure ``seconds``
    whatever their placement."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def kernel_seconds(self, jobs):
        return [[1e-3 * self._steps(job, call.func_name) for call in job.calls] for job in jobs]

    @staticmethod
    def _steps(job, name: str) -> int:
        blocks = [r for _backend, regions in job.externals for r in regions if r.name == name and r.pattern == "block"]
        return len(blocks[0].spec["steps"]) if blocks else 1

    def latency_seconds(self, _artifact, _device_options=None) -> float:
        return self.seconds


def test_the_cpu_clusters_placement_judges_through_the_same_function(monkeypatch) -> None:
    calls = []

    def spy(name):
        def judged(*args, **kwargs):
            calls.append(name)
            return judge(*args, **kwargs)
        return judged

    monkeypatch.setattr(as_built, "judge_placement", spy("predicted as built"))
    monkeypatch.setattr(build_driver, "judge", spy("measured as built"))
    mod, params = models.two_towers()
    art = tvm_hetero.build(mod, TWO_CPUS, placement="auto", params=params, cost_cache=False,
                           measurer=_EqualCosts(1e-3))
    assert calls == ["predicted as built", "measured as built"]
    auto = art.build_report.autoplace
    assert auto.verdict is not None and "(modeled: as built" in auto.verdict  # the split won on the model...
    assert auto.one_device_check.kept_one_device  # ...and tied when measured: the one device is kept
    assert "judged: " in art.report() and "measured" in auto.one_device_check.verdict
