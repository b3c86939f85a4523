"""Stage specs: what each pipeline stage runs on, ``(device, target)``, from the forms users write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tvm

from ...backends import default_backends
from ...devices import default_target as kind_default_target
from ...devices import local_kind, parse_device, runs_tvm_kernels
from ..build import device_name, shares_memory_between

#: ``(device, target)`` pair, a device (``tvm.cpu(1)``, ``"cpu:1"``) or a target (``"llvm"``).
StageSpec = Any


def stage_spec(spec: StageSpec) -> tuple[tvm.runtime.Device, tvm.target.Target]:
    """``(device, target)`` from any :data:`StageSpec`; a device that runs no TVM kernels (an NPU
    driven through its vendor's graphs) cannot be a stage yet."""
    dev, target = _parse_stage_spec(spec)
    if not runs_tvm_kernels(dev):
        raise ValueError(f"{device_name(dev)} runs only its vendor's graphs, not TVM kernels: pipeline stages "
                         f"on it are not supported yet (tvm_hetero.build(mod, [(tvm.cpu(0), 'llvm'), "
                         f"'{local_kind(dev).name}']) runs a graph over the host and that device)")
    return dev, target


def _parse_stage_spec(spec: StageSpec) -> tuple[tvm.runtime.Device, Any]:
    if isinstance(spec, tuple) and len(spec) == 2:
        dev = parse_device(spec[0])
        target = spec[1] if isinstance(spec[1], tvm.target.Target) else tvm.target.Target(spec[1])
        return dev, target
    if isinstance(spec, (tvm.target.Target, Mapping)):
        target = spec if isinstance(spec, tvm.target.Target) else tvm.target.Target(dict(spec))
        return device_of(target), target
    if isinstance(spec, str):
        try:
            dev = parse_device(spec)
        except ValueError:
            target = tvm.target.Target(spec)
            return device_of(target), target
        return dev, default_target(dev)
    if isinstance(spec, tvm.runtime.Device):
        return spec, default_target(spec)
    raise TypeError(f"a stage is (device, target), a device or a target; got {spec!r}")


def default_target(dev: tvm.runtime.Device) -> tvm.target.Target | None:
    """The device kind's default target (``devices.default_target``); None for a kind without TVM kernels."""
    target = kind_default_target(dev)
    return tvm.target.Target(target) if target is not None else None


def target_label(target: str) -> str:
    """``llvm``, ``cuda``: the kind of a target string (``str(Target)`` is JSON in TVM 0.27)."""
    try:
        return tvm.target.Target(target).kind.name
    except Exception:  # noqa: BLE001  (a label only)
        return target


def device_of(target: tvm.target.Target) -> tvm.runtime.Device:
    kind = target.kind.name
    return tvm.cpu(0) if kind in ("llvm", "c") else tvm.runtime.device(kind, 0)


def stage_specs(stages: StageSpec | Sequence[StageSpec], num_stages: int | None) -> list[tuple[Any, Any]]:
    """One ``(device, target)`` per stage: a list gives one per stage, anything else is repeated."""
    if isinstance(stages, list):
        if num_stages is not None and len(stages) != num_stages:
            raise ValueError(f"{len(stages)} stage devices/targets for {num_stages} stages")
        if not stages:
            raise ValueError("stages: at least one stage is needed")
        return [_stage_spec_of(f"stage {s}", spec) for s, spec in enumerate(stages)]
    if num_stages is None:
        raise ValueError("give a list of stages, or the number of stages (split_points=int)")
    return [_stage_spec_of("every stage", stages)] * num_stages


def _stage_spec_of(which: str, spec: StageSpec) -> tuple[Any, Any]:
    """:func:`stage_spec`, its errors naming the stage (``which``)."""
    try:
        return stage_spec(spec)
    except ValueError as err:
        raise ValueError(f"{which}: {err}") from None


def stage_backends(backends: Sequence[Any] | None, specs: Sequence[tuple[Any, Any]]) -> Sequence[Any]:
    """``backends`` as given, or for None the default of ``tvm_hetero.build`` (``default_backends``:
    oneDNN on host CPUs when libtvm_hetero has it) for the one-device lowering every stage shares:
    oneDNN when every stage is a host CPU, none otherwise."""
    if backends is not None:
        return backends
    devices, targets = [dev for dev, _ in specs], [target for _, target in specs]
    host = shares_memory_between(devices, targets)
    all_cpus = all(runs_tvm_kernels(dev) and host(s, s) for s, dev in enumerate(devices))
    return default_backends([0] if all_cpus else [])[0]


def check_regions_fit(regions: Mapping[str, Any], specs: Sequence[tuple[Any, Any]]) -> None:
    """A split with external backend regions (oneDNN: host CPUs only) runs only on host-CPU stages."""
    if not regions:
        return
    devices, targets = [dev for dev, _ in specs], [target for _, target in specs]
    host = shares_memory_between(devices, targets)
    for s, dev in enumerate(devices):
        if not (runs_tvm_kernels(dev) and host(s, s)):
            raise ValueError(f"stage {s} ({device_name(dev)}): the split has {len(regions)} backend region(s) "
                             "(oneDNN by default), which run on host CPUs only; split with backends=() for it")


def stage_options(options: Mapping[str, Any] | None, num_stages: int) -> list[dict]:
    """Per-stage ``{"cores", "num_threads"}`` from pipeline options (docs/pipeline.md)."""
    stages = list((options or {}).get("stages", []))
    if len(stages) > num_stages:
        raise ValueError(f"options give {len(stages)} stage entries for {num_stages} stages")
    return [dict(s) for s in stages] + [{} for _ in range(num_stages - len(stages))]

