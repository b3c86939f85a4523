"""oneDNN regions: a float32 matmul whose weight is stored in 8 bits (weight-only quantization).

The graph says what is computed, in Relax's own ops::

    w = R.dequantize(W, scale, zero_point, axis=0)   # W: (N, K) uint8, scale: (N,), zero_point: uint8 ()
    y = R.matmul(x, R.permute_dims(w)) [+ bias]      # x: (..., K) float32

W, scale and zero_point are weights (graph parameters): the zero point is one uint8 parameter, not a
constant, so a region reads nothing but parameters and activations (tvm_hetero.llm shares that one
parameter, value 128, between every matmul of every graph).

``dnnl.int8_weight_matmul[_bias]`` takes the three ops (and the bias add) into one region step,
``int8_weight_matmul``, which the C++ module runs with its own VNNI kernel
(src/backends/int8_matmul.h) straight on the stored (N, K) bytes: no float copy of the weight is
ever made, and nothing is reordered. Without this backend the same graph runs as TVM kernels
(dequantize, then a float matmul): slower, the same values up to the kernel's quantization of x.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import is_op, wildcard
from tvm.relax.transform import FusionPattern

from ..ir.relax_helpers import expr_shape
from .base import WeightPredicate

#: The pattern names (with and without the bias add).
PATTERN = "dnnl.int8_weight_matmul"


def int8_weight_matmul_patterns(is_weight: WeightPredicate) -> list[FusionPattern]:
    """The bias form first, so a bias add joins its matmul."""
    out = []
    for bias in (True, False):
        data, weight, scale, zero_point = wildcard(), wildcard(), wildcard(), wildcard()
        dequantized = is_op("relax.dequantize")(weight, scale, zero_point)
        top = mm = is_op("relax.matmul")(data, is_op("relax.permute_dims")(dequantized))
        ann = {"anchor": mm, "matmul": mm, "dequantize": dequantized, "weight": weight, "scale": scale,
               "zero_point": zero_point}
        if bias:
            ann["bias"] = wildcard()
            top = ann["bias_add"] = is_op("relax.add")(mm, ann["bias"])
        name = PATTERN + "_bias" * bias
        out.append(FusionPattern(name, top, ann, lambda ctx: _check(ctx, is_weight)))
    return out


def _check(ctx: Any, is_weight: WeightPredicate) -> bool:
    """(N, K) uint8 weights, one uint8 zero point and N float32 scales along axis 0 (all weights),
    float32 data whose last axis is K, and a bias (if any) of N float32 weights."""
    if has_leaking_intermediate_variables(ctx):
        return False
    ann = ctx.annotated_expr
    dq = ann["dequantize"]
    w, scale = expr_shape(ann["weight"]), expr_shape(ann["scale"])
    data = expr_shape(ann["matmul"].args[0])
    if w is None or scale is None or data is None or len(w) != 2 or not 2 <= len(data) <= 5:
        return False
    if _dtype(ann["weight"]) != "uint8" or _dtype(ann["scale"]) != "float32" or _dtype(ann["matmul"]) != "float32":
        return False
    if int(dq.attrs.axis) != 0 or str(dq.attrs.out_dtype) != "float32" or scale != (w[0],) or data[-1] != w[1]:
        return False
    zero_point = expr_shape(ann["zero_point"])
    if zero_point is None or int(np.prod(zero_point)) != 1 or _dtype(ann["zero_point"]) != "uint8":
        return False
    if not all(is_weight(ann[role]) for role in ("weight", "scale", "zero_point")):
        return False
    if "bias" in ann:
        bias = expr_shape(ann["bias"])
        if not is_weight(ann["bias"]) or _dtype(ann["bias"]) != "float32" or bias is None:
            return False
        if int(np.prod(bias)) != w[0] or bias[-1] != w[0]:
            return False
    return True


def describe_int8_weight_matmul(composite: relax.Function) -> dict:
    """The region's step (docs/byoc.md): ``int8_weight_matmul`` with the input index of each role."""
    index = {p: i for i, p in enumerate(composite.params)}
    spec: dict[str, Any] = {"op": "int8_weight_matmul", "num_inputs": len(composite.params)}
    for block in composite.body.blocks:
        for binding in block.bindings:
            value = binding.value
            name = value.op.name
            if name == "relax.dequantize":
                spec.update(weight=index[value.args[0]], scale=index[value.args[1]], zero_point=index[value.args[2]])
            elif name == "relax.matmul":
                spec["data"] = index[value.args[0]]
            elif name == "relax.add":
                spec["bias"] = index[value.args[1]]
    return spec


def _dtype(expr: Any) -> str:
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))
