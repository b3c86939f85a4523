"""Float32 matmul weights stored in 16-column panels, the layout a decode step reads fastest.

A matmul weight W (in, out) with 16 dividing both is stored as P (out / 16, in, 16): panel j holds
columns 16j..16j+15 of W, row after row (``P[j, k, i] == W[k, 16 j + i]``; the same values, only
moved). The graphs read it back as (in, out) through ``reshape(permute_dims(P, [1, 0, 2]))``, which
the oneDNN region reads as stored: one row (a decode step) streams four panels at a time
(src/backends/one_row_matmul.h), 1.4-1.5x faster than the rows of (in, out) on this machine's
decode shapes, and more rows (a prefill chunk) give oneDNN the same bytes as its BA16a16b layout,
so prefill and decode graphs still share one copy of the weights. A tied LM head in panels is also
the token table: an embedding gathers the token's panel, then its column.

Only for graphs whose matmuls all run in oneDNN on local CPUs (:func:`wanted_for`): elsewhere (an
accelerator's ONNX graphs, TVM's own kernels) the reshape would copy the weight at every call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..backends.dnnl import PANEL_WIDTH

#: Environment variable that keeps the weights in (in, out) rows when set to "0" (comparisons).
SWITCH = "TVM_HETERO_LLM_WEIGHT_PANELS"


def fits(shape: tuple[int, ...]) -> bool:
    """Whether an (in, out) weight of ``shape`` can be stored in panels (16 divides both)."""
    return len(shape) == 2 and shape[0] % PANEL_WIDTH == 0 and shape[1] % PANEL_WIDTH == 0


def to_panels(weight: np.ndarray) -> np.ndarray:
    """(in, out) -> (out / 16, in, 16), contiguous."""
    k, n = weight.shape
    return np.ascontiguousarray(weight.reshape(k, n // PANEL_WIDTH, PANEL_WIDTH).transpose(1, 0, 2))


def from_panels(panels: np.ndarray) -> np.ndarray:
    """(out / 16, in, 16) -> (in, out): the inverse of :func:`to_panels` (tests and references)."""
    count, k, width = panels.shape
    return np.ascontiguousarray(panels.transpose(1, 0, 2).reshape(k, count * width))


def panelled_names(shapes: dict[str, tuple[int, ...]]) -> set[str]:
    """The weights in panels among a graph's weight shapes: the 3-D ones of width 16 (every other
    weight of the families is 1-D or 2-D)."""
    return {name for name, shape in shapes.items() if len(shape) == 3 and shape[2] == PANEL_WIDTH}


def store_in_panels(weights: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                    names: Iterable[str]) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
    """``weights`` and ``shapes`` with each of ``names`` that :func:`fits` in panels; each float
    tensor is replaced as it is converted, so no second copy of the weights stays."""
    chosen = sorted(name for name in names if fits(tuple(shapes[name])))
    shapes = dict(shapes)
    for name in chosen:
        weights[name] = to_panels(weights[name])
        shapes[name] = tuple(weights[name].shape)
    return weights, shapes


def wanted_for(phase_targets: dict[str, Any], backends: Any) -> bool:
    """Whether a model's weights go in panels: the default backends (oneDNN on CPUs, available in
    this build), every phase on local CPUs only, and not switched off by :data:`SWITCH`."""
    from ..backends import dnnl
    from ..devices import is_cpu, is_remote, parse_spec

    if os.environ.get(SWITCH, "1") == "0" or backends is not None or not dnnl.info()["available"]:
        return False
    for targets in phase_targets.values():
        entries = targets if isinstance(targets, (list, tuple)) else [targets]
        for entry in entries:
            device = parse_spec(entry).device
            if not is_cpu(device) or is_remote(device):
                return False
    return True
