"""The automatic placement's choice explained, as data (:class:`AutoplaceReport`, the build report's
``autoplace``; its :meth:`~AutoplaceReport.to_dict` is the artifact manifest's form, and
:mod:`.report` writes it as text): per device the units, ops and backends chosen and its busy time,
the predicted latency and bottleneck, the predicted latency of the placements a person would try,
and the units whose choice mattered most."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..schedule_model import CostModel, simulate
from .units import Units


@dataclass
class DeviceShare:
    """What one device got."""

    device: str
    kernels: int
    ops: int
    busy_seconds: float
    #: Seconds of one call into the device (0 for a device the host drives).
    call_seconds: float
    #: Units per variant (``"tvm"`` or a backend's name).
    variants: dict[str, int] = field(default_factory=dict)


@dataclass
class UnitDecision:
    """One unit's choice against its most expensive other way."""

    kernel: str
    index: int
    device: str
    backend: str
    seconds: float
    other_device: str
    other_backend: str
    other_seconds: float


@dataclass
class Alternative:
    """A placement a person would try, and its predicted latency."""

    label: str
    seconds: float
    #: The one device it puts everything on (None: a split).
    device: int | None = None


@dataclass
class AsBuilt:
    """The chosen placement's graph as built: its nodes, blocks and each device's busy time."""

    nodes: int
    blocks: int
    device_busy: list[float]
    #: The one device it puts everything on (None: a split).
    device: int | None = None


@dataclass
class SingleDevice:
    """A device's best single-device placement as built."""

    label: str
    seconds: float


@dataclass
class OneDeviceCheck:
    """The build's measured check of a split against the best one-device build
    (:func:`tvm_hetero.build_driver`)."""

    device: str
    measured_seconds: float
    split_measured_seconds: float
    kept_one_device: bool
    #: The judgement's line (:mod:`tvm_hetero.placement_judgement`).
    verdict: str = ""
    split_predicted_seconds: float | None = None
    #: The verdict came from an earlier build of this choice.
    cached: bool = False


@dataclass
class AutoplaceReport:
    """The automatic placement's part of the build report."""

    objective: str
    predicted_seconds: float
    bottleneck_seconds: float
    remote_calls: int
    per_device: list[DeviceShare]
    alternatives: list[Alternative]
    #: The units whose choice mattered most (at most five).
    decisions: list[UnitDecision]
    kernels_measured: int
    kernels_cached: int
    #: The built graph's measured latency (the build driver's), and whether it came from the cache.
    measured_seconds: float | None = None
    measured_cached: bool = False
    #: Kernels and blocks measured to judge placements as built.
    as_built_measured: int = 0
    #: Times never confirmed by their re-measurement (used, not cached).
    unconfirmed: int = 0
    #: The executor settings every time was measured with (run the artifact with them).
    device_options: list[dict | None] = field(default_factory=list)
    #: The unit model's prediction where the choice was judged as built.
    unit_predicted_seconds: float | None = None
    as_built: AsBuilt | None = None
    #: Per device index its best single-device prediction (the measured check reads it).
    single_device: dict[int, SingleDevice] = field(default_factory=dict)
    #: The best split's prediction where a single device was kept.
    split_predicted_seconds: float | None = None
    #: The judgement of the best split against the best single device, as text.
    verdict: str | None = None
    #: The device an earlier measured check found faster than the split.
    measured_check_device: str | None = None
    min_gain: float = 0.0
    #: What a built graph's measured latency and the decision are kept under in the cost cache.
    module_key: str = ""
    decision_key: str = ""
    regions_chosen: int = 0
    #: Backend regions formed, where they differ from those chosen.
    regions_formed: int | None = None
    one_device_check: OneDeviceCheck | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the manifest's): ``alternatives`` as ``{label: seconds}`` (with each one's
        device under ``alternative_devices``), ``single_device`` keyed by the device's number as text."""
        doc = dataclasses.asdict(self)
        doc["alternatives"] = {a.label: a.seconds for a in self.alternatives}
        doc["alternative_devices"] = {a.label: a.device for a in self.alternatives}
        doc["single_device"] = {str(d): dataclasses.asdict(s) for d, s in self.single_device.items()}
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AutoplaceReport:
        """The inverse of :meth:`to_dict` (an exported artifact's report); keys it does not know
        are a ValueError naming them."""
        doc = dict(doc)
        devices = doc.pop("alternative_devices", {}) or {}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ValueError(f"automatic placement report: unknown keys {unknown}")
        doc["per_device"] = [DeviceShare(**row) for row in doc.get("per_device", [])]
        doc["alternatives"] = [Alternative(label, seconds, devices.get(label))
                               for label, seconds in (doc.get("alternatives") or {}).items()]
        doc["decisions"] = [UnitDecision(**row) for row in doc.get("decisions", [])]
        doc["single_device"] = {int(d): SingleDevice(**row) for d, row in (doc.get("single_device") or {}).items()}
        if doc.get("as_built") is not None:
            doc["as_built"] = AsBuilt(**doc["as_built"])
        if doc.get("one_device_check") is not None:
            doc["one_device_check"] = OneDeviceCheck(**doc["one_device_check"])
        return cls(**doc)

    def alternative(self, label: str) -> Alternative | None:
        return next((a for a in self.alternatives if a.label == label), None)


