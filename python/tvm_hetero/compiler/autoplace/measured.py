"""Automatic placement by measured cost: find the units, measure every way to run each on every
device allowed to run it, solve for the whole inference, and hand the lowering a placement and the
backend regions chosen.

Steps (:func:`choose_placement`):

1. the backends' ``prepare`` (e.g. oneDNN folds batch norm into convolutions), once; every later
   step sees the prepared module, so op names agree between them;
2. the units (:mod:`.units`): the module is lowered with every op on device 0, once to TVM kernels
   only and once with the backends' regions (:mod:`.backend_choice` says which ops each region
   holds); a unit is the smallest set of ops both lowerings cover exactly, computed as TVM kernels
   or as regions (plus the TVM kernels of what the regions leave). Fusion never crosses devices, so
   these are the finest kernels any placement makes;
3. for every device, unit and variant it may run (capability table; a backend only where it runs)
   the cost is looked up in the :mod:`.cost_cache` (key: the kernel's structural hash or the
   region's description, the target, the device and its executor settings) and only what is
   missing is measured, through a :class:`Measurer` (the runtime side does the timing; this package
   never imports the runtime); a unit's cost on a device is its fastest variant there;
4. copy costs per ordered device pair that does not share memory (fixed + per byte) and the
   hand-off between devices (:attr:`~tvm_hetero.compiler.schedule_model.CostModel.sync_latency`),
   the same way;
5. :func:`.solver.solve` on the :class:`~tvm_hetero.compiler.schedule_model.CostModel`; a split
   over several devices predicted less than ``min_gain`` (5%) faster than the best single device
   gives way to that device (its gain would be within the model's unmodelled costs and the noise);
6. every op gets its unit's device; an op folded at build time (no unit) goes with a unit that
   reads it, or to the first device allowed to run it; the backends form only the regions of the
   units whose fastest variant on their device is that backend.

What a rebuild would work out again is kept in the cache too: the units (under the prepared
module's structural hash, the parameters' types, the targets and the backends) and the solver's
answer (under the cost model's content). A rebuild whose costs are all cached lowers nothing for
measuring and does not solve again.

The decision, its alternatives and the largest single choices are returned as a plain dict (it
goes into the build report and the artifact's manifest); :mod:`.report` writes it out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import tvm
import tvm_ffi

from ...backends import Backend, Region
from ..lower import lower_to_graph, op_infos
from ..placement import Capabilities, OpInfo
from ..schedule_model import CostModel, simulate
from .backend_choice import ChosenRegions, partition_with_ops, prepare
from .cost_cache import CostCache, node_key, settings_key
from .explanation import explain_choice
from .solver import OBJECTIVES, Solution, single_device_placements, solve
from .units import TVM, Part, Units, make_units, unique_binding_names

#: A split over devices must be predicted this much faster than the best single device to be used:
#: every cross-device edge costs a wake-up the model does not charge, and costs measured on a
#: loaded machine carry a few percent of noise.
MIN_GAIN = 0.05


@dataclass
class KernelCall:
    """One kernel or region to time: its name in the module handed over, and its arguments' types."""

    func_name: str
    input_types: list[tuple[tuple[int, ...], str]]
    output_types: list[tuple[tuple[int, ...], str]]


@dataclass
class MeasureJob:
    """What to time on one device: ``kernels`` holds every TVM kernel ``calls`` names, and each
    backend in ``externals`` the regions it names (the measurer runs the backend's codegen)."""

    position: int
    kernels: tvm.IRModule
    calls: list[KernelCall]
    device: tvm.runtime.Device
    target: tvm.target.Target
    options: dict | None
    externals: list[tuple[Backend, list[Region]]] = field(default_factory=list)


