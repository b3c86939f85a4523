"""Verified offload: no region an accelerator runs reaches a user without being checked.

The build for targets with a device reached through a vendor's SDK (the kind record's ``verifier``).
Algorithm (each round builds once):
1. Build. If the vendor refuses a region when finalizing its graph, that region's ops are kept off
   the device (with the vendor's reason) and the round ends.
2. Run the artifact once on sample inputs (the user's ``calibration`` data, else seeded random
   values) with every region checked against ONNX Runtime's CPU EP in fp32 on the very inputs it
   received (:mod:`.region_runner`). A region is bad when its error relative to the largest
   reference value exceeds the tolerance, or when it yields non-finite values where the CPU does not
   (fp16 overflow beyond 65504).
3. A bad region of several steps moves back the fewest ops that :mod:`.fewest_ops` can tell: each
   step's own error (fed the CPU's inputs) and inherited error are measured in one vendor call, the
   steps that fail alone move back, else the steps where error builds up; for up to
   ``FEWEST_OPS_ROUNDS`` rounds. With ``offload_move_back="first_bad_step"`` (the earlier rule, kept
   to compare) its graph is run once more with every intermediate value as an output and the first
   step whose value is off is kept off the device, for up to ``LOCALIZED_ROUNDS`` rounds (also where
   :mod:`.fewest_ops` cannot tell, and for an fp16 underflow, which is the inputs' scale, not one
   op's). When neither can tell, or after those rounds, the whole region is kept off. Then the next
   round.

For a device whose ``precision`` the build quantizes for (``"a16w8"``), step 1 is two builds: one
that records every region's inputs over the calibration data, then the device's, each region
quantized on its own inputs (:mod:`.region_quantization`). Step 3 moves such a region back whole:
its steps, run one by one in float on the device, would not say which quantized step is off.

Guarantee: every round keeps at least one more op off the device, so the loop ends; the artifact
returned has every region verified on the sample inputs in its last round, and the report names
each region's error, each op moved back and why, and each round's FLOPs on the device against its
worst error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..compiler import build as compiler_build
from ..graph import Graph
from ..kind_record import resolve
from ..sample_inputs import sample_values
from . import region_quantization
from .backend import RegionRefused
from .capability_probe import FP16_SMALLEST_NORMAL, underflow_hint
from .fewest_ops import attribute, choose
from .offload_report import MoveBack, MovedStep, MoveRound, OffloadReport, RegionCheck, Verification
from .onnx_regions import step_of_node
from .sdk import cpu_session
from .vendor_process import vendor_call

#: Relative tolerance of an fp16 region (to the largest reference value).
FP16_TOLERANCE = 1e-2
#: ... and of a quantized one (int8 steps compound across a graph: a few steps of 1/256).
QUANTIZED_TOLERANCE = 5e-2
LOCALIZED_ROUNDS = 3
#: Verification rounds in which a bad region moves back only the steps :mod:`.fewest_ops` names.
FEWEST_OPS_ROUNDS = 8
#: How a bad region is narrowed down (``offload_move_back``): the fewest ops, or its first bad step.
MOVE_BACK_RULES = ("fewest", "first_bad_step")
#: A group of fewer conv/matmul FLOPs than this (``offload_min_group_flops``) whose ops make fewer elements
#: than one graph call is worth (the backend's ``elements_per_call``) stays on the CPU, unless it is the
#: build's largest. By default that is a group with no conv/matmul work and little else (a join, an
#: embedding lookup): its graph call costs more than the host doing that work, and the device would
#: wait for the host's inputs. Every other group goes to the device; ``placement="auto"``
#: weighs each group's call against the host instead; ``offload_min_group_flops=0`` keeps every group.
MIN_GROUP_FLOPS = 1.0


def build_verified(mod: Any, targets: Any, placement: Any, args: tuple, kwargs: dict,
                   wrap: Callable[[Any], Any], auto: bool = False) -> Any:
    """``tvm_hetero.build`` for targets with an offload device (see the module's algorithm); ``wrap``
    makes the artifact of what the compiler built (``Artifact.of``: the build driver calls this one).
    ``auto``: each verified group stays on the device only where it is predicted faster there than
    on the host (:mod:`.auto_placement`), instead of the fixed gate on small groups."""
    calibration = kwargs.pop("calibration", None)
    tolerance = kwargs.pop("offload_tolerance", None)
    verify = kwargs.pop("verify_offload", True)
    min_group_flops = float(kwargs.pop("offload_min_group_flops", MIN_GROUP_FLOPS))
    say: Callable[[str], None] = kwargs.get("progress") or (lambda _msg: None)
    exclude: dict[str, str] = dict(kwargs.pop("offload_exclude", None) or {})
    rule = kwargs.pop("offload_move_back", "fewest")
    if rule not in MOVE_BACK_RULES:
        raise ValueError(f"offload_move_back={rule!r}: expected one of {', '.join(MOVE_BACK_RULES)}")
    # Each verification round's FLOPs on the device against its worst error, and each step moved back.
    move_back = MoveBack(rule)
    build_up_attempts = 0

    calibrated = _calibrated(targets)
    host_target = _host_target(targets) if auto else None
    rounds, gated, decided = 0, auto, None  # automatic placement replaces the gate
    while True:
        rounds += 1
        try:
            if calibrated:  # the regions quantized by the build: calibrated first (region_quantization.py)
                say("calibration: the graph's regions run in fp32 on the calibration inputs")
                feeds = _record_region_inputs(mod, targets, placement, args, kwargs, exclude, wrap, calibration)
                with region_quantization.quantizing(feeds):
                    compiled = compiler_build.build(mod, targets, placement, *args, offload_exclude=exclude, **kwargs)
            else:
                compiled = compiler_build.build(mod, targets, placement, *args, offload_exclude=exclude, **kwargs)
        except RegionRefused as refused:
            say(f"{refused.vendor} refused graph {refused.region.name} at finalize; its ops stay on the CPU")
            for key in refused.bindings or []:
                exclude[key] = f"{refused.vendor} refused its graph at finalize: {refused.reason}"
            if not refused.bindings:
                raise
            continue
        artifact = wrap(compiled)
        offload = artifact.build_report.offload if artifact.build_report else None
        if offload and decided is not None:
            offload.auto = decided
        if offload and move_back.rounds and not offload.regions:  # verification moved every graph back
            move_back.rounds.append(MoveRound(rounds, 0, 0.0, offload.flops, 0.0, 0))
            offload.move_back = move_back
        if not verify or not offload or not offload.regions:
            return artifact
        # The gate runs once, on the first build the vendor finalizes whole: moving a group back re-forms the
        # others, and gating those again would eat the graph from its edges.
        if not gated and min_group_flops > 0:
            gated = True
            if _gate_small_groups(offload, exclude, min_group_flops):
                say(f"small {offload.device} groups stay on the CPU; building again")
                continue
        tol = tolerance if tolerance is not None else (
            FP16_TOLERANCE if offload.options.get("precision") == "fp16" and not _quantized(offload) else QUANTIZED_TOLERANCE)
        inputs = _sample_inputs(artifact, calibration)
        say(f"verifying {len(offload.regions)} {offload.device} graph(s) against the CPU")
        checks = _verify(artifact, inputs)
        results = []
        bad = []
        for region in offload.regions:
            check = checks.get(region.name)
            ok = check is not None and check.finite and check.relative_error <= tol
            results.append(RegionCheck(region.name, region.ops, ok,
                                       float(check.relative_error) if check else float("nan"),
                                       bool(check.finite) if check else False,
                                       float(check.reference_scale) if check else float("nan"),
                                       _underflow(check, offload)))
            if not ok:
                bad.append((region, check))
        offload.quantized = _quantized(offload)
        offload.verification = Verification(tol, rounds, results,
                                            "calibration data" if calibration is not None else "seeded random inputs")
        move_back.rounds.append(MoveRound(rounds, len(offload.regions), offload.flops_on_device, offload.flops,
                                          max((r.relative_error for r in results), default=0.0), len(bad)))
        offload.move_back = move_back
        if not bad:
            if offload.costs:
                cycles = sum(c.cycles for c in checks.values() if c.cycles == c.cycles)
                offload.modeled = resolve(offload.costs + ":modeled")(offload.options, cycles, offload.graph_executions)
            if auto and decided is None:
                from .auto_placement import decide

                say(f"automatic placement: each {offload.device} group's call against the host computing it")
                decided = offload.auto = decide(artifact, offload, checks, host_target)
                slower = [choice for choice in decided if not choice.on_device]
                for choice in slower:
                    for key in offload.region(choice.region).bindings:
                        exclude[key] = f"auto: {choice.verdict.explain()}"
                if slower:
                    continue
            return artifact
        before = len(exclude)
        for region, check in bad:
            reason = (f"verification: {underflow_hint(check.reference_scale)} (relative error "
                      f"{check.relative_error:.2e} > {tol:g})" if _underflow(check, offload)
                      else f"verification: relative error {check.relative_error:.2e} > {tol:g}" if check and check.finite
                      else f"verification: non-finite values on the {offload.device} (fp16 overflow)" if check
                      else "verification: the region did not run")
            keys = region.bindings
            localizable = not region_quantization.quantizes(offload.options)  # its steps are float ops
            # An underflow is the inputs' scale, not one op's (every step computes ~0): no attribution.
            if (rule == "fewest" and localizable and len(move_back.rounds) <= FEWEST_OPS_ROUNDS and check is not None
                    and len(keys) > 1 and not _underflow(check, offload)):
                chosen = _fewest_ops(region.name, artifact, check, offload, tol, exclude, build_up_attempts + 1)
                if chosen:
                    build_up_attempts += any(row.rule == "build-up" for row in chosen)
                    for row in chosen:
                        exclude.update(dict.fromkeys(row.bindings, row.reason))
                    move_back.steps.extend(chosen)
                    say(f"{offload.device} graph {region.name} failed verification ({reason}); "
                        f"{sum(len(row.bindings) for row in chosen)} op(s) of {len(chosen)} step(s) move back to the CPU")
                    continue
            # The earlier rule, also where the fewest ops cannot be told (the vendor would not run the cut graph).
            if rounds <= LOCALIZED_ROUNDS and check is not None and len(keys) > 1 and localizable:
                step = _first_bad_step(region.name, artifact.offload_references.get(region.name), check.feeds,
                                       offload, tol)
                steps = _steps_of(artifact, region.name)
                if step is not None and steps and step < len(steps):
                    keys = steps[step]
            if not set(keys) - set(exclude):  # the localized step is off already: the whole region
                keys = region.bindings
            for key in keys:
                exclude[key] = reason
            move_back.steps.append(MovedStep(region.name, None, [], list(keys), reason,
                                             "whole region" if keys == region.bindings else "first bad step"))
            say(f"{offload.device} graph {region.name} failed verification ({reason}); "
                f"{len(keys)} op(s) move back to the CPU")
        if len(exclude) == before:  # nothing more can move: never loop, never return an unverified region
            raise RuntimeError(f"{offload.device} verification failed for {[r.name for r, _c in bad]} and their ops cannot be "
                               "moved back to the CPU (their bindings are unknown)")


def _calibrated(targets: Any) -> bool:
    """Whether a device among ``targets`` has its regions quantized by the build."""
    from ..devices import parse_spec

    return any(region_quantization.quantizes(parse_spec(t).options) for t in targets)


def _record_region_inputs(mod: Any, targets: Any, placement: Any, args: tuple, kwargs: dict, exclude: dict,
                          wrap: Callable[[Any], Any], calibration: Any) -> dict:
    """The calibration build (region_quantization.py, step 1): every region's inputs over every
    calibration input (the user's ``calibration`` data, else one seeded random input)."""
    with region_quantization.recording() as feeds:
        artifact = wrap(compiler_build.build(mod, targets, placement, *args, offload_exclude=exclude, **kwargs))
        samples = list(calibration) if isinstance(calibration, (list, tuple)) else [calibration]
        runtime = artifact.create(execution="serial")
        try:
            for sample in samples:
                for name, value in _sample_inputs(artifact, sample).items():
                    runtime.set_input(name, value)
                runtime.run()
        finally:
            runtime.close()
    return feeds


def _host_target(targets: Any) -> Any:
    """The first target that runs TVM kernels (the host the device's groups are weighed against)."""
    from ..devices import parse_spec, runs_tvm_kernels

    for target in targets:
        if runs_tvm_kernels(parse_spec(target).device):
            return target
    raise ValueError("placement='auto' with an offload device needs a host device that runs TVM kernels in targets")


def _gate_small_groups(offload: OffloadReport, exclude: dict[str, str], min_flops: float) -> bool:
    """Keep groups below ``min_flops`` and below a call's worth of elements off the device (never
    the largest); whether any moved."""
    per_call = offload.elements_per_call

    regions = offload.regions
    if len(regions) < 2:
        return False
    largest = max(regions, key=lambda r: (r.flops, r.ops))
    moved = False
    for region in regions:
        if region is largest or region.flops >= min_flops or region.elements >= per_call:
            continue
        for key in region.bindings:
            work = (f"a group of {region.flops / 1e6:.1f} MFLOP" if region.flops
                    else "a group with no conv/matmul work")
            exclude[key] = f"gate: {work} is not worth a {offload.vendor} graph call (a fixed cost per call)"
            moved = True
    return moved


def _underflow(check: Any, offload: OffloadReport) -> bool:
    """An fp16 region whose every reference value is below fp16's normal range (it computes ~0)."""
    return (check is not None and check.finite and offload.options.get("precision") == "fp16"
            and check.reference_scale < FP16_SMALLEST_NORMAL)


def _quantized(offload: OffloadReport) -> bool:
    if region_quantization.quantizes(offload.options):
        return True
    return any(r.op in ("relax.quantize", "relax.dequantize") for r in offload.refused) or any(
        "quantize" in key for region in offload.regions for key in region.bindings)


def _steps_of(artifact: Any, region: str) -> list[list[str]] | None:
    """Per step of a device's block, the bindings it covers (None when unknown)."""
    steps = artifact.build_report.offload.steps.get(region) if artifact.build_report.offload else None
    return steps


def _sample_inputs(artifact: Any, calibration: Any) -> dict[str, np.ndarray]:
    if calibration is not None:
        first = calibration[0] if isinstance(calibration, (list, tuple)) else calibration
        return {k: np.asarray(v) for k, v in first.items()}
    found = Graph.from_json(artifact.graph_json).inputs().items()
    return sample_values({name: spec for name, spec in found
                          if name in artifact.input_names and name not in artifact.params}, default_bound=8)


def _verify(artifact: Any, inputs: dict[str, np.ndarray]) -> dict:
    from .region_runner import verifying

    with verifying(artifact.offload_references, profile=True) as results:
        runtime = artifact.create(execution="serial")
        try:
            for name, value in inputs.items():
                runtime.set_input(name, value)
            runtime.run()
        finally:
            runtime.close()
    return dict(results)


def _fewest_ops(region: str, artifact: Any, check: Any, offload: OffloadReport, tol: float, exclude: dict[str, str],
                attempt: int) -> list[MovedStep]:
    """The steps of a bad region :mod:`.fewest_ops` moves back, each with its errors and reason; none
    when it cannot tell or names nothing new."""
    steps = _steps_of(artifact, region)
    if not steps:
        return []
    errors = attribute(region, artifact.offload_references.get(region), check.feeds, offload)
    if errors is None:
        return []
    movable = {s for s, keys in enumerate(steps) if set(keys) - set(exclude)}
    chosen = choose(errors, tol, attempt, movable)
    by_step = {e.step: e for e in errors}
    return [MovedStep(region, s, by_step[s].ops, list(steps[s]), chosen.reasons[s], chosen.rule, by_step[s].own,
                      by_step[s].inherited) for s in chosen.steps if s < len(steps)]


def _first_bad_step(region: str, model: bytes | None, feeds: dict | None, offload: OffloadReport, tol: float) -> int | None:
    """The first step of a region's graph whose value is off on the device (every intermediate value
    compared with the CPU's; the device's run where the device runs its graphs), or None when that
    cannot be told."""
    if model is None or not feeds:
        return None
    try:
        import onnx

        proto = onnx.shape_inference.infer_shapes(onnx.load_from_string(model))
        known = {v.name for v in proto.graph.output}
        for info in proto.graph.value_info:
            if info.name not in known:
                proto.graph.output.append(info)
        debug = proto.SerializeToString()
        names = [o.name for o in proto.graph.output]
        cpu = cpu_session(debug).run(names, feeds)
        device = vendor_call(offload.sdk, offload.process, offload.options, "accelerator_outputs",
                             region, debug, feeds, names)
    except Exception:  # noqa: BLE001 (a graph the vendor will not take with extra outputs: no localization)
        return None
    step_of = {node.output[0]: step_of_node(node.name) for node in proto.graph.node
               if node.output and step_of_node(node.name) is not None}
    for name, expected, got in sorted(zip(names, cpu, device), key=lambda t: step_of.get(t[0], 1 << 30)):
        where = np.isfinite(expected)
        if not where.any():
            continue
        scale = max(float(np.abs(expected[where]).max()), 1e-30)
        diff = np.abs(got[where].astype("float64") - expected[where])
        if not np.isfinite(diff).all() or float(diff.max()) / scale > tol:
            return step_of.get(name)
    return None
