"""Decoders' TVM kernels compile for the CPU they run on.

A plain ``"llvm"`` target compiles for the baseline of its architecture (on x86-64: SSE2), so the
kernels between the oneDNN regions (norms, RoPE, softmax, the attention's score blocks) get none of
the machine's wider vectors; for a decoder's prefill they are a sixth of the time. :func:`for_this_cpu`
turns each local CPU entry of a phase's targets whose target is the plain ``"llvm"`` into
``Target.from_device``'s (the LLVM name and features of this CPU); any other target is the user's
choice and kept (``tvm.target.Target("llvm")``, a Target rather than the string, compiles for any CPU of
the architecture). An export records the features its kernels were compiled with
(:func:`compiled_for`), and :func:`check_runs_here` refuses to load it on a CPU lacking any of them,
naming them, instead of failing with an illegal instruction. The C++ loader checks the same record
(src/support/cpu_features.h), counting only the names whose absence can fault.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm.target import codegen

from ..devices import is_cpu, is_remote, parse_spec

PLAIN = "llvm"


def this_cpu() -> tvm.target.Target:
    """The LLVM target of the CPU this process runs on."""
    return tvm.target.Target.from_device(tvm.cpu())


def for_this_cpu(targets: Any) -> Any:
    """``targets`` with every local CPU entry targeting plain ``"llvm"`` targeting this CPU instead."""
    if not isinstance(targets, (list, tuple)):
        return targets
    out = []
    for entry in targets:
        spec = parse_spec(entry)
        plain = isinstance(spec.target, str) and spec.target.strip() == PLAIN
        if not plain or not is_cpu(spec.device) or is_remote(spec.device):
            out.append(entry)
        elif isinstance(entry, (tuple, list)):
            out.append((entry[0], this_cpu()))
        else:  # a kind string or dict: the same device and options, with the target given
            out.append({"kind": spec.kind.name, "index": spec.device.index, **spec.options, "target": this_cpu()})
    return out


def compiled_for(targets: list) -> dict | None:
    """What an export records of the CPU its kernels need: the LLVM CPU name and features of the first
    entry targeting a named CPU (None: every kernel targets its architecture's baseline)."""
    for entry in targets:
        target = parse_spec(entry).target
        if isinstance(target, tvm.target.Target) and target.attrs.get("mcpu"):
            return {"cpu": str(target.attrs["mcpu"]), "features": sorted(codegen.llvm_get_cpu_features(target))}
    return None


def check_runs_here(recorded: dict | None, where: str) -> None:
    """Raise naming the missing features when this CPU lacks any of ``recorded``'s."""
    if not recorded:
        return
    missing = sorted(set(recorded["features"]) - codegen.llvm_get_cpu_features(this_cpu()))
    if missing:
        raise RuntimeError(f"{where}: its kernels were compiled for CPU {recorded['cpu']!r}, and this CPU "
                           f"({this_cpu().attrs.get('mcpu')}) lacks {', '.join(missing)}; build it again here "
                           "(tvm_hetero.llm.build), or build it with the target tvm.target.Target('llvm') (a Target, "
                           "not the string) for any CPU of the architecture")
