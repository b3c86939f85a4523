"""Rewrites of a QDQ model before the oneDNN int8 patterns match (run by ``DnnlBackend.prepare``).

- :func:`simplify_qdq` (first): a quantize of a constant becomes the quantized constant (ONNX
  Runtime's quantizer quantizes computed constants, e.g. an ``Unsqueeze`` of a weight, as
  activations), ``quantize(dequantize(x, s, z), s, z)`` of one type is ``x`` itself (what a
  dropped ``Dropout`` leaves; :mod:`.qdq_identity`, shared with accelerators), and
  ``quantize(move(dequantize(x, s, z)), s, z)`` of a reshape or transpose is ``move(x)``
  (ShuffleNet's channel shuffle moves its u8 values; a reader of the quantize gets its own move).
- :func:`fold_quantized_affine` (after the float batch-norm folding): a unit that is a per-channel
  affine map of one activation -- ``quantize([relu|clip](dequantize(x) * a + b))``, a batch norm, a
  multiply, divide or add by constants -- is rewritten in the integers' own units:
  ``quantize([clip](dequantize(x, 1, 0) * a' + b'), 1, 0)`` with ``a' = sx a / sy`` and
  ``b' = (b - zx sx a) / sy + zy`` (the clip's bounds moved alike). Both forms round the same real
  number once, so the result is the same up to float rounding; the new form is one oneDNN binary
  primitive from u8/s8 to u8/s8 (``dnnl.qscale_shift``) instead of a dequantize, a float scale-shift
  and a quantize.

Guarantee: both rewrite only bindings whose intermediate values have no other reader, keep every
variable read outside them, and leave a model without QDQ unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..ir.relax_helpers import map_bindings, use_counts
from .qdq import DEQUANTIZE, QUANTIZE
from .qdq_identity import DropIdentityRequantize
from .qdq_identity import _same_quantization as same_quantization  # one rule for "undoes exactly"

_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}
#: Ops that only move values; between a dequantize and a quantize of the same scale and zero point
#: (what ONNX Runtime's quantizer writes around Reshape / Transpose) they move the integers.
_MOVES = frozenset({"relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims", "relax.flatten"})


def simplify_qdq(entry: str = "main") -> tvm.transform.Pass:
    """Quantized constants folded, identity requantizations dropped (see the module docstring)."""

    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        func = mod[entry]
        values = _values(func)
        replaced: dict[Any, Any] = {}
        for var, value in values.items():
            if _op(value) != QUANTIZE:
                continue
            src, scale, zp = value.args[0], _const(value.args[1]), _const(value.args[2])
            if scale is None or zp is None:
                continue
            if isinstance(src, tvm.ir.Constant):
                replaced[var] = relax.const(_quantize_array(src.value.numpy(), scale, zp, value), str(value.ty.dtype))
            elif _op(values.get(src)) in _MOVES and _op(values.get(values[src].args[0])) == DEQUANTIZE:
                dq = values[values[src].args[0]]
                if _is_identity(dq, value):  # the move on the integers themselves: exact
                    move = values[src]
                    replaced[var] = relax.Call(move.op, [dq.args[0], *move.args[1:]], move.attrs, move.ty_args)
        mod = _substitute(mod, entry, replaced) if replaced else mod
        return DropIdentityRequantize(entry)(mod)

    return tvm.transform.module_pass(run, opt_level=0, name="SimplifyQdq")


def fold_quantized_affine(entry: str = "main") -> tvm.transform.Pass:
    """Per-channel affine units in the integers' units (see the module docstring)."""

    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        func = mod[entry]
        values = _values(func)
        uses = use_counts(func)
        plans = {}
        for var, value in values.items():
            if _op(value) == QUANTIZE:
                plan = _affine_plan(value, values, uses)
                if plan is not None:
                    plans[var] = plan
        if not plans:
            return mod
        mod = mod.clone()
        mod[entry] = map_bindings(func, lambda b: _affine_bindings(b.var, plans[b.var]) if b.var in plans else b)
        return relax.transform.DeadCodeElimination([entry])(mod)

    return tvm.transform.module_pass(run, opt_level=0, name="FoldQuantizedAffine")


