"""8-bit weights for the matmuls (``llm.build(..., weights="int8")``), made from the float32 checkpoint.

Each matmul weight (every projection and the LM head; :attr:`.Family.matmul_weights`) is stored
once, as the kernel reads it: (out, in) ``uint8`` with zero point 128 (one uint8 parameter,
``int8.zero_point``, for all), and one float32 scale per output channel under ``<name>_scale``. Per output row n: ``scale[n] = max|W[n]| / 127`` (1 for a
zero row), ``q = round(W[n] / scale[n])`` clipped to [-127, 127], stored as ``q`` plus 128. Guarantee:
every dequantized weight is within ``scale[n] / 2`` of the float one (half a step), and the
largest one of each row is exact up to float rounding. The float32 tensors are dropped as each one
is quantized, so no float copy stays resident.

A tied LM head is also the token table: the graph gathers its rows and dequantizes them (the same
bytes, no second table). Norms, biases, position tables and an untied token table stay float32.
The graphs compute ``x @ dequantize(W)ᵀ`` (blocks.py); the oneDNN backend runs it with an int8
kernel (backends/dnnl_int8_weights.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: The values of ``weights=``: how the matmul weights are stored.
WEIGHT_FORMATS = ("float32", "int8")
#: The stored weights' zero point (uint8 values centred on it), and the one uint8 parameter holding
#: it, which every dequantize of every graph reads.
ZERO_POINT = 128
ZERO_POINT_WEIGHT = "int8.zero_point"
#: A quantized weight's scales are the parameter of this name with the suffix.
SCALE_SUFFIX = "_scale"


def check_weight_format(value: object) -> str:
    """``value`` when it is one of :data:`WEIGHT_FORMATS`; otherwise an error listing them."""
    if not isinstance(value, str) or value not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {list(WEIGHT_FORMATS)}, got {value!r}")
    return value


def scale_name(name: str) -> str:
    return name + SCALE_SUFFIX


def quantized_names(shapes: Iterable[str]) -> set[str]:
    """The weights stored in 8 bits among the graph's parameter names (those with a scale beside them)."""
    names = set(shapes)
    return {n for n in names if scale_name(n) in names}


def quantize_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float (out, in) matrix as (uint8 (out, in), float32 scales (out,)), per the module docstring."""
    w = np.asarray(weight, dtype=np.float32)
    amax = np.abs(w).max(axis=1)
    scales = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(w / scales[:, None]), -127, 127).astype(np.int16) + ZERO_POINT
    return q.astype(np.uint8), scales


def dequantize_rows(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The float (out, in) matrix the stored bytes stand for (tests and references)."""
    return (q.astype(np.float32) - ZERO_POINT) * scales[:, None]


def quantize_weights(weights: dict[str, np.ndarray], names: set[str]) -> dict[str, np.ndarray]:
    """``weights`` (graph layout: matmul weights (in, out) float32) with ``names`` in 8 bits: each
    as (out, in) uint8 plus its scales; each float tensor is released as soon as it is quantized."""
    missing = sorted(names - set(weights))
    if missing:
        raise ValueError(f"int8 weights: the graph has no weight named {missing[0]!r}")
    out = {ZERO_POINT_WEIGHT: np.array(ZERO_POINT, dtype=np.uint8)}
    for name in list(weights):
        value = weights.pop(name)
        if name in names:
            out[name], out[scale_name(name)] = quantize_rows(value.T)
        else:
            out[name] = value
    return out


def quantized_shapes(shapes: dict[str, tuple[int, ...]], names: set[str]) -> dict[str, tuple[int, ...]]:
    """The graph's parameter shapes once ``names`` are stored in 8 bits: (out, in) and (out,) scales."""
    out: dict[str, tuple[int, ...]] = {ZERO_POINT_WEIGHT: ()}
    for name, shape in shapes.items():
        if name in names:
            out[name] = (shape[1], shape[0])
            out[scale_name(name)] = (shape[1],)
        else:
            out[name] = shape
    return out
