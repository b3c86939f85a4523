"""External backends (BYOC): one file per backend, registered in :data:`BACKENDS` below.

``tvm_hetero.build(mod, targets, backends=["dnnl"])`` partitions the entry function with each
backend's patterns (:mod:`.partition`) before lowering; see docs/byoc.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .base import Backend, Region
from .dnnl import DnnlBackend

#: The one place backends are registered: name -> class.
BACKENDS: dict[str, type[Backend]] = {DnnlBackend.name: DnnlBackend}


def resolve_backends(spec: Iterable[Any] | None) -> list[Backend]:
    """``["dnnl"]``, ``[("dnnl", 1)]`` (name, device) or Backend instances, to Backend instances."""
    out: list[Backend] = []
    for item in spec or ():
        if isinstance(item, Backend):
            out.append(item)
            continue
        name, device = (item, 0) if isinstance(item, str) else item
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
        out.append(BACKENDS[name](device=int(device)))
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise ValueError(f"a backend is listed twice: {names}")
    return out


__all__ = ["BACKENDS", "Backend", "DnnlBackend", "Region", "resolve_backends"]