class Measurer(Protocol):
    """What the runtime side provides (tvm_hetero.runtime.autoplace_measure.RuntimeMeasurer)."""

    def kernel_seconds(self, jobs: Sequence[MeasureJob]) -> list[list[float]]:
        """Seconds of every call of every job (all devices in one call, so that a measurer can
        interleave them and every device sees the same load)."""
        ...

    def copy_cost(self, src: tvm.runtime.Device, dst: tvm.runtime.Device) -> tuple[float, float]: ...

    # Optional: ``sync_latency(src, dst, src_options, dst_options) -> seconds`` from a kernel's end
    # on ``src`` until ``dst``'s executor waiting for it runs, and ``call_latency(device, options)
    # -> seconds`` of one call into a remote device (0 where a measurer has none).


@dataclass
class AutoPlacement:
    """The outcome: a per-op placement for the lowering, the backends that form only the chosen
    regions, the prepared module both apply to, and the explanation."""

    choose: Callable[[OpInfo], int]
    explanation: dict[str, Any] = field(default_factory=dict)
    model: CostModel | None = None
    kernel_devices: list[int] = field(default_factory=list)
    #: What measured the costs (the build also asks it for the built graph's latency).
    measurer: Any = None
    #: The unit DAG decided on, and the ops it was lowered from (to predict other placements).
    kernels: Units | None = None
    ops: list[OpInfo] = field(default_factory=list)
    #: The module as the backends prepared it: the build lowers this one, with :attr:`backends`.
    module: tvm.IRModule | None = None
    #: Backends restricted to the regions chosen (empty: TVM kernels run every op).
    backends: list[Backend] = field(default_factory=list)
    #: Variant (``"tvm"`` or a backend's name) of every unit on its device.
    unit_variants: list[str] = field(default_factory=list)

    def kernel_assignment(self, placement: Callable[[OpInfo], int]) -> list[int]:
        """The device of every unit under an op ``placement``, to predict it: the device most of its
        ops get among those the model allows it (a hand placement may split a unit the model keeps
        whole, e.g. a bias reshape the capability table keeps on the host beside its convolution)."""
        votes: list[dict[int, int]] = [{} for _ in range(self.kernels.num_units)]
        for info in self.ops:
            unit = self.kernels.unit_of.get(info.name)
            if unit is not None:
                device = int(placement(info))
                votes[unit][device] = votes[unit].get(device, 0) + 1
        devices = []
        for unit, counts in enumerate(votes):
            ranked = sorted(counts, key=lambda d: (-counts[d], d))
            allowed = [d for d in ranked if math.isfinite(self.model.kernel_cost[unit][d])]
            devices.append((allowed or ranked or [0])[0])
        return devices


