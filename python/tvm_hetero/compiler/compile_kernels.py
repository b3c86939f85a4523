"""Kernel compilation: each device's kernels for its target, one runtime module (or one per
architecture, with ``only_devices``: compiler/kernel_libraries.py)."""

from __future__ import annotations

import platform
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import tvm

from ..errors import last_line

if TYPE_CHECKING:
    from .lower import LoweredGraph


def compile_kernels(
    lowered: LoweredGraph, targets: Sequence[Any], only_devices: Collection[int] | None = None
) -> tvm.runtime.Module:
    """Compile each device's kernels for its target; one module, the others imported into it.

    ``targets[d]`` (a :class:`tvm.target.Target`, a string or a dict) is the target of device
    ``d``. Devices with equal targets share one compilation. The first compiled module is the
    host and the others are imported into it, so every kernel is found by ``lib[name]`` or by a
    search through ``lib.imports``. A kernel its target cannot compile raises RuntimeError
    naming the kernel, its Relax ops and its device. ``only_devices`` limits the module to the
    kernels of those devices (one library per architecture, kernel_libraries.py).
    """
    if len(targets) != lowered.num_devices:
        raise ValueError(f"got {len(targets)} targets for {lowered.num_devices} devices")
    resolved = [t if isinstance(t, tvm.target.Target) else tvm.target.Target(t) for t in targets]
    selected = sorted(range(len(resolved)) if only_devices is None else only_devices)
    groups: dict[str, list[int]] = {}
    for device in selected:
        groups.setdefault(str(resolved[device]), []).append(device)
    modules = []
    for devices in groups.values():
        names = [n for n, d in lowered.kernel_devices.items() if d in devices]
        if not names:
            continue
        target = resolved[devices[0]]
        funcs = {gv: f for gv, f in lowered.kernels.functions.items() if gv.name_hint in names}
        modules.append(_compile_for(tvm.IRModule(funcs), target, devices, lowered))
    for backend in lowered.backends:
        regions = [r for r in lowered.regions.values() if r.backend == backend.name and r.device in selected]
        if regions:
            modules.append(backend.codegen(regions))
    if not modules or not _is_compiled(modules[0]):  # a host module to import the others into
        modules.insert(0, _build(tvm.IRModule({}), resolved[selected[0]]))
    host = modules[0]
    for other in modules[1:]:
        host.import_module(other)
    return host


def _is_compiled(module: tvm.runtime.Module) -> bool:
    """Whether ``module`` came from ``tvm.compile`` (so export_library can be the host)."""
    return module.kind in ("llvm", "c", "static_library")


def _compile_for(
    kernels: tvm.IRModule, target: tvm.target.Target, devices: list[int], lowered: LoweredGraph
) -> tvm.runtime.Module:
    try:
        return _build(kernels, target)
    except Exception as whole_error:  # narrowed to one kernel below
        for gv, prim in kernels.functions.items():
            try:
                _build(tvm.IRModule({gv: prim}), target)
            except Exception as error:
                name = gv.name_hint
                ops = ", ".join(lowered.kernel_ops(name)) or "?"
                raise RuntimeError(
                    f"kernel {name} (ops {ops}) placed on device {lowered.kernel_devices[name]} "
                    f"cannot be compiled for target {_target_text(target)}: {last_line(error)}"
                ) from error
        raise RuntimeError(
            f"kernels for device(s) {devices} do not compile for target {_target_text(target)}: "
            f"{last_line(whole_error)}"
        ) from whole_error


def _target_text(target: tvm.target.Target) -> str:
    """``llvm``, or ``llvm -mtriple=aarch64-linux-gnu`` for a target of another architecture."""
    triple = str(target.attrs.get("mtriple", "") or "") if target.kind.name in ("llvm", "c") else ""
    if triple and not triple.startswith(platform.machine()):
        return f"{target.kind.name} -mtriple={triple}"
    return target.kind.name


def _build(kernels: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Module:
    if "gpu" in target.keys:
        if target.host is None:
            target = tvm.target.Target(target, host="llvm")
        with target:
            kernels = tvm.s_tir.transform.DefaultGPUSchedule()(kernels)
    return tvm.compile(kernels, target).mod

