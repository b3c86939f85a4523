"""Automatic placement by measured cost: lower once, measure every candidate kernel on every
device allowed to run it, solve for the whole inference, and hand the lowering a placement.

Steps (:func:`choose_placement`):

1. lower the module once with every op on device 0 to find the fused kernels (fusion never crosses
   devices, so these are the finest kernels any placement makes) -- :mod:`.kernel_graph`;
2. for every device and every kernel it may run (capability table), look the cost up in the
   :mod:`.cost_cache` (key: the kernel's structural hash, the target, the device and its executor
   settings) and measure only what is missing, through a :class:`Measurer` (the runtime side does
   the timing; this package never imports the runtime);
3. copy costs per ordered device pair that does not share memory (fixed + per byte), the same way;
4. :func:`.solver.solve` on the :class:`~tvm_hetero.compiler.schedule_model.CostModel`; a split
   over several devices predicted less than ``min_gain`` (5%) faster than the best single device
   gives way to that device (its gain would be within the model's unmodelled costs and the noise);
5. every op gets its kernel's device; an op folded at build time (no kernel) goes with the kernel
   that reads it, or to the first device allowed to run it.

The decision, its alternatives and the largest single choices are returned as a plain dict (it
goes into the build report and the artifact's manifest); :mod:`.report` writes it out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import tvm

from ..lower import lower_to_graph
from ..placement import Capabilities, OpInfo
from ..schedule_model import CostModel, simulate
from .cost_cache import CostCache, settings_key
from .kernel_graph import KernelGraph, kernel_graph, kernel_key, op_allowed
from .solver import OBJECTIVES, single_device_placements, solve

#: A split over devices must be predicted this much faster than the best single device to be used:
#: every cross-device edge costs a wake-up the model does not charge, and costs measured on a
#: loaded machine carry a few percent of noise.
MIN_GAIN = 0.05


@dataclass
class KernelCall:
    """One kernel to time: its name in the module handed over, and its arguments' types."""

    func_name: str
    input_types: list[tuple[tuple[int, ...], str]]
    output_types: list[tuple[tuple[int, ...], str]]


@dataclass
class MeasureJob:
    """The kernels to time on one device: ``kernels`` holds every function ``calls`` names."""

    position: int
    kernels: tvm.IRModule
    calls: list[KernelCall]
    device: tvm.runtime.Device
    target: tvm.target.Target
    options: dict | None


class Measurer(Protocol):
    """What the runtime side provides (tvm_hetero.runtime.autoplace_measure.RuntimeMeasurer)."""

    def kernel_seconds(self, jobs: Sequence[MeasureJob]) -> list[list[float]]:
        """Seconds of every call of every job (all devices in one call, so that a measurer can
        interleave them and every device sees the same load)."""
        ...

    def copy_cost(self, src: tvm.runtime.Device, dst: tvm.runtime.Device) -> tuple[float, float]: ...