def choose_placement(
    mod: tvm.IRModule,
    devices: Sequence[tvm.runtime.Device],
    targets: Sequence[tvm.target.Target],
    shares_memory: Callable[[int, int], bool],
    measurer: Measurer,
    cache: CostCache,
    *,
    params: dict[str, Any] | None = None,
    entry: str = "main",
    objective: str = "latency",
    device_options: Sequence[dict | None] | None = None,
    capabilities: Capabilities | None = None,
    progress: Callable[[str], None] | None = None,
    min_gain: float = MIN_GAIN,
    backends: Sequence[Backend] = (),
) -> AutoPlacement:
    """Measure and solve (see the module docstring). A placement over several devices is kept
    only if it is predicted at least ``min_gain`` (relative) faster than the best single device.
    ``backends``: external backends whose regions are a measured choice on the devices they run on."""
    if objective not in OBJECTIVES:  # before any measuring
        raise ValueError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    say = progress or (lambda _msg: None)
    num_devices = len(devices)
    options = list(device_options or []) + [None] * num_devices
    backend_list = [b for b in backends if any(b.runs_on(d) for d in range(num_devices))]
    prepared = unique_binding_names(prepare(mod, backend_list, entry), entry)
    ops = op_infos(prepared, entry)
    plan_key = _module_key(prepared, params, targets, backend_list, entry)
    cached_units = cache.get_plan("units", plan_key)
    units = Units.from_json(cached_units) if cached_units is not None else None
    lowerings: list[Any] | None = None
    if units is None:
        say("automatic placement: lowering once to find the kernels"
            + (f" and once with {', '.join(b.name for b in backend_list)} regions" if backend_list else ""))
        units, lowerings = _analyse(prepared, ops, num_devices, params, entry, targets, backend_list)
        cache.put_plan("units", plan_key, units.to_json())
    info_of = {info.name: info for info in ops}
    num_units = units.num_units
    allowed = [[True] * num_devices for _ in range(num_units)]
    if capabilities is not None:
        for u in range(num_units):
            for d in range(num_devices):
                allowed[u][d] = all(op_allowed(capabilities, info_of[n], d) for n in units.computed[u] or units.ops[u])
            if not any(allowed[u]):  # no device supports every op of it: the table's fallback runs it
                allowed[u][capabilities.fallback] = True
    backend_of = {b.name: b for b in backend_list}
    settings = [settings_key(str(device), options[d]) for d, device in enumerate(devices)]

    def wanted_keys(units: Units):
        """Per device, every measurement key wanted -> (variant, part); per unit and device, the
        keys of each variant allowed there."""
        wanted: list[dict[str, tuple[str, Part]]] = [{} for _ in range(num_devices)]
        choices: list[list[dict[str, list[str]]]] = [[{} for _ in range(num_devices)] for _ in range(num_units)]
        for u in range(num_units):
            for d in range(num_devices):
                if not allowed[u][d]:
                    continue
                for variant, parts in units.variants[u].items():
                    if variant != TVM and not backend_of[variant].runs_on(d):
                        continue
                    for part in parts:
                        wanted[d].setdefault(part.key, (variant, part))
                    choices[u][d][variant] = [part.key for part in parts]
        return wanted, choices

    alone_timer = getattr(measurer, "kernel_seconds_alone", None)
    kinds = ("kernel", "kernel_alone") if alone_timer is not None else ("kernel",)

    known = {(kind, d): cache.table(kind, str(targets[d]), settings[d]) for kind in kinds for d in range(num_devices)}

    def missing_keys(wanted) -> list[dict[str, tuple[str, Part]]]:
        return [{k: v for k, v in wanted[d].items() if any(k not in known[(kind, d)] for kind in kinds)}
                for d in range(num_devices)]

    wanted, choices = wanted_keys(units)
    missing = missing_keys(wanted)
    if any(missing) and lowerings is None:  # something new to time: its kernels are needed
        say("automatic placement: lowering to find the kernels not measured yet")
        units, lowerings = _analyse(prepared, ops, num_devices, params, entry, targets, backend_list)
        wanted, choices = wanted_keys(units)
        missing = missing_keys(wanted)
    counts = {"measured": sum(len(m) for m in missing), "cached": sum(len(w) - len(m) for w, m in zip(wanted, missing))}
    jobs = [_job(d, device, targets[d], options[d], missing[d], lowerings, backend_of)
            for d, device in enumerate(devices) if missing[d]]
    if jobs:
        say("automatic placement: measuring " + ", ".join(
            f"{len(job.calls)} kernels on {job.device}" for job in jobs) + f" ({counts['cached']} cached)")
        # with the devices computing together (as a placement over several runs), then each alone
        timers = [measurer.kernel_seconds] + ([alone_timer] if alone_timer is not None else [])
        for kind, timer in zip(kinds, timers):
            for job, times in zip(jobs, _checked(timer(jobs), jobs)):
                keys = list(missing[job.position])
                cache.put_many(kind, [(key, str(job.target), settings[job.position], seconds)
                                      for key, seconds in zip(keys, times)])
                known[(kind, job.position)].update(zip(keys, times))

    def unit_costs(kind: str) -> tuple[list[list[float]], list[list[dict[str, float]]]]:
        """Per unit and device the fastest variant's time and every variant's, from ``kind``."""
        seconds_of = [known[(kind, d)] for d in range(num_devices)]
        best = [[math.inf] * num_devices for _ in range(num_units)]
        each: list[list[dict[str, float]]] = [[{} for _ in range(num_devices)] for _ in range(num_units)]
        for u in range(num_units):
            for d in range(num_devices):
                for variant, keys in choices[u][d].items():
                    each[u][d][variant] = sum(seconds_of[d][k] for k in keys)
                if each[u][d]:
                    best[u][d] = min(each[u][d].values())
        return best, each

    cost, variant_costs = unit_costs("kernel")
    alone, alone_variants = unit_costs(kinds[-1])

    latency = [[0.0] * num_devices for _ in range(num_devices)]
    per_byte = [[0.0] * num_devices for _ in range(num_devices)]
    shared = [[a == b or bool(shares_memory(a, b)) for b in range(num_devices)] for a in range(num_devices)]
    for a in range(num_devices):
        for b in range(num_devices):
            if not shared[a][b]:
                latency[a][b], per_byte[a][b] = _copy_cost(measurer, cache, devices, options, a, b)
    sync = [[0.0 if a == b else _sync_latency(measurer, cache, devices, options, a, b) for b in range(num_devices)]
            for a in range(num_devices)]
    calls = [_call_latency(measurer, cache, devices, options, d) for d in range(num_devices)]
    model = CostModel(cost, units.preds, units.out_bytes, latency, per_byte, calls, shared, sync, alone)
    say(f"automatic placement: solving for {num_units} kernels on {num_devices} devices")
    solution = _solve(model, objective, cache)
    assignment = solution.placement
    single = min(single_device_placements(model), key=lambda p: simulate(model, p).makespan, default=None)
    kept_single = False
    split_too_small = (
        single is not None and len(set(assignment)) > 1 and objective == "latency"
        and simulate(model, assignment).makespan > (1.0 - min_gain) * simulate(model, single).makespan
    )
    if split_too_small:
        assignment, kept_single = single, True
    if len(set(assignment)) == 1:  # one device computes alone: its times alone decide the backends
        variant_costs = alone_variants
    unit_variants = [min(variant_costs[u][d], key=lambda v: (variant_costs[u][d][v], v != TVM))
                     for u, d in enumerate(assignment)]
    chosen_anchors = {
        part.anchor for u, variant in enumerate(unit_variants) if variant != TVM
        for part in units.variants[u][variant] if part.anchor is not None
    }
    final_backends = [ChosenRegions(b, [d for d in range(num_devices) if b.runs_on(d)], chosen_anchors)
                      for b in backend_list if any(v == b.name for v in unit_variants)]

    def choose(info: OpInfo) -> int:
        if info.name not in units.unit_of:
            raise ValueError(f"automatic placement: {info} was not seen when the kernels were measured")
        unit = units.unit_of[info.name]
        if unit is not None:
            return assignment[unit]
        permitted = [d for d in range(num_devices) if capabilities is None or op_allowed(capabilities, info, d)]
        follows = units.follows.get(info.name)
        if follows is not None and assignment[follows] in permitted:
            return assignment[follows]
        return permitted[0] if permitted else 0

    explanation = explain_choice(model, units, assignment, unit_variants, variant_costs,
                                 [str(d) for d in devices], objective, counts)
    explanation["split_predicted_seconds"] = solution.latency if kept_single else None
    explanation["min_gain"] = min_gain
    explanation["module_key"] = plan_key
    explanation["regions_chosen"] = len(chosen_anchors)
    return AutoPlacement(choose, explanation, model, assignment, measurer, units, ops, prepared, final_backends,
                         unit_variants)


