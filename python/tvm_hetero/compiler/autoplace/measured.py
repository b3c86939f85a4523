"""Automatic placement by measured cost: find the units, measure every way to run each on every
device allowed to run it, solve for the whole inference, judge the answer as the build will make
it, and hand the lowering a placement and the backend regions chosen.

Steps (:func:`choose_placement`):

1. the backends' ``prepare`` (e.g. oneDNN folds batch norm into convolutions), once; every later
   step sees the prepared module, so op names agree between them;
2. the units (:mod:`.units`): the module is lowered with every op on device 0, once to TVM kernels
   only and once with the backends' regions (:mod:`.backend_choice` says which ops each region
   holds); a unit is the smallest set of ops both lowerings cover exactly, computed as TVM kernels
   or as regions (plus the TVM kernels of what the regions leave). Fusion never crosses devices, so
   these are the finest kernels any placement makes;
3. for every device, unit and variant it may run (capability table; a backend only where it runs)
   the cost is looked up in the cost cache and only what is missing is measured
   (:mod:`.kernel_times`); a unit's cost on a device is its fastest variant there;
4. copy costs per ordered device pair that does not share memory (fixed + per byte), the hand-off
   between devices (:attr:`~tvm_hetero.compiler.schedule_model.CostModel.sync_latency`) and the
   call into a remote device, the same way;
5. :func:`.solver.solve` on the unit :class:`~tvm_hetero.compiler.schedule_model.CostModel`;
6. the unit model times regions one at a time, but the build joins a device's regions into
   blocks: with the build's lowering at hand (``lower``), the solver's split and every
   single-device placement are lowered as built and predicted on their own kernels and blocks
   (:mod:`.as_built`), a split corrected for blocks is solved and judged too, and a split is kept
   only if it is predicted more than ``min_gain`` (5%) faster than the best single device (its gain would
   otherwise be within the model's unmodelled costs and the noise). Without ``lower`` the same
   rule is applied to the unit model's predictions;
7. every op gets its unit's device; an op folded at build time (no unit) goes with a unit that
   reads it, or to the first device allowed to run it; the backends form only the regions of the
   units whose fastest variant on their device is that backend.

What a rebuild would work out again is kept in the cache too: the units (under the prepared
module's structural hash, the parameters' types, the targets and the backends), the solver's
answer (under the cost model's content) and the judged decision (under the same content and the
module). A rebuild whose costs are all cached lowers nothing for measuring or judging and does
not solve again.

The decision, its alternatives and the largest single choices are returned as an
:class:`~.explanation.AutoplaceReport` (the build report's ``autoplace``; its ``to_dict`` goes into
the artifact's manifest); :mod:`.report` writes it out.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from ...backends import Backend
from ...devices import name_of
from ...placement_judgement import MODELED, Cost, judge
from ..lower import lower_to_graph, op_infos
from ..placement import Capabilities, OpInfo
from ..schedule_model import CostModel, simulate
from .as_built import BuiltPrediction, Candidate, Judge, LowerAsBuilt, every_region, judge_candidates
from .backend_choice import ChosenRegions, partition_with_ops, prepare
from .cost_cache import CostCache, node_key, settings_key
from .explanation import Alternative, AsBuilt, AutoplaceReport, SingleDevice, explain_choice
from .kernel_times import KernelTimes, Measurer
from .solver import OBJECTIVES, Solution, single_device_placements, solve
from .units import TVM, Part, Units, make_units, unique_binding_names

#: A split over devices must be predicted this much faster than the best single device to be used:
#: every cross-device edge costs a wake-up the model does not charge, and costs measured on a
#: loaded machine carry a few percent of noise.
MIN_GAIN = 0.05

#: A verdict of the build's measured check (``build_driver.build``) kept under a decision's key: the
#: device whose one-device build measured faster than the split, or None where the split won.
MEASURED_CHECK = "measured_check"


@dataclass
class AutoPlacement:
    """The outcome: a per-op placement for the lowering, the backends that form only the chosen
    regions, the prepared module both apply to, and the explanation."""

    choose: Callable[[OpInfo], int]
    explanation: AutoplaceReport | None = None
    model: CostModel | None = None
    kernel_devices: list[int] = field(default_factory=list)
    #: The unit DAG decided on, and the ops it was lowered from (to predict other placements).
    kernels: Units | None = None
    ops: list[OpInfo] = field(default_factory=list)
    #: The module as the backends prepared it: the build lowers this one, with :attr:`backends`.
    module: tvm.IRModule | None = None
    #: Backends restricted to the regions chosen (empty: TVM kernels run every op).
    backends: list[Backend] = field(default_factory=list)
    #: Variant (``"tvm"`` or a backend's name) of every unit on its device.
    unit_variants: list[str] = field(default_factory=list)
    #: Predicts a placement as built (None where no lowering was given).
    judge: Judge | None = None

    def predict(self, placement: Callable[[OpInfo], int], backends: Sequence[Backend],
                module: tvm.IRModule | None = None) -> BuiltPrediction:
        """A hand ``placement`` of ``module`` (default: the prepared one) with ``backends`` (regions
        where the placement puts their anchor), lowered as the build lowers it and predicted from
        measured kernels and blocks (those not measured yet are timed now)."""
        if self.judge is None:
            raise ValueError("automatic placement was chosen without the build's lowering: nothing to predict with")
        return self.judge.predict(placement, list(backends), module)


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
    lower: LowerAsBuilt | None = None,
) -> AutoPlacement:
    """Measure, solve and judge (see the module docstring). ``backends``: external backends whose
    regions are a measured choice on the devices they run on. ``lower``: the build's own lowering
    of the prepared module (:data:`.as_built.LowerAsBuilt`), to judge placements as built."""
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
    allowed = _allowed(units, info_of, capabilities, num_devices)
    backend_of = {b.name: b for b in backend_list}
    times = KernelTimes(measurer, cache, devices, targets, options, backend_list, say)

    wanted, choices = _wanted(units, allowed, backend_of)
    missing = times.missing(wanted)
    if any(missing) and lowerings is None:  # something new to time: its kernels are needed
        say("automatic placement: lowering to find the kernels not measured yet")
        units, lowerings = _analyse(prepared, ops, num_devices, params, entry, targets, backend_list)
        wanted, choices = _wanted(units, allowed, backend_of)
        missing = times.missing(wanted)
    counts = {"measured": sum(len(m) for m in missing), "cached": sum(len(w) - len(m) for w, m in zip(wanted, missing))}
    times.measure(missing, lowerings)
    cost, variant_costs = _unit_costs(units, choices, times, "kernel")
    alone, alone_variants = _unit_costs(units, choices, times, times.alone)

    latency = [[0.0] * num_devices for _ in range(num_devices)]
    per_byte = [[0.0] * num_devices for _ in range(num_devices)]
    shared = [[a == b or bool(shares_memory(a, b)) for b in range(num_devices)] for a in range(num_devices)]
    for a in range(num_devices):
        for b in range(num_devices):
            if not shared[a][b]:
                latency[a][b], per_byte[a][b] = _copy_cost(measurer, cache, devices, options, a, b)
    sync = [[0.0 if a == b else _optional_timing(measurer, cache, "sync_latency", devices, options, a, b)
             for b in range(num_devices)]
            for a in range(num_devices)]
    calls = [_optional_timing(measurer, cache, "call_latency", devices, options, d) for d in range(num_devices)]
    spins = [_optional_timing(measurer, cache, "spin_window", devices, options, d) for d in range(num_devices)]
    model = CostModel(cost, units.preds, units.out_bytes, latency, per_byte, calls, shared, sync, alone,
                      spin_window=spins)
    say(f"automatic placement: solving for {units.num_units} kernels on {num_devices} devices")
    solution = _solve(model, objective, cache)

    def variants_of(assignment: Sequence[int], together=variant_costs, apart=alone_variants) -> list[str]:
        """Per unit the fastest variant on its device (timed alone for a one-device placement)."""
        table = apart if len(set(assignment)) == 1 else together
        return [min(table[u][d], key=lambda v: (table[u][d][v], v != TVM)) for u, d in enumerate(assignment)]

    def placing(candidate: Candidate) -> tuple[Callable[[OpInfo], int], list[Backend], set[str]]:
        return _placing(units, candidate, backend_list, num_devices, capabilities)

    judge = None if lower is None else Judge(lower, prepared, times, model, lambda c: placing(c)[:2])
    decision_key = _decision_key(model, plan_key, objective, min_gain, times.settings)
    if judge is not None and objective == "latency":
        decision = _judged(judge, model, solution, variants_of, variant_costs, alone_variants, cache, decision_key,
                           min_gain, say)
    else:
        decision = _solved(model, solution, objective, min_gain, variants_of)
    chosen = decision.chosen
    assignment, unit_variants = chosen.assignment, chosen.variants
    choose, final_backends, chosen_anchors = placing(chosen)
    variant_table = alone_variants if len(set(assignment)) == 1 else variant_costs
    explanation = explain_choice(model, units, assignment, unit_variants, variant_table,
                                 [name_of(d) for d in devices], objective, counts)
    explanation.as_built_measured = times.measured - counts["measured"]  # kernels and blocks of candidates
    explanation.unconfirmed = times.unconfirmed  # used for this build, kept out of the cache
    # The executor settings every time was measured with: run the artifact with them (targets="auto"
    # resolves them from discovery, so its caller has not seen them).
    explanation.device_options = options[:num_devices]
    if decision.predicted:
        explanation.unit_predicted_seconds = explanation.predicted_seconds
        explanation.predicted_seconds = decision.predicted.get(chosen.label, explanation.predicted_seconds)
        # The one-device placements as built replace the unit model's; the others stay.
        one_device = [Alternative(label, seconds, decision.details.get(label, {}).get("device"))
                      for label, seconds in decision.predicted.items()]
        explanation.alternatives = ([a for a in one_device if a.device is not None]
                                    + [a for a in explanation.alternatives if a.device is None])
        built = decision.details.get(chosen.label)
        explanation.as_built = AsBuilt(**built) if built is not None else None
        # Per device, its best single-device prediction (the build driver's measured check reads it).
        singles: dict[int, SingleDevice] = {}
        for alternative in one_device:
            d = alternative.device
            if d is not None and (d not in singles or alternative.seconds < singles[d].seconds):
                singles[d] = SingleDevice(alternative.label, alternative.seconds)
        explanation.single_device = singles
        if explanation.as_built is not None:  # each device's busy time as built, blocks and all
            for row, busy in zip(explanation.per_device, explanation.as_built.device_busy):
                row.busy_seconds = busy
    explanation.split_predicted_seconds = decision.split_predicted
    explanation.verdict = decision.verdict
    explanation.measured_check_device = (None if decision.verdict_device is None
                                         else name_of(devices[decision.verdict_device]))
    explanation.min_gain = min_gain
    # What a built graph's measured latency is kept under, with the graph: the module and the
    # devices' settings (with targets="auto" its caller never saw the settings to key it by).
    explanation.module_key = hashlib.sha256(json.dumps([plan_key, times.settings]).encode()).hexdigest()
    explanation.decision_key = decision_key
    explanation.regions_chosen = len(chosen_anchors)
    return AutoPlacement(choose, explanation, model, assignment, units, ops, prepared, final_backends,
                         unit_variants, judge)


@dataclass
class _Decision:
    """The candidate chosen, and what the report says of the others."""

    chosen: Candidate
    #: Predicted seconds as built, by candidate label (empty: judged on the unit model only).
    predicted: dict[str, float] = field(default_factory=dict)
    details: dict[str, dict] = field(default_factory=dict)
    #: The best split's prediction where a single device was kept.
    split_predicted: float | None = None
    #: The device an earlier measured check found faster than the split.
    verdict_device: int | None = None
    #: The judgement of the best split against the best single device, as text (None: no split to judge).
    verdict: str | None = None


def _judged(judge: Judge, model: CostModel, solution: Solution, variants_of, together, apart, cache: CostCache,
            decision_key: str, min_gain: float, say) -> _Decision:
    """Candidates judged as built (:func:`.as_built.judge_candidates`), the decision kept in the
    cache; a verdict of the build's measured check, where one was kept, overrides a split."""
    decided = cache.get_plan("decision", decision_key)
    if decided is None:
        decided = judge_candidates(judge, model, solution.placement, variants_of, together, apart,
                                   lambda m: _solve(m, "latency", cache), min_gain, say)
        cache.put_plan("decision", decision_key, decided)
    decision = _Decision(Candidate(decided["label"], decided["assignment"], decided["variants"]),
                         decided["predicted"], decided.get("details", {}), decided.get("split_predicted"),
                         verdict=decided.get("verdict"))
    verdict = cache.get_plan(MEASURED_CHECK, decision_key)
    if verdict is not None and verdict.get("device") is not None:  # a one-device build measured faster
        decision.chosen = _every_region_on(verdict["device"], apart, variants_of)
        decision.verdict_device = verdict["device"]
    return decision


