"""The build driver: what ``tvm_hetero.build`` does around the compiler, in one place.

Routing: targets with a device whose kind record names a ``verifier`` (an accelerator reached
through a vendor's SDK) build through it: it builds, checks what the vendor computes against the
CPU and moves back what is wrong (:mod:`tvm_hetero.ep_offload.verified_build` for the first).
Other builds: with ``placement="auto"`` the runtime's measurer is handed to the compiler's
placement; the built graph is measured, and the split is kept only if it measures faster than the
best single device (:func:`_one_device_if_faster`, judged the one way every placement is:
:func:`tvm_hetero.placement_judgement.judge`, here on measured figures). A
QDQ model's report says how its units ran. The artifact itself is :mod:`tvm_hetero.artifact`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import tvm

from .artifact import Artifact, sha256
from .compiler import build as compiler_build
from .compiler.build import device_name
from .devices import is_remote, parse_spec
from .graph import COPY_FUNC
from .placement_judgement import MEASURED, Cost, judge


def _verifier(targets: Any) -> tuple[Any, Any] | None:
    """``(kind record, build function)`` of the first device in ``targets`` whose kind names a
    verifier, or None (malformed targets are the compiler's to report)."""
    from .kind_record import resolve

    if isinstance(targets, str):
        return None
    try:
        specs = [parse_spec(t) for t in targets]
    except (TypeError, ValueError):
        return None
    for spec in specs:
        record = spec.kind.record
        if record is not None and record.verifier is not None:
            return record, resolve(record.verifier)
    return None


@functools.wraps(compiler_build.build)
def build(mod: Any, targets: Any, placement: Any = None, *args: Any, **kwargs: Any) -> Artifact:
    auto = isinstance(placement, str) and placement == "auto"
    verifier = _verifier(targets)
    if verifier is not None:
        record, verify = verifier
        if auto and len(targets) > 2:
            raise ValueError(f"placement='auto' with a {record.name} device weighs each of its groups against one host "
                             f"device: give the host and the {record.display_name} ({len(targets)} targets given)")
        return verify(mod, targets, None if auto else placement, args, kwargs, Artifact.of, auto=auto)
    if auto and kwargs.get("measurer") is None:  # automatic placement times kernels on this runtime
        from .placement_measurer import RuntimeMeasurer

        kwargs["measurer"] = RuntimeMeasurer(kwargs.get("progress"))
    artifact = Artifact.of(compiler_build.build(mod, targets, placement, *args, **kwargs))
    report = artifact.build_report
    measure_latency = getattr(kwargs.get("measurer"), "latency_seconds", None)
    if auto and report is not None and report.autoplace is not None and measure_latency is not None:
        report.autoplace.measured_seconds, report.autoplace.measured_cached = _built_graph_latency(
            artifact, measure_latency, kwargs)
        artifact = _one_device_if_faster(artifact, mod, targets, args, kwargs, measure_latency)
    _note_qdq_units(artifact, mod, kwargs.get("entry", "main"))
    return artifact


def _note_qdq_units(artifact: Artifact, mod: Any, entry: str) -> None:
    """A QDQ model's report says how its units ran (int8, float in a block, TVM fallback)."""
    from .backends.dnnl_int8 import qdq_report

    report = artifact.build_report
    if report is None or not isinstance(mod, tvm.IRModule) or entry not in [g.name_hint for g in mod.get_global_vars()]:
        return
    docs = [m.inspect_source() for m in _all_imports(artifact.lib) if m.kind == "tvm_hetero_dnnl"]
    nodes = [n.get("attrs", {}).get("func_name", "") for n in json.loads(artifact.graph_json)["nodes"]]
    line = qdq_report(mod, docs, nodes, entry)
    if line is not None:
        report.backend_notes.append(line)


def _all_imports(lib: Any) -> list[Any]:
    out, todo = [], list(lib.imports)
    while todo:
        m = todo.pop()
        out.append(m)
        todo.extend(m.imports)
    return out


def _built_graph_latency(artifact: Artifact, measure_latency: Any, kwargs: dict) -> tuple[float, bool]:
    """A built graph's measured latency and whether it came from the cost cache, where it is kept
    under the module, the graph and the executor settings (the same graph is measured once)."""
    from .compiler.autoplace.cost_cache import open_cache

    options = kwargs.get("device_options")
    module_key = artifact.build_report.autoplace.module_key
    key = sha256(json.dumps([module_key, artifact.graph_json, options], sort_keys=True).encode())
    cache = open_cache(kwargs.get("cost_cache"))
    try:
        seconds = cache.get("graph_latency", key, "", "")
        if seconds is not None:
            return seconds, True
        (kwargs.get("progress") or (lambda _msg: None))("automatic placement: measuring the built graph")
        seconds = measure_latency(artifact, options)
        cache.put("graph_latency", key, "", "", seconds)
        return seconds, False
    finally:
        cache.close()


def _one_device_if_faster(artifact: Artifact, mod: Any, targets: Any, args: tuple, kwargs: dict,
                          measure_latency: Any) -> Artifact:
    """The build checks its own choice: a split over devices is kept only if it measures faster than
    the default build with everything on the local device predicted best (the prediction, judged
    on kernels and blocks, can still miss what only a run shows), judged by
    :func:`~tvm_hetero.placement_judgement.judge` (a tie goes to the one device). Otherwise that build is returned,
    its report saying why. The verdict is kept in the cost cache under the decision's key, so a
    rebuild makes the same choice with one build."""
    from .compiler.autoplace.cost_cache import open_cache
    from .compiler.autoplace.explanation import OneDeviceCheck
    from .compiler.autoplace.measured import MEASURED_CHECK

    auto = artifact.build_report.autoplace
    if len(set(_computing_devices(artifact))) <= 1:
        return artifact  # one device: the judge compared it with the others as built
    cache = open_cache(kwargs.get("cost_cache"))
    try:
        verdict = cache.get_plan(MEASURED_CHECK, auto.decision_key)
    finally:
        cache.close()
    if verdict is not None:  # this split was checked before and won (else it would not be built)
        auto.one_device_check = OneDeviceCheck(**dict(verdict["check"], cached=True))
        return artifact
    local = [d for d, dev in enumerate(artifact.devices) if not is_remote(dev)]
    singles = auto.single_device  # per device, its best single-device prediction
    predicted = {d: singles[d].seconds for d in local if d in singles}
    if not predicted:
        return artifact
    device = min(predicted, key=predicted.__getitem__)
    hand = {k: v for k, v in kwargs.items() if k not in ("objective", "cost_cache", "capabilities", "measurer")}
    one = Artifact.of(compiler_build.build(mod, targets, lambda _info, d=device: d, *args, **hand))
    if one.graph_json == artifact.graph_json:
        return artifact
    one.build_report.autoplace = auto
    seconds, _cached = _built_graph_latency(one, measure_latency, kwargs)
    name = device_name(artifact.devices[device])
    verdict = judge(Cost(auto.measured_seconds, MEASURED, "as built"), Cost(seconds, MEASURED, "the default build"),
                    candidate_name="the split", baseline_name=f"all on {name}")
    kept = not verdict.kept
    auto.one_device_check = OneDeviceCheck(name, seconds, auto.measured_seconds, kept, verdict.explain())
    cache = open_cache(kwargs.get("cost_cache"))
    try:
        cache.put_plan(MEASURED_CHECK, auto.decision_key,
                       {"device": device if kept else None, "check": dataclasses.asdict(auto.one_device_check)})
    finally:
        cache.close()
    if not kept:
        return artifact
    # The report now describes the one-device build: its prediction (as built, every region) and
    # measurement; the split's stay in the check's line.
    auto.one_device_check.split_predicted_seconds = auto.predicted_seconds
    auto.predicted_seconds = singles[device].seconds
    auto.measured_seconds = seconds
    auto.as_built = None
    one.build_report.backend_notes = artifact.build_report.backend_notes
    return one


def _computing_devices(artifact: Artifact) -> list[int]:
    """The device of every node that computes (not an input, not a copy)."""
    graph = artifact.graph
    devices = graph["attrs"]["device_index"][1]
    return [devices[i] for i, node in enumerate(graph["nodes"])
            if node["op"] != "null" and node.get("attrs", {}).get("func_name") != COPY_FUNC]