def _checked(measured: Sequence[Sequence[float]], jobs: Sequence[MeasureJob]) -> Sequence[Sequence[float]]:
    """A measurer's answer, one finite non-negative time per call of every job, or a clear error."""
    if len(measured) != len(jobs):
        raise ValueError(f"measurer answered for {len(measured)} devices, asked for {len(jobs)}")
    for job, times in zip(jobs, measured):
        if len(times) != len(job.calls) or not all(math.isfinite(t) and t >= 0 for t in times):
            raise ValueError(f"measurer on {job.device}: expected {len(job.calls)} finite non-negative "
                             f"times, got {list(times)[:8]}")
    return measured


#: Changes whenever what :func:`_analyse` makes of a module changes (old cached units are then unused).
ANALYSIS_VERSION = 2


def _analyse(prepared, ops, num_devices, params, entry, targets, backend_list) -> tuple[Units, list[Any]]:
    """The units of ``prepared`` with every part's measurement key, and the lowerings they refer to:
    TVM kernels only, then (with backends) with every region formed on device 0."""
    def on_device_0(_info: OpInfo) -> int:
        return 0

    lowered = lower_to_graph(prepared, on_device_0, num_devices, params, entry, targets=targets, track_ops=True)
    region_lowered, region_ops = None, []
    if backend_list:
        wrappers = [ChosenRegions(b, range(num_devices)) for b in backend_list]
        found = partition_with_ops(prepared, wrappers, entry, _weight_names(prepared, entry, params))
        region_lowered = lower_to_graph(prepared, on_device_0, num_devices, params, entry,
                                        [ChosenRegions(b, range(num_devices)) for b in backend_list],
                                        targets=targets, track_ops=True)
        symbols = [n.func_name for n in region_lowered.graph.nodes if n.func_name in region_lowered.regions]
        if symbols != found.symbols:  # partitioning is deterministic: the same regions, in the same order
            raise ValueError("automatic placement: two partitionings of one module differ (internal error)")
        region_ops = [None if m is None else (next(w.name for w in wrappers if m in w.matches), m.anchor, m.ops)
                      for m in found.matches]
    units = make_units(ops, lowered, region_lowered, region_ops)
    lowerings = [lowered, region_lowered]
    for unit in units.variants:
        for parts in unit.values():
            for part in parts:
                part.key = node_key(lowerings[part.lowering], part.node_id)
    return units, lowerings