@dataclass
class AutoPlacement:
    """The outcome: a per-op placement for the lowering, and the explanation."""

    choose: Callable[[OpInfo], int]
    explanation: dict[str, Any] = field(default_factory=dict)
    model: CostModel | None = None
    kernel_devices: list[int] = field(default_factory=list)
    #: What measured the costs (the build also asks it for the built graph's latency).
    measurer: Any = None
    #: The kernel DAG decided on, and the ops it was lowered from (to predict other placements).
    kernels: KernelGraph | None = None
    ops: list[OpInfo] = field(default_factory=list)

    def kernel_assignment(self, placement: Callable[[OpInfo], int]) -> list[int]:
        """The device of every kernel under an op ``placement`` (that of its first op), to predict it."""
        devices: list[int] = [0] * self.kernels.num_kernels
        seen = [False] * self.kernels.num_kernels
        for info in self.ops:
            kernel = self.kernels.op_kernel[info.index]
            if kernel is not None and not seen[kernel]:
                devices[kernel], seen[kernel] = int(placement(info)), True
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
) -> AutoPlacement:
    """Measure and solve (see the module docstring). A placement over several devices is kept
    only if it is predicted at least ``min_gain`` (relative) faster than the best single device."""
    if objective not in OBJECTIVES:  # before any measuring
        raise ValueError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    say = progress or (lambda _msg: None)
    num_devices = len(devices)
    options = list(device_options or []) + [None] * num_devices
    ops: list[OpInfo] = []

    def record(info: OpInfo) -> int:
        ops.append(info)
        return 0

    say("automatic placement: lowering once to find the kernels")
    lowered = lower_to_graph(mod, record, num_devices, params, entry, targets=targets, track_ops=True)
    kernels = kernel_graph(lowered, ops, num_devices, capabilities)
    keys = [kernel_key(lowered.kernels[name]) for name in kernels.func_names]
    cost = [[math.inf] * num_devices for _ in range(kernels.num_kernels)]
    counts = {"measured": 0, "cached": 0}
    jobs: list[MeasureJob] = []
    job_keys: list[list[str]] = []
    settings = [settings_key(str(device), options[d]) for d, device in enumerate(devices)]
    for d, device in enumerate(devices):
        wanted = {keys[k] for k in range(kernels.num_kernels) if kernels.allowed[k][d]}
        missing: dict[str, int] = {}  # key -> a kernel with it
        for k in range(kernels.num_kernels):
            if kernels.allowed[k][d] and cache.get("kernel", keys[k], str(targets[d]), settings[d]) is None:
                missing.setdefault(keys[k], k)
        counts["cached"] += len(wanted) - len(missing)
        if missing:
            calls = [_kernel_call(lowered, kernels, k) for k in missing.values()]
            names = {c.func_name for c in calls}
            module = tvm.IRModule({gv: f for gv, f in lowered.kernels.functions.items() if gv.name_hint in names})
            jobs.append(MeasureJob(d, module, calls, device, targets[d], options[d]))
            job_keys.append(list(missing))
    if jobs:
        say("automatic placement: measuring " + ", ".join(
            f"{len(job.calls)} kernels on {job.device}" for job in jobs) + f" ({counts['cached']} cached)")
        measured = measurer.kernel_seconds(jobs)
        if len(measured) != len(jobs):
            raise ValueError(f"measurer answered for {len(measured)} devices, asked for {len(jobs)}")
        for job, job_times, key_list in zip(jobs, measured, job_keys):
            bad = len(job_times) != len(key_list) or not all(math.isfinite(t) and t >= 0 for t in job_times)
            if bad:
                raise ValueError(f"measurer on {job.device}: expected {len(key_list)} finite non-negative "
                                 f"times, got {list(job_times)[:8]}")
            for key, seconds in zip(key_list, job_times):
                cache.put("kernel", key, str(targets[job.position]), settings[job.position], seconds)
            counts["measured"] += len(key_list)
    for d in range(num_devices):
        for k in range(kernels.num_kernels):
            if kernels.allowed[k][d]:
                cost[k][d] = cache.get("kernel", keys[k], str(targets[d]), settings[d])

    latency = [[0.0] * num_devices for _ in range(num_devices)]
    per_byte = [[0.0] * num_devices for _ in range(num_devices)]
    shared = [[a == b or bool(shares_memory(a, b)) for b in range(num_devices)] for a in range(num_devices)]
    for a in range(num_devices):
        for b in range(num_devices):
            if not shared[a][b]:
                latency[a][b], per_byte[a][b] = _copy_cost(measurer, cache, devices, options, a, b)
    model = CostModel(cost, kernels.preds, kernels.out_bytes, latency, per_byte, [0.0] * num_devices, shared)
    say(f"automatic placement: solving for {kernels.num_kernels} kernels on {num_devices} devices")
    solution = solve(model, objective)
    assignment = solution.placement
    single = min(single_device_placements(model), key=lambda p: simulate(model, p).makespan, default=None)
    kept_single = False
    split_too_small = (
        single is not None and len(set(assignment)) > 1 and objective == "latency"
        and simulate(model, assignment).makespan > (1.0 - min_gain) * simulate(model, single).makespan
    )
    if split_too_small:
        assignment, kept_single = single, True

    def choose(info: OpInfo) -> int:
        if info.index >= len(kernels.op_kernel):
            raise ValueError(f"automatic placement: {info} was not seen when the kernels were measured")
        kernel = kernels.op_kernel[info.index]
        if kernel is not None:
            return assignment[kernel]
        allowed = [d for d in range(num_devices) if capabilities is None or op_allowed(capabilities, info, d)]
        follows = kernels.op_follows[info.index]
        if follows is not None and assignment[follows] in allowed:
            return assignment[follows]
        return allowed[0] if allowed else 0

    explanation = _explain(model, kernels, assignment, [str(d) for d in devices], objective, counts)
    explanation["split_predicted_seconds"] = solution.latency if kept_single else None
    explanation["min_gain"] = min_gain
    return AutoPlacement(choose, explanation, model, assignment, measurer, kernels, ops)


def _kernel_call(lowered, kernels: KernelGraph, k: int) -> KernelCall:
    node = lowered.graph.nodes[kernels.node_ids[k]]
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


def alternatives(model: CostModel, kernels: KernelGraph) -> dict[str, float]:
    """Predicted latency of the placements a person would try: everything on one device (each
    that can run it all), and everything capable on each other device (the rest on device 0)."""
    n, num_devices = model.num_kernels, model.num_devices
    result: dict[str, float] = {}
    for d in range(num_devices):
        if model.feasible([d] * n):
            result[f"all on device {d}"] = simulate(model, [d] * n).makespan
    for d in range(1, num_devices):
        capable = [d if kernels.allowed[k][d] else 0 for k in range(n)]
        if capable != [d] * n and model.feasible(capable):
            result[f"everything capable on device {d}"] = simulate(model, capable).makespan
    return result


def _explain(model: CostModel, kernels: KernelGraph, assignment: list[int], device_names: list[str],
             objective: str, counts: dict[str, int]) -> dict[str, Any]:
    schedule = simulate(model, assignment)
    num_devices = model.num_devices
    per_device = []
    for d in range(num_devices):
        mine = [k for k, dev in enumerate(assignment) if dev == d]
        per_device.append({
            "device": device_names[d],
            "kernels": len(mine),
            "ops": sum(len(kernels.relax_ops[k]) for k in mine),
            "busy_seconds": sum(model.kernel_cost[k][d] for k in mine),
        })
    decisions = []
    for k, d in enumerate(assignment):
        others = [(model.kernel_cost[k][o], o) for o in range(num_devices) if o != d and math.isfinite(model.kernel_cost[k][o])]
        if not others:
            continue
        other_cost, other = max(others)
        decisions.append({
            "kernel": kernels.func_names[k], "index": k, "device": device_names[d],
            "seconds": model.kernel_cost[k][d], "other_device": device_names[other], "other_seconds": other_cost,
        })
    decisions.sort(key=lambda x: -abs(x["other_seconds"] - x["seconds"]))
    return {
        "objective": objective,
        "predicted_seconds": schedule.makespan,
        "measured_seconds": None,
        "remote_calls": schedule.remote_calls,
        "per_device": per_device,
        "alternatives": alternatives(model, kernels),
        "decisions": decisions[:5],
        "kernels_measured": counts["measured"],
        "kernels_cached": counts["cached"],
    }