# ---- the affine unit ----------------------------------------------------------------------------
def _affine_plan(q: relax.Call, values: dict, uses: dict) -> dict | None:
    """``q``'s unit as (x, a', b', clip bounds, q's types) when it is a per-channel affine map of one
    per-tensor dequantized activation, else None."""
    sy, zy = _const(q.args[1]), _const(q.args[2])
    out_dtype = str(q.ty.dtype)
    if sy is None or zy is None or sy.size != 1 or zy.size != 1 or out_dtype not in _RANGE:
        return None
    if float(sy.reshape(-1)[0]) == 1.0 and int(zy.reshape(-1)[0]) == 0:
        return None  # already folded
    cur = q.args[0]
    lo, hi = -np.inf, np.inf
    value = _single_use(cur, values, uses)
    if _op(value) == "relax.nn.relu":
        lo, cur = 0.0, value.args[0]
    elif _op(value) == "relax.clip":
        bounds = [_prim(a) for a in value.args[1:]]
        if None in bounds:
            return None
        (lo, hi), cur = bounds, value.args[0]
    shift = scale = None
    value = _single_use(cur, values, uses)
    if _op(value) == "relax.add" and isinstance(value.args[1], tvm.ir.Constant):
        shift, cur = value.args[1].value.numpy().astype(np.float64), value.args[0]
        value = _single_use(cur, values, uses)
    if _op(value) == "relax.multiply" and isinstance(value.args[1], tvm.ir.Constant):
        scale, cur = value.args[1].value.numpy().astype(np.float64), value.args[0]
    elif _op(value) == "relax.divide" and isinstance(value.args[1], tvm.ir.Constant):
        scale, cur = 1.0 / value.args[1].value.numpy().astype(np.float64), value.args[0]  # attention's / sqrt(d)
    if scale is None and shift is None:
        return None
    dq = values.get(cur)
    if _op(dq) != DEQUANTIZE or isinstance(dq.args[0], tvm.ir.Constant):
        return None
    sx, zx = _const(dq.args[1]), _const(dq.args[2])
    shape = _shape(dq)
    if sx is None or zx is None or sx.size != 1 or zx.size != 1 or shape is None or len(shape) != 4:
        return None
    channels = shape[1]
    a = _channel_vector(1.0 if scale is None else scale, channels)
    b = _channel_vector(0.0 if shift is None else shift, channels)
    if a is None or b is None:
        return None
    sx, zx, sy, zy = float(sx.reshape(-1)[0]), float(zx.reshape(-1)[0]), float(sy.reshape(-1)[0]), float(zy.reshape(-1)[0])
    a2 = sx * a / sy
    b2 = (b - zx * sx * a) / sy + zy
    qmin, qmax = _RANGE[out_dtype]
    bounds = (max(lo / sy + zy, qmin), min(hi / sy + zy, qmax)) if (lo, hi) != (-np.inf, np.inf) else None
    return {"x": dq.args[0], "zx_dtype": str(dq.args[2].ty.dtype), "zy_dtype": str(q.args[2].ty.dtype),
            "a": a2, "b": b2, "bounds": bounds, "channels": channels, "q": q}


def _affine_bindings(var: relax.Var, plan: dict) -> list[relax.VarBinding]:
    """The rewritten unit's bindings, the last one binding ``var`` (the unit's quantize)."""
    c = plan["channels"]
    x = plan["x"]
    float_ty = relax.TensorType(x.ty.shape, "float32")
    dq = relax.DataflowVar("qaffine_in", float_ty)
    mul = relax.DataflowVar("qaffine_mul", float_ty)
    add = relax.DataflowVar("qaffine_add", float_ty)
    vec = lambda v: relax.const(v.astype(np.float32).reshape(1, c, 1, 1))
    out = [
        relax.VarBinding(dq, relax.op.dequantize(x, relax.const(1.0, "float32"), relax.const(0, plan["zx_dtype"]),
                                                 axis=1, out_dtype="float32")),
        relax.VarBinding(mul, relax.op.multiply(dq, vec(plan["a"]))),
        relax.VarBinding(add, relax.op.add(mul, vec(plan["b"]))),
    ]
    top = add
    if plan["bounds"] is not None:
        top = relax.DataflowVar("qaffine_clip", float_ty)
        lo, hi = plan["bounds"]
        out.append(relax.VarBinding(top, relax.op.clip(add, relax.PrimValue(float(lo)), relax.PrimValue(float(hi)))))
    q = plan["q"]
    out.append(relax.VarBinding(var, relax.op.quantize(top, relax.const(1.0, "float32"),
                                                       relax.const(0, plan["zy_dtype"]), axis=1,
                                                       out_dtype=str(q.attrs.out_dtype))))
    return out


