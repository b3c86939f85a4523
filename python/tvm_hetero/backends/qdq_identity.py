"""Drop the requantizations that change nothing: ``quantize(dequantize(x, s, z), s, z)`` -> ``x``.

ONNX Runtime's quantizer leaves such pairs where it quantized both sides of an op that the model
no longer has (a Flatten or Reshape that ``prepare`` drops as a no-op, an Identity). With the same
scale, zero point, axis and integer type on both sides the pair is exactly the identity
(``round(s * (x - z) / s) + z == x`` for every integer ``x``), and left in place it is a lone
DequantizeLinear / QuantizeLinear that an accelerator may refuse, cutting one graph in two.
The dequantize stays where anything else reads it; dead code elimination removes it otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from ..ir.constant_values import tensor_value
from .qdq import DEQUANTIZE, QUANTIZE


def DropIdentityRequantize(entry: str = "main") -> tvm.transform.Pass:
    x = wildcard()
    dequantize = is_op(DEQUANTIZE)(x, wildcard(), wildcard())
    pattern = is_op(QUANTIZE)(dequantize, wildcard(), wildcard())

    def rewrite(orig: relax.Call, m: dict) -> Any:
        inner = m[dequantize]
        if _same_quantization(inner, orig) and _dtype(m[x]) == str(orig.attrs.out_dtype):
            return m[x]
        return orig

    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        func = rewrite_call(pattern, rewrite, mod[entry])
        mod = mod.clone()
        mod[entry] = func
        return relax.transform.DeadCodeElimination([entry])(mod)

    return tvm.transform.module_pass(run, opt_level=0, name="DropIdentityRequantize")


def _same_quantization(dequantize: relax.Call, quantize: relax.Call) -> bool:
    """Scale and zero point equal constants (bit for bit) on the same axis."""
    for a, b in zip(dequantize.args[1:3], quantize.args[1:3]):
        va, vb = tensor_value(a), tensor_value(b)
        if va is None or vb is None or va.shape != vb.shape or va.dtype != vb.dtype or not np.array_equal(va, vb):
            return False
    scalar = tensor_value(dequantize.args[1]).size == 1
    return scalar or int(dequantize.attrs.axis) == int(quantize.attrs.axis)


def _dtype(expr: relax.Expr) -> str:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else ""