def _module_key(prepared: tvm.IRModule, params, targets, backend_list, entry: str) -> str:
    """What the units depend on: the prepared module, the parameters' names and types, the
    targets, the backends and where they run."""
    doc = [
        ANALYSIS_VERSION, entry, f"{tvm_ffi.structural_hash(prepared) & 0xFFFFFFFFFFFFFFFF:016x}",
        sorted((k, list(np.shape(v)), str(getattr(v, "dtype", ""))) for k, v in (params or {}).items()),
        [str(t) for t in targets],
        [(b.name, type(b).__name__, sorted(d for d in range(len(targets)) if b.runs_on(d))) for b in backend_list],
    ]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def _solve(model: CostModel, objective: str, cache: CostCache):
    """:func:`.solver.solve`, its answer kept in ``cache`` under the cost model's content (the
    solver is deterministic, so the same model always gets the same answer)."""
    doc = json.dumps([objective, model.kernel_cost, model.preds, model.out_bytes, model.copy_latency,
                      model.copy_seconds_per_byte, model.call_latency, model.shares_memory, model.sync_latency],
                     default=str)
    key = hashlib.sha256(doc.encode()).hexdigest()
    placement = cache.get_plan("solution", key)
    if placement is not None and len(placement) == model.num_kernels and model.feasible(placement):
        return Solution(list(placement), simulate(model, placement))
    solution = solve(model, objective)
    cache.put_plan("solution", key, solution.placement)
    return solution


def op_allowed(capabilities: Capabilities, info: OpInfo, device: int) -> bool:
    """A device the table lists runs only the ops it supports; an unlisted device runs any op."""
    for listed, supports in capabilities.checks:
        if listed == device:
            return bool(supports(info))
    return True


def _weight_names(mod: tvm.IRModule, entry: str, params: dict[str, Any] | None) -> frozenset[str]:
    """Parameters of ``entry`` with values at build time (the frontend's ``"params"``, ``params``)."""
    func = mod[entry]
    names = [p.name for p in func.params]
    attached = func.attrs["params"] if func.attrs is not None and "params" in func.attrs else ()
    return frozenset(names[len(names) - len(attached):]) | frozenset(params or ())