def _solved(model: CostModel, solution: Solution, objective: str, min_gain: float, variants_of) -> _Decision:
    """The solver's answer on the unit model; for latency, a split judged against the best single
    device (:func:`~tvm_hetero.placement_judgement.judge`: not more than ``min_gain`` faster, it
    gives way to that device)."""
    assignment, split_predicted, verdict = solution.placement, None, None
    single = min(single_device_placements(model), key=lambda p: simulate(model, p).makespan, default=None)
    if single is not None and len(set(assignment)) > 1 and objective == "latency":
        verdict = judge(Cost(simulate(model, assignment).makespan, MODELED, "the unit model"),
                        Cost(simulate(model, single).makespan, MODELED, "the unit model"),
                        min_gain=min_gain, candidate_name="the split", baseline_name=f"all on device {single[0]}")
        if not verdict.kept:
            split_predicted, assignment = solution.latency, single
    return _Decision(Candidate("solved", assignment, variants_of(assignment)), split_predicted=split_predicted,
                     verdict=verdict.explain() if verdict is not None else None)


def _allowed(units: Units, info_of: dict[str, OpInfo], capabilities: Capabilities | None,
             num_devices: int) -> list[list[bool]]:
    """Per unit and device: the capability table lets the device run every op of the unit a kernel
    computes (a unit no device may run whole goes to the table's fallback)."""
    allowed = [[True] * num_devices for _ in range(units.num_units)]
    if capabilities is None:
        return allowed
    for u in range(units.num_units):
        for d in range(num_devices):
            allowed[u][d] = all(op_allowed(capabilities, info_of[n], d) for n in units.computed[u] or units.ops[u])
        if not any(allowed[u]):
            allowed[u][capabilities.fallback] = True
    return allowed