def alternatives(model: CostModel, allowed: Callable[[int, int], bool]) -> list[Alternative]:
    """Predicted latency of the placements a person would try: everything on one device (each
    that can run it all), and everything capable on each other device (the rest on device 0).
    ``allowed(unit, device)``: the capability table lets the device run the unit."""
    n, num_devices = model.num_kernels, model.num_devices
    result: list[Alternative] = []
    for d in range(num_devices):
        if model.feasible([d] * n):
            result.append(Alternative(f"all on device {d}", simulate(model, [d] * n).makespan, d))
    for d in range(1, num_devices):
        capable = [d if allowed(k, d) else 0 for k in range(n)]
        if capable != [d] * n and model.feasible(capable):
            result.append(Alternative(f"everything capable on device {d}", simulate(model, capable).makespan))
    return result


def unit_label(units: Units, u: int) -> str:
    """``conv2d #17``: the unit's main op (the first that is no elementwise helper) and its number."""
    helpers = ("relax.add", "relax.reshape", "relax.nn.relu", "relax.multiply", "relax.subtract", "relax.clip")
    ops = units.relax_ops[u]
    main = next((op for op in ops if op not in helpers), ops[0] if ops else "?")
    more = f" (+{len(ops) - 1} ops)" if len(ops) > 1 else ""
    return f"{main.removeprefix('relax.').removeprefix('nn.')} #{u}{more}"


def explain_choice(model: CostModel, units: Units, assignment: list[int], unit_variants: list[str],
                   variant_costs: list[list[dict[str, float]]], device_names: list[str], objective: str,
                   counts: dict[str, int]) -> AutoplaceReport:
    """The explanation of ``assignment`` (a device per unit) with ``unit_variants`` (a backend per
    unit), from the costs it was chosen on."""
    schedule = simulate(model, assignment)
    num_devices = model.num_devices
    per_device = []
    for d in range(num_devices):
        mine = [u for u, dev in enumerate(assignment) if dev == d]
        by_variant: dict[str, int] = {}
        for u in mine:
            by_variant[unit_variants[u]] = by_variant.get(unit_variants[u], 0) + 1
        per_device.append(DeviceShare(device_names[d], len(mine), sum(len(units.ops[u]) for u in mine),
                                      schedule.device_busy[d] if schedule.device_busy else 0.0,
                                      model.call_latency[d], by_variant))
    decisions = []
    for u, d in enumerate(assignment):
        chosen = unit_variants[u]
        others = [(seconds, o, variant) for o in range(num_devices) for variant, seconds in variant_costs[u][o].items()
                  if (o, variant) != (d, chosen)]
        if not others:
            continue
        other_cost, other, other_variant = max(others)
        decisions.append(UnitDecision(unit_label(units, u), u, device_names[d], chosen, variant_costs[u][d][chosen],
                                      device_names[other], other_variant, other_cost))
    decisions.sort(key=lambda x: -abs(x.other_seconds - x.seconds))
    return AutoplaceReport(
        objective=objective,
        predicted_seconds=schedule.makespan,
        bottleneck_seconds=schedule.bottleneck,
        remote_calls=schedule.remote_calls,
        per_device=per_device,
        alternatives=alternatives(model, lambda u, d: math.isfinite(model.kernel_cost[u][d])),
        decisions=decisions[:5],
        kernels_measured=counts["measured"],
        kernels_cached=counts["cached"],
    )