def _job(d, device, target, options, missing: dict[str, tuple[str, Part]], lowerings, backend_of) -> MeasureJob:
    """One device's measuring job: every missing key once, TVM kernels renamed ``d<d>_k<i>`` into one
    module, regions renamed ``d<d>_r<i>_<backend>`` (names unique across devices, so a measurer
    may run several devices' jobs in one library)."""
    funcs: dict[tvm.ir.GlobalVar, Any] = {}
    calls: list[KernelCall] = []
    externals: dict[str, list[Region]] = {}
    for i, (_key, (_variant, part)) in enumerate(missing.items()):
        lowered = lowerings[part.lowering]
        call = _kernel_call(lowered, part.node_id)
        if part.anchor is None:
            name = f"d{d}_k{i}"
            funcs[tvm.ir.GlobalVar(name)] = lowered.kernels[part.func_name].with_attr("global_symbol", name)
        else:
            name = f"d{d}_r{i}_{part.variant}"
            region = lowered.regions[part.func_name]
            spec = dict(region.spec, name=name)
            externals.setdefault(region.backend, []).append(dataclasses.replace(region, name=name, device=0, spec=spec))
        calls.append(KernelCall(name, call.input_types, call.output_types))
    return MeasureJob(d, tvm.IRModule(funcs), calls, device, target, options,
                      [(backend_of[b], regions) for b, regions in externals.items()])


def _kernel_call(lowered, node_id: int) -> KernelCall:
    node = lowered.graph.nodes[node_id]
    inputs = [
        (tuple(lowered.graph.nodes[e.node].shapes[e.index]), lowered.graph.nodes[e.node].dtypes[e.index])
        for e in node.inputs
    ]
    outputs = [(tuple(s), t) for s, t in zip(node.shapes, node.dtypes)]
    return KernelCall(node.func_name, inputs, outputs)


def _copy_cost(measurer: Measurer, cache: CostCache, devices, options, a: int, b: int) -> tuple[float, float]:
    src, dst = settings_key(str(devices[a]), options[a]), settings_key(str(devices[b]), options[b])
    fixed = cache.get("copy_latency", src, dst, "")
    slope = cache.get("copy_per_byte", src, dst, "")
    if fixed is None or slope is None:
        fixed, slope = measurer.copy_cost(devices[a], devices[b])
        cache.put("copy_latency", src, dst, "", fixed)
        cache.put("copy_per_byte", src, dst, "", slope)
    return fixed, slope


def _call_latency(measurer: Measurer, cache: CostCache, devices, options, d: int) -> float:
    """Seconds of one call into device ``d`` (a remote one: an RPC round trip; cached); 0 for a
    measurer that does not time it."""
    settings = settings_key(str(devices[d]), options[d])
    seconds = cache.get("call_latency", settings, "", "")
    if seconds is None:
        timer = getattr(measurer, "call_latency", None)
        if timer is None:
            return 0.0
        seconds = float(timer(devices[d], options[d]))
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"measurer: call latency of {devices[d]} is {seconds}")
        cache.put("call_latency", settings, "", "", seconds)
    return seconds


def _sync_latency(measurer: Measurer, cache: CostCache, devices, options, a: int, b: int) -> float:
    """Seconds from a kernel's end on device ``a`` until device ``b`` waiting for it runs (cached);
    0 for a measurer that does not time it."""
    src, dst = settings_key(str(devices[a]), options[a]), settings_key(str(devices[b]), options[b])
    seconds = cache.get("sync_latency", src, dst, "")
    if seconds is None:
        timer = getattr(measurer, "sync_latency", None)
        if timer is None:
            return 0.0
        seconds = float(timer(devices[a], devices[b], options[a], options[b]))
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"measurer: sync latency {devices[a]} -> {devices[b]} is {seconds}")
        cache.put("sync_latency", src, dst, "", seconds)
    return seconds