# ---- helpers ------------------------------------------------------------------------------------
def _is_identity(dq: relax.Call, q: relax.Call) -> bool:
    """``q`` undoes ``dq`` exactly: same scale, zero point and axis, and the same integer type."""
    src = dq.args[0]
    return (not isinstance(src, tvm.ir.Constant) and str(src.ty.dtype) == str(q.attrs.out_dtype)
            and same_quantization(dq, q))


def _quantize_array(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, q: relax.Call) -> np.ndarray:
    """ONNX QuantizeLinear on a constant: round half to even, add the zero point, saturate."""
    x = x.astype(np.float64)
    if scale.size > 1:
        shape = [1] * x.ndim
        shape[int(q.attrs.axis) % x.ndim] = scale.size
        scale = scale.reshape(shape)
        zp = zp.reshape(shape) if zp.size > 1 else zp
    lo, hi = _RANGE[str(q.ty.dtype)]
    return np.clip(np.rint(x / scale.astype(np.float64)) + zp.astype(np.float64), lo, hi).astype(str(q.ty.dtype))


def _substitute(mod: tvm.IRModule, entry: str, replaced: dict) -> tvm.IRModule:
    """``mod`` with every read of a key of ``replaced`` reading its value instead (the bindings of
    the keys are left to dead-code elimination)."""

    @relax.expr_functor.mutator
    class Substitute(relax.PyExprMutator):
        def visit_var_(self, var: relax.Var) -> relax.Expr:
            return replaced.get(var, var)

        def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
            return replaced.get(var, var)

    mod = mod.clone()
    mod[entry] = Substitute(mod).visit_expr(mod[entry])
    return relax.transform.DeadCodeElimination([entry])(mod)


def _values(func: relax.Function) -> dict:
    return {b.var: b.value for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)}


def _single_use(expr: Any, values: dict, uses: dict) -> Any:
    """The value bound to ``expr`` when ``expr`` is a variable read once, else None."""
    if isinstance(expr, relax.Var) and uses.get(expr, 0) == 1:
        return values.get(expr)
    return None


def _channel_vector(v: Any, channels: int) -> np.ndarray | None:
    """A scalar or a per-channel constant of an NCHW tensor ((C,), (C, 1, 1), (1, C, 1, 1)) as (C,)."""
    v = np.asarray(v, dtype=np.float64)
    if v.size == 1:
        return np.full(channels, float(v.reshape(-1)[0]))
    if v.ndim > 4 or v.size != channels:
        return None
    padded = v.reshape((1,) * (4 - v.ndim) + v.shape)
    return padded.reshape(-1) if padded.shape == (1, channels, 1, 1) else None


def _prim(expr: Any) -> float | None:
    if isinstance(expr, relax.PrimValue):
        return float(expr.value.value)
    if isinstance(expr, tvm.ir.Constant) and expr.value.numpy().size == 1:
        return float(expr.value.numpy().reshape(-1)[0])
    return None


def _shape(call: relax.Call) -> tuple[int, ...] | None:
    """The static shape of the tensor ``call`` reads first (a dequantize's source), or None."""
    ty = getattr(call.args[0], "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    if not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
        return None
    return tuple(int(d) for d in ty.shape.values)


def _const(expr: Any) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, tvm.ir.Constant) else None


def _op(value: Any) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


__all__ = ["fold_quantized_affine", "simplify_qdq"]