def _wanted(units: Units, allowed: list[list[bool]], backend_of: dict[str, Backend]):
    """Per device every measurement key wanted -> its part; per unit and device, the keys of each
    variant allowed there."""
    num_devices = len(allowed[0]) if allowed else 0
    wanted: list[dict[str, Part]] = [{} for _ in range(num_devices)]
    choices: list[list[dict[str, list[str]]]] = [[{} for _ in range(num_devices)] for _ in range(units.num_units)]
    for u in range(units.num_units):
        for d in range(num_devices):
            if not allowed[u][d]:
                continue
            for variant, parts in units.variants[u].items():
                if variant != TVM and not backend_of[variant].runs_on(d):
                    continue
                for part in parts:
                    wanted[d].setdefault(part.key, part)
                choices[u][d][variant] = [part.key for part in parts]
    return wanted, choices


def _unit_costs(units: Units, choices, times: KernelTimes, kind: str):
    """Per unit and device the fastest variant's time and every variant's, from ``kind``."""
    num_devices = len(times.devices)
    best = [[math.inf] * num_devices for _ in range(units.num_units)]
    each: list[list[dict[str, float]]] = [[{} for _ in range(num_devices)] for _ in range(units.num_units)]
    for u in range(units.num_units):
        for d in range(num_devices):
            seconds = times.of(kind, d)
            for variant, keys in choices[u][d].items():
                each[u][d][variant] = sum(seconds[k] for k in keys)
            if each[u][d]:
                best[u][d] = min(each[u][d].values())
    return best, each


