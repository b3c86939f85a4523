"""Automatic placement with an offload device (``placement="auto"``): each group stays on the
device only where one call of its vendor graph costs less than the host computing the same ops.

Per group of the verified build (:mod:`.verified_build`): the device's cost is one call of its graph,
measured on a device where the vendor's cost table has it, else modeled from the vendor's cycle
count (the backend's cost module) — never an emulator's wall time; the host's cost is *measured*:
the group's ops (its plain ONNX model) built for the host device alone with the default backends
and timed on it (the fastest of several runs: on a loaded machine a run is only ever slowed down).
Both are judged the one way every placement is (:func:`tvm_hetero.placement_judgement.judge`: the
device is the candidate, the host the baseline, a tie goes to the host). A group the host wins goes
back to the host, and the build repeats once. Both sides are host memory, so no copy enters either cost.

Guarantee: the decision is taken once, on the first verified build; every group kept on the device
was predicted faster there, and the report shows both figures, labelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..kind_record import resolve
from ..placement_judgement import MEASURED, MEASURED_ON_A_DEVICE, MODELED, Cost, Verdict, judge
from .child_process import run_once

#: Timed runs of a group on the host (after one warm-up); the fastest is its cost.
HOST_RUNS = 15
#: Seconds the host's build and timing of one group may take.
HOST_TIMEOUT = 600.0


@dataclass(frozen=True)
class GroupChoice:
    """One group's judgement: its vendor graph on the device against the host computing its ops."""

    #: The group's region (vendor graph) name.
    region: str
    #: Relax ops in it.
    ops: int
    #: The vendor's key of its graph (its cost table's key).
    key: str
    #: The device's call (candidate) against the host (baseline).
    verdict: Verdict

    @property
    def on_device(self) -> bool:
        return self.verdict.kept

    def to_dict(self) -> dict:
        """The report's and manifest's form (figures in seconds, each with its label)."""
        device, host = self.verdict.candidate, self.verdict.baseline
        return {"region": self.region, "ops": self.ops, "key": self.key,
                "device_seconds": device.seconds, "device_source": _label(device),
                "host_seconds": host.seconds, "host_source": _label(host), "on_device": self.on_device,
                "verdict": self.verdict.explain(), "judgement": self.verdict.to_dict()}

    @classmethod
    def from_dict(cls, doc: dict) -> GroupChoice:
        """The inverse of :meth:`to_dict` (an exported artifact's report; one exported before the
        judgement was kept whole gives it back from its figures and labels)."""
        if "judgement" in doc:
            return cls(doc["region"], doc["ops"], doc["key"], Verdict.from_dict(doc["judgement"]))
        device = _cost(doc["device_seconds"], doc["device_source"])
        host = _cost(doc["host_seconds"], doc.get("host_source", MEASURED))
        return cls(doc["region"], doc["ops"], doc["key"], Verdict("the device", device, "the host", host, 0.0,
                                                                  bool(doc["on_device"])))


def _label(cost: Cost) -> str:
    return cost.source + (f": {cost.detail}" if cost.detail else "")


def _cost(seconds: float, label: str) -> Cost:
    """A cost from an older manifest's label (``"modeled: ..."``, ``"measured on a device (...)"``)."""
    source = next((s for s in (MEASURED_ON_A_DEVICE, MODELED, MEASURED) if label.startswith(s)), None)
    if source is None:
        raise ValueError(f"automatic placement report: a cost labelled {label!r}")
    return Cost(seconds, source, label[len(source):].strip(" :()"))


def decide(artifact: Any, offload: Any, checks: dict, host_target: Any) -> list[GroupChoice]:
    """Per group of ``offload`` (the build's :class:`~.offload_report.OffloadReport`) its two costs
    and whether it stays on the device."""
    if not offload.costs:
        raise ValueError(f"placement='auto': the {offload.device}'s backend has no cost model to weigh its "
                         "groups with")
    graph_key, graph_seconds = resolve(offload.costs + ":graph_key"), resolve(offload.costs + ":graph_seconds")
    choices = []
    for region in offload.regions:
        model = artifact.offload_references.get(region.name)
        if model is None:
            raise RuntimeError(f"automatic placement: {offload.device} graph {region.name} has no ONNX form to time on the host")
        check = checks.get(region.name)
        key = graph_key(model, offload.options)
        device = graph_seconds(key, check.cycles if check else float("nan"), offload.options)
        host = Cost(host_time(model, host_target), MEASURED, f"the fastest of {HOST_RUNS} runs")
        verdict = judge(device, host, candidate_name=f"the {offload.device}", baseline_name="the host")
        choices.append(GroupChoice(region.name, region.ops, key, verdict))
    return choices


def host_time(model: bytes, host_target: Any) -> float:
    """Seconds for the host device alone to compute a group (its plain ONNX model) with tvm-hetero,
    timed in a child process (:mod:`.host_timing`): no thread of this one (vendor sessions,
    executors) shares its cores."""
    from ..devices import parse_spec

    spec = parse_spec(host_target)
    job = {"model": model, "device": [int(spec.device.dlpack_device_type()), int(spec.device.index)],
           "target": str(spec.target)}
    return float(run_once("tvm_hetero.ep_offload.host_timing", job, "automatic placement: timing a group on the host",
                          HOST_TIMEOUT))
