"""Seeded sample values for a graph's inputs: the one maker that measuring, verification, the
capability probe, the host timing of automatic placement and the test fixtures draw from.

Per dtype (``dtype`` any numpy name, e.g. ``"float16"``, ``"int64"``, ``"bool"``):

- floats: ``floats="normal"`` (standard normal, the default), ``"uniform"`` (in [-1, 1]) or
  ``"away_from_zero"`` (of both signs, magnitudes in [0.25, 2]: no denominator near 0 that would
  overflow fp16 and say nothing of the op);
- bool: 0 or 1;
- 8-bit integers: their whole range (a quantized tensor);
- wider integers: indices in [0, bound), ``bound`` the input's entry in ``index_bounds`` (the length
  of the axis a gather indexes: :func:`onnx_index_bounds`), else ``default_bound``. The default, 1,
  draws zeros: the only index in range of every axis.

Guarantee: the same (shape, dtype, rng state, options) give the same values, and an index is
always below its bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

#: The float distributions :func:`sample_value` draws from.
FLOAT_STYLES = ("normal", "uniform", "away_from_zero")


def _float_values(shape: tuple[int, ...], rng: np.random.Generator, floats: str) -> np.ndarray:
    if floats == "normal":
        return rng.standard_normal(shape)
    if floats == "uniform":
        return rng.uniform(-1.0, 1.0, size=shape)
    if floats == "away_from_zero":
        return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.25, 2.0, size=shape)
    raise ValueError(f"sample inputs: floats={floats!r}: expected one of {', '.join(FLOAT_STYLES)}")


def sample_value(shape: Sequence[int], dtype: str, rng: np.random.Generator, *, floats: str = "normal",
                 bound: int = 1) -> np.ndarray:
    """One seeded value (see the module docstring); ``bound``: an integer index's exclusive upper end."""
    shape = tuple(int(d) for d in shape)
    kind = np.dtype(dtype).kind if dtype != "bfloat16" else "f"
    if kind == "f":
        return np.asarray(_float_values(shape, rng, floats)).astype(dtype)
    if kind == "b":
        return np.asarray(rng.integers(0, 2, size=shape)).astype(bool)
    if kind in "iu" and np.dtype(dtype).itemsize == 1:
        info = np.iinfo(dtype)
        return np.asarray(rng.integers(int(info.min), int(info.max) + 1, size=shape)).astype(dtype)
    if kind in "iu":
        if bound < 1:
            raise ValueError(f"sample inputs: an index bound of {bound}: an axis of length 0 has no index to draw")
        return np.asarray(rng.integers(0, bound, size=shape)).astype(dtype)
    raise ValueError(f"sample inputs: no sample rule for dtype {dtype!r}")


def sample_values(inputs: Mapping[str, tuple[Sequence[int], str]] | Iterable[tuple[str, Sequence[int], str]],
                  seed: int | np.random.Generator = 0, *, floats: str = "normal",
                  index_bounds: Mapping[str, int] | None = None, default_bound: int = 1) -> dict[str, np.ndarray]:
    """A value per input (``name -> (shape, dtype)``, or ``(name, shape, dtype)`` triples), drawn in
    order from one generator (``seed``, or a generator to continue)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    items = inputs.items() if isinstance(inputs, Mapping) else ((n, (s, t)) for n, s, t in inputs)
    bounds = index_bounds or {}
    return {name: sample_value(shape, dtype, rng, floats=floats, bound=bounds.get(name, default_bound))
            for name, (shape, dtype) in items}


def onnx_inputs(model) -> list[tuple[str, list[int], str]]:
    """``(name, shape, numpy dtype)`` of each graph input of an ONNX model (a ``ModelProto``); a
    dimension without a fixed length counts 1."""
    import onnx

    found = []
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
        found.append((value.name, [d.dim_value or 1 for d in tensor.shape.dim], dtype))
    return found


def onnx_index_bounds(model: bytes) -> dict[str, int]:
    """Per graph input that a Gather takes as its indices: the length of the axis it indexes (random
    indices beyond it would ask about an error, not the op)."""
    import onnx

    proto = onnx.shape_inference.infer_shapes(onnx.load_from_string(model))
    values = [*proto.graph.input, *proto.graph.value_info]  # a Gather may index a value the graph makes
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in values}
    dims.update({i.name: list(i.dims) for i in proto.graph.initializer})
    bounds = {}
    for node in proto.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        shape = dims.get(node.input[0])
        # a length ONNX's shape inference cannot tell (after an op it has no schema for): index 0 only
        length = shape[axis % len(shape)] if shape and shape[axis % len(shape)] > 0 else 1
        bounds[node.input[1]] = min(bounds.get(node.input[1], 1 << 30), length)
    return bounds