def _placing(units: Units, candidate: Candidate, backend_list: Sequence[Backend], num_devices: int,
             capabilities: Capabilities | None) -> tuple[Callable[[OpInfo], int], list[Backend], set[str]]:
    """The op placement, the backends forming only the chosen regions, and their anchors, of a
    ``candidate`` (a device and a variant per unit)."""
    assignment = list(candidate.assignment)
    anchors = {
        part.anchor for u, variant in enumerate(candidate.variants) if variant != TVM
        for part in units.variants[u][variant] if part.anchor is not None
    }
    backends = [ChosenRegions(b, [d for d in range(num_devices) if b.runs_on(d)], anchors)
                for b in backend_list if any(v == b.name for v in candidate.variants)]

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

    return choose, backends, anchors


def _every_region_on(device: int, apart, variants_of) -> Candidate:
    """Everything on ``device`` with every region the backends form there (the default build's
    choice on one device)."""
    assignment = [device] * len(apart)
    variants = every_region(assignment, apart)
    label = f"all on device {device}" + (", every region" if variants != variants_of(assignment) else "")
    return Candidate(label, assignment, variants)


def _decision_key(model: CostModel, plan_key: str, objective: str, min_gain: float, settings: list[str]) -> str:
    """What a judged decision depends on: the module, the unit model's content (every cost), the
    objective, ``min_gain`` and the devices' settings (block times are kept under them)."""
    doc = json.dumps([JUDGE_VERSION, plan_key, _model_doc(model, objective), min_gain, settings], default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


#: Changes whenever :func:`.as_built.judge_candidates` decides differently (old decisions unused).
JUDGE_VERSION = 4  # 4: the one judgement (placement_judgement.py): a tie goes to the single device


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
    """What the units depend on: the prepared module (its constants by shape and type: their values
    change no kernel, and hashing hundreds of MiB of weights cost a rebuild 0.25 s), the
    parameters' names and types, the targets, the backends and where they run."""
    module_hash = tvm_ffi.structural_hash(prepared, skip_tensor_content=True) & 0xFFFFFFFFFFFFFFFF
    doc = [
        ANALYSIS_VERSION, entry, f"{module_hash:016x}",
        sorted((k, list(np.shape(v)), str(getattr(v, "dtype", ""))) for k, v in (params or {}).items()),
        [str(t) for t in targets],
        [(b.name, type(b).__name__, sorted(d for d in range(len(targets)) if b.runs_on(d))) for b in backend_list],
    ]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def _solve(model: CostModel, objective: str, cache: CostCache):
    """:func:`.solver.solve`, its answer kept in ``cache`` under the cost model's content (the
    solver is deterministic, so the same model always gets the same answer)."""
    key = hashlib.sha256(json.dumps(_model_doc(model, objective), default=str).encode()).hexdigest()
    placement = cache.get_plan("solution", key)
    if placement is not None and len(placement) == model.num_kernels and model.feasible(placement):
        return Solution(list(placement), simulate(model, placement))
    solution = solve(model, objective)
    cache.put_plan("solution", key, solution.placement)
    return solution


def _model_doc(model: CostModel, objective: str) -> list:
    """The cost model's content (what the solver's answer depends on), as JSON-able data."""
    return [objective, model.kernel_cost, model.preds, model.out_bytes, model.copy_latency,
            model.copy_seconds_per_byte, model.call_latency, model.shares_memory, model.sync_latency,
            model.alone_cost, model.spin_window]


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


def _copy_cost(measurer: Measurer, cache: CostCache, devices, options, a: int, b: int) -> tuple[float, float]:
    src, dst = settings_key(devices[a], options[a]), settings_key(devices[b], options[b])
    fixed = cache.get("copy_latency", src, dst, "")
    slope = cache.get("copy_per_byte", src, dst, "")
    if fixed is None or slope is None:
        fixed, slope = measurer.copy_cost(devices[a], devices[b])
        cache.put("copy_latency", src, dst, "", fixed)
        cache.put("copy_per_byte", src, dst, "", slope)
    return fixed, slope


def _optional_timing(measurer: Measurer, cache: CostCache, kind: str, devices, options, *where: int) -> float:
    """Seconds of the measurer's optional timing ``kind`` (a method of that name) on device
    ``where[0]`` (or from ``where[0]`` to ``where[1]``), cached under the devices' settings; 0 for
    a measurer that does not time it:

    - ``call_latency(device, options)``: one call into the device (a remote one: an RPC round trip);
    - ``sync_latency(src, dst, src_options, dst_options)``: from a kernel's end on ``src`` until
      ``dst`` waiting for it runs;
    - ``spin_window(device, options)``: how long the device's executor spins in a wait before it
      sleeps."""
    keys = [settings_key(devices[d], options[d]) for d in where] + [""]
    seconds = cache.get(kind, keys[0], keys[1], "")
    if seconds is None:
        timer = getattr(measurer, kind, None)
        if timer is None:
            return 0.0
        seconds = float(timer(*[devices[d] for d in where], *[options[d] for d in where]))
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"measurer: {kind} of {' -> '.join(name_of(devices[d]) for d in where)} is {seconds}")
        cache.put(kind, keys[0], keys[1], "", seconds)
    return seconds
