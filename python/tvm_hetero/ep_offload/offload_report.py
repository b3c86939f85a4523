"""The build report's section for an accelerator reached through its vendor's SDK, as data: what
the vendor was asked and refused, its graphs, their verification, the modeled latency and the
automatic placement's judgements (:mod:`.report` writes it as text; :meth:`OffloadReport.to_dict`
is the artifact manifest's form)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .auto_placement import GroupChoice
from .sdk import ModeledLatency

#: How a build report names this section's type in its JSON form (read back by name: the compiler
#: does not import this package).
REPORT_TYPE = "tvm_hetero.ep_offload.offload_report:OffloadReport"


@dataclass
class OffloadRegion:
    """One vendor graph (a region or block) on the device."""

    name: str
    #: Relax ops in it.
    ops: int
    #: The device's position in the build's device list.
    device: int
    #: The Relax bindings it covers (what moves back when it fails).
    bindings: list[str]
    #: Conv/matmul FLOPs in it, and elements its ops make.
    flops: float = 0.0
    elements: int = 0


@dataclass
class RefusedOp:
    """An op the vendor would not take, and its reason."""

    binding: str
    op: str
    reason: str


@dataclass
class UnplacedOp:
    """An op the vendor accepts that no region took (a gap in the backend's patterns)."""

    binding: str
    op: str


@dataclass
class RegionCheck:
    """One region's verification against the CPU."""

    region: str
    ops: int
    ok: bool
    relative_error: float
    finite: bool
    reference_scale: float
    #: Every reference value below fp16's normal range (the device computes ~0).
    underflow: bool


@dataclass
class Verification:
    """The build's verification of every region, in its last round."""

    tolerance: float
    rounds: int
    regions: list[RegionCheck]
    #: ``"calibration data"`` or ``"seeded random inputs"``.
    inputs: str


@dataclass
class MovedStep:
    """Ops verification moved back: one step of a region (``step``), or a whole region (``step`` None)."""

    region: str
    step: int | None
    #: The step's ONNX ops ([] for a whole region).
    ops: list[str]
    bindings: list[str]
    reason: str
    #: "culprits" or "build-up" (:mod:`.fewest_ops`), "first bad step" or "whole region".
    rule: str
    #: The step's error fed the CPU's inputs, and in the device's own chain (NaN where not measured).
    own_error: float = float("nan")
    inherited_error: float = float("nan")


@dataclass
class MoveRound:
    """One verification round: conv/matmul FLOPs on the device against the worst graph's error."""

    round: int
    graphs: int
    flops_on_device: float
    flops: float
    worst_error: float
    bad_graphs: int


@dataclass
class MoveBack:
    """What verification moved back, round by round (``rule``: the build's ``offload_move_back``)."""

    rule: str
    rounds: list[MoveRound] = field(default_factory=list)
    steps: list[MovedStep] = field(default_factory=list)


@dataclass
class OffloadReport:
    """The build report's section for an accelerator reached through its vendor's SDK."""

    #: The backend's, vendor's and device's names, its SDK and cost modules (``costs``: "" for none).
    backend: str
    vendor: str
    device: str
    sdk: str
    costs: str
    #: Elements a group must make to be worth a graph call (the small-group gate).
    elements_per_call: int
    options: dict[str, Any]
    options_text: str
    #: ``"same"`` or ``"separate"``: where the vendor's calls run.
    process: str
    #: Relax ops asked of the vendor, and accepted.
    asked: int
    accepted: int
    refused: list[RefusedOp]
    #: Ops accepted only together with the op reading them.
    in_context: int
    regions: list[OffloadRegion]
    graph_executions: int
    #: Binding -> why it was kept off the device.
    excluded: dict[str, str]
    unplaced: list[UnplacedOp]
    flops: float
    flops_on_device: float
    #: Per block, the bindings each of its steps covers.
    steps: dict[str, list[list[str]]] = field(default_factory=dict)
    quantized: bool = False
    verification: Verification | None = None
    modeled: ModeledLatency | None = None
    #: placement="auto": each group's judgement (:mod:`.auto_placement`).
    auto: list[GroupChoice] | None = None
    #: Each op verification moved back and why, and each round's FLOPs on the device against its error.
    move_back: MoveBack | None = None
    #: The function writing this section's lines, by name (:func:`.report.explain`).
    explain: str = "tvm_hetero.ep_offload.report:explain"

    def region(self, name: str) -> OffloadRegion:
        return next(r for r in self.regions if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the artifact's manifest), naming its type to be read back."""
        doc = dataclasses.asdict(self)
        doc["auto"] = None if self.auto is None else [choice.to_dict() for choice in self.auto]
        doc["report_type"] = REPORT_TYPE
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> OffloadReport:
        """The inverse of :meth:`to_dict`."""
        doc = {k: v for k, v in doc.items() if k != "report_type"}
        doc["refused"] = [RefusedOp(**r) for r in doc.get("refused", [])]
        doc["unplaced"] = [UnplacedOp(**r) for r in doc.get("unplaced", [])]
        doc["regions"] = [OffloadRegion(**r) for r in doc.get("regions", [])]
        if doc.get("verification") is not None:
            checks = [RegionCheck(**c) for c in doc["verification"]["regions"]]
            doc["verification"] = Verification(**{**doc["verification"], "regions": checks})
        if doc.get("modeled") is not None:
            doc["modeled"] = ModeledLatency(**doc["modeled"])
        if doc.get("auto") is not None:
            doc["auto"] = [GroupChoice.from_dict(row) for row in doc["auto"]]
        if doc.get("move_back") is not None:
            moved = doc["move_back"]
            doc["move_back"] = MoveBack(moved["rule"], [MoveRound(**r) for r in moved["rounds"]],
                                        [MovedStep(**r) for r in moved["steps"]])
        return cls(**doc)
