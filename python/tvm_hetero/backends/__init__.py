"""External backends (BYOC): one file per backend, registered in :data:`BACKENDS` below.

``tvm_hetero.build(mod, targets, backends=["dnnl"])`` partitions the entry function with each
backend's patterns (:mod:`.partition`) before lowering; see docs/byoc.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..build_info import ONEDNN_MISSING
from .base import Backend, MovedOp, Region
from .dnnl import DnnlBackend

#: The backends built into the product: name -> class. An accelerator's backend comes with its kind
#: record (:func:`backend_class`).
BACKENDS: dict[str, type[Backend]] = {DnnlBackend.name: DnnlBackend}


def backend_class(name: str) -> type[Backend]:
    """The backend of that name: a built-in one, or the one a device kind's record names."""
    if name in BACKENDS:
        return BACKENDS[name]
    from ..devices import vendor_kinds
    from ..kind_record import resolve

    for record in vendor_kinds():
        backend = resolve(record.backend)
        if backend.name == name:
            return backend
    known = sorted(BACKENDS) + sorted(resolve(r.backend).name for r in vendor_kinds())
    raise ValueError(f"unknown backend {name!r}; known: {', '.join(known)}")


def resolve_backends(spec: Iterable[Any] | None) -> list[Backend]:
    """``["dnnl"]``, ``[("dnnl", 1)]`` (name, device; None: where the placement puts each
    region's anchor op) or Backend instances, to Backend instances."""
    out: list[Backend] = []
    for item in spec or ():
        if isinstance(item, Backend):
            out.append(item)
            continue
        name, device = (item, 0) if isinstance(item, str) else item
        out.append(backend_class(name)(device=None if device is None else int(device)))
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise ValueError(f"a backend is listed twice: {names}")
    return out


def default_backends(cpu_devices: Sequence[int]) -> tuple[list[Backend], list[str]]:
    """The backends a build uses when it is given none: oneDNN on the host-CPU positions
    ``cpu_devices``, each region where the placement puts its anchor op, when libtvm_hetero was
    built with it. Returns the backends and a line for the build report when one is left out."""
    if not cpu_devices:
        return [], []
    dnnl = DnnlBackend(device=None, devices=cpu_devices)
    if not dnnl.available():
        return [], [ONEDNN_MISSING]
    return [dnnl], []


__all__ = ["BACKENDS", "Backend", "DnnlBackend", "MovedOp", "Region", "backend_class", "default_backends",
           "resolve_backends"]
