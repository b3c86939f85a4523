"""oneDNN int8: the QDQ units of a quantized model (:mod:`.qdq`) as oneDNN integer primitives.

A QDQ model computes each op in float between a dequantize of its inputs and a quantize of its
output. The oneDNN backend runs the units it can in integers and keeps the quantized values (u8 or
s8) between them, inside its blocks:

- ``dnnl.qconv2d*`` / ``dnnl.qmatmul*``: ``quantize([act](dequantize(x) (*) dequantize(W) [+ dequantize(B)]))``
  with W int8 (zero point 0, one scale or one per output channel), B int32 in the accumulator's
  units (its scale is x's times W's, as ONNX Runtime's quantizer writes it) and x, y per tensor:
  one u8/s8 convolution or matmul, output scales ``sx * sw / sy`` and the zero points of x and y as
  attributes. The int8 weights are the model's own (quantized once, by the quantizer); the
  primitive reorders them into its layout once, like float weights.
- ``dnnl.qadd*``: ``quantize([relu](dequantize(a) + dequantize(b)))``: one u8/s8 binary add with
  the scales of both sources, the zero points folded into a shift (ResNet's residual).
- ``dnnl.dequantize`` / ``dnnl.quantize`` of an activation (per tensor): a reorder with scale and
  zero point. They let the float oneDNN regions a QDQ model also has (pooling, concat, a global
  mean, a batch norm as scale-shift, LRN, softmax) join the integer ones in one block: such a
  unit runs in float between a dequantize and a quantize *inside* the block (counted as
  "float inside oneDNN blocks" by :func:`qdq_report`).

What no pattern takes (a per-channel activation scale, an op without a oneDNN region) stays with
TVM: its dequantize, float op and quantize are TVM kernels (counted as a fallback, per unit).

Before matching, :func:`fold_param_dequantize` folds the dequantize of constants no integer unit
reads (a batch norm's scale and shift) into float constants, so the float rewrites see constants,
and (last) :func:`unshare_qdq` gives every conv / matmul / add its own copy of a dequantized
activation it shares (a unit must not share a value with another).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import is_const, is_op, is_tuple, wildcard
from tvm.relax.transform import FusionPattern

from ..ir.relax_helpers import replace_body, same_kind_block
from .qdq import DEQUANTIZE, QUANTIZE

#: Attribute of an int8 composite: its ``quant`` (docs/byoc.md) as JSON.
QUANT_ATTR = "tvm_hetero.quant"
#: Pattern names whose regions compute in integers.
INT8_PATTERNS = ("dnnl.qconv2d", "dnnl.qmatmul", "dnnl.qadd", "dnnl.qpool", "dnnl.qconcat", "dnnl.qscale_shift")
#: The most inputs an integer concat pattern takes (Inception joins 4, DenseNet 2).
MAX_INT8_CONCAT_INPUTS = 16
_TYPES = {"uint8": "u8", "int8": "s8"}


def int8_patterns() -> list[FusionPattern]:
    """The integer units first (they take their dequantizes and quantize), then the lone
    dequantize and quantize of activations (what is left of QDQ around float regions)."""
    out = []
    for bias in (True, False):
        for act in ("relu", "clip", None):
            out.append(_qconv_pattern(bias, act))
    for bias in (True, False):
        for quantized in (True, False):
            out.append(_qmatmul_pattern(bias, quantized))
    for relu in (True, False):
        out.append(_qadd_pattern(relu))
    for op in ("max_pool2d", "avg_pool2d", "mean"):
        out.append(_qpool_pattern(op))
    for n in range(2, MAX_INT8_CONCAT_INPUTS + 1):
        out.append(_qconcat_pattern(n))
    for clip in (True, False):
        out.append(_qscale_shift_pattern(clip))
    return out


def requantize_patterns() -> list[FusionPattern]:
    """A lone dequantize (u8/s8 -> float32) or quantize (float32 -> u8/s8) of an activation."""
    x = wildcard()
    dq = is_op(DEQUANTIZE)(x, is_const(), is_const())
    q = is_op(QUANTIZE)(wildcard(), is_const(), is_const())
    return [
        FusionPattern("dnnl.dequantize", dq, {"anchor": dq, "dq": dq}, _check_requantize, _requant_attrs),
        FusionPattern("dnnl.quantize", q, {"anchor": q, "q": q}, _check_requantize, _requant_attrs),
    ]


# ---- patterns ---------------------------------------------------------------------------------
def _dequantize(name: str, ann: dict, source: Any = None) -> Any:
    src = wildcard() if source is None else source
    scale, zp = is_const(), is_const()
    dq = is_op(DEQUANTIZE)(src, scale, zp)
    ann.update({f"{name}_dq": dq, f"{name}_src": src, f"{name}_scale": scale, f"{name}_zp": zp})
    return dq


def _quantize(top: Any, ann: dict) -> Any:
    scale, zp = is_const(), is_const()
    q = is_op(QUANTIZE)(top, scale, zp)
    ann.update({"q": q, "y_scale": scale, "y_zp": zp})
    return q


def _act(top: Any, act: str | None, ann: dict) -> Any:
    if act == "relu":
        top = ann["relu"] = is_op("relax.nn.relu")(top)
    elif act == "clip":
        top = ann["clip"] = is_op("relax.clip")(top, wildcard(), wildcard())
    return top


def _qconv_pattern(bias: bool, act: str | None) -> FusionPattern:
    ann: dict = {}
    x = _dequantize("x", ann)
    w = _dequantize("w", ann, is_const())
    top = conv = is_op("relax.nn.conv2d")(x, w)
    ann.update(anchor=conv, conv=conv)
    if bias:
        b = _dequantize("b", ann, is_const())
        top = is_op("relax.add")(top, is_op("relax.reshape")(b, wildcard()) | b)
    top = _quantize(_act(top, act, ann), ann)
    name = "dnnl.qconv2d" + "_bias" * bias + (f"_{act}" if act else "")
    return FusionPattern(name, top, ann, _check_qconv, _quant_attrs)


def _qmatmul_pattern(bias: bool, quantized: bool) -> FusionPattern:
    """An integer matmul (ONNX MatMul or Gemm with int8 weights); its output quantized, or, unquantized
    (a classifier's logits), float32: the accumulator times ``sx * sw``."""
    ann: dict = {}
    x = _dequantize("x", ann)
    w = _dequantize("w", ann, is_const())
    top = mm = is_op("relax.matmul")(x, is_op("relax.permute_dims")(w) | w)
    ann.update(anchor=mm, matmul=mm)
    if bias:
        top = is_op("relax.add")(top, _dequantize("b", ann, is_const()))
    name = "dnnl.qmatmul" + "_bias" * bias
    if not quantized:
        return FusionPattern(name + "_f32", top, ann, _check_qmatmul, _quant_attrs)
    return FusionPattern(name, _quantize(top, ann), ann, _check_qmatmul, _quant_attrs)


def _qadd_pattern(relu: bool) -> FusionPattern:
    ann: dict = {}
    a, b = _dequantize("a", ann), _dequantize("b", ann)
    top = add = is_op("relax.add")(a, b)
    ann.update(anchor=add, add=add)
    top = _quantize(_act(top, "relu" if relu else None, ann), ann)
    return FusionPattern("dnnl.qadd" + "_relu" * relu, top, ann, _check_qadd, _quant_attrs)


def _qpool_pattern(op: str) -> FusionPattern:
    """``quantize(pool(dequantize(x)))``: max / average pooling or a global mean on the integers,
    requantized by a linear post-op (max and mean commute with the affine dequantize)."""
    ann: dict = {}
    x = _dequantize("x", ann)
    pool = is_op(f"relax.nn.{op}" if op != "mean" else "relax.mean")(x)
    ann.update(anchor=pool, pool=pool)
    return FusionPattern(f"dnnl.qpool_{op}", _quantize(pool, ann), ann, _check_qpool, _pool_quant_attrs)


def _qconcat_pattern(n: int) -> FusionPattern:
    """``quantize(concat(dequantize(x_0), ..., dequantize(x_n-1)))``: each input requantized into
    its slice of the output."""
    ann: dict = {}
    fields = [_dequantize(f"x{i}", ann) for i in range(n)]
    concat = is_op("relax.concat")(is_tuple(fields))
    ann.update(anchor=concat, concat=concat)
    return FusionPattern(f"dnnl.qconcat{n}", _quantize(concat, ann), ann, _check_qconcat, _concat_quant_attrs)


def _qscale_shift_pattern(clip: bool) -> FusionPattern:
    """What :func:`.dnnl_int8_rewrites.fold_quantized_affine` makes of a per-channel affine unit (a
    batch norm, a multiply or an add by constants): ``quantize(clip(dequantize(x, 1, 0) * a + b), 1, 0)``."""
    ann: dict = {}
    x = _dequantize("x", ann)
    mul = is_op("relax.multiply")(x, is_const())
    top = add = is_op("relax.add")(mul, is_const())
    if clip:
        top = ann["clip"] = is_op("relax.clip")(top, wildcard(), wildcard())
    ann.update(anchor=mul, multiply=mul, add=add, data=x)
    name = "dnnl.qscale_shift" + "_clip" * clip
    return FusionPattern(name, _quantize(top, ann), ann, _check_qscale_shift, _scale_shift_quant_attrs)


# ---- checks -----------------------------------------------------------------------------------
def _value(expr: Any) -> np.ndarray:
    return expr.value.numpy()


def _per_tensor(ctx: Any, name: str, types: tuple[str, ...] = ("uint8", "int8")) -> bool:
    """An activation (or output) quantized per tensor to u8/s8."""
    e = ctx.annotated_expr
    if _value(e[f"{name}_scale"]).size != 1 or _value(e[f"{name}_zp"]).size != 1:
        return False
    src = e[f"{name}_src"] if name != "y" else e["q"]
    return str(src.ty.dtype) in types


def _check_activation_and_output(ctx: Any) -> bool:
    """x per tensor, and the output: per tensor, or not quantized at all (float32)."""
    return _per_tensor(ctx, "x") and ("q" not in ctx.annotated_expr or _per_tensor(ctx, "y"))


def _weights_ok(ctx: Any, channels: int, axis: int) -> bool:
    """int8 weights, zero point 0, one scale or one per output channel along ``axis``."""
    e = ctx.annotated_expr
    dq = e["w_dq"]
    if str(e["w_src"].ty.dtype) != "int8" or np.any(_value(e["w_zp"])):
        return False
    scale = _value(e["w_scale"])
    if scale.size == 1:
        return True
    ndim = len(e["w_src"].ty.shape.values)
    return scale.size == channels and int(dq.attrs.axis) % ndim == axis


def _bias_ok(ctx: Any) -> bool:
    """An int32 bias in the accumulator's units: its scale is the activation's times the weights'."""
    e = ctx.annotated_expr
    if "b_src" not in e:
        return True
    if str(e["b_src"].ty.dtype) != "int32" or np.any(_value(e["b_zp"])):
        return False
    want = _value(e["x_scale"]).astype(np.float64) * _value(e["w_scale"]).astype(np.float64)
    got = _value(e["b_scale"]).astype(np.float64)
    return bool(np.allclose(np.broadcast_to(got, np.broadcast_shapes(got.shape, want.shape)), want, rtol=1e-5))


def _check_qconv(ctx: Any) -> bool:
    if has_leaking_intermediate_variables(ctx) or not _check_activation_and_output(ctx):
        return False
    a = ctx.annotated_expr["conv"].attrs
    if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return False
    out = ctx.annotated_expr["conv"].ty.shape.values
    return len(out) == 4 and _weights_ok(ctx, int(out[1]), 0) and _bias_ok(ctx) and _clip_ok(ctx)


def _check_qmatmul(ctx: Any) -> bool:
    if has_leaking_intermediate_variables(ctx) or not _check_activation_and_output(ctx):
        return False
    mm = ctx.annotated_expr["matmul"]
    w = ctx.annotated_expr["w_src"]
    x_shape = mm.args[0].ty.shape.values
    if len(w.ty.shape.values) != 2 or not 2 <= len(x_shape) <= 5:
        return False
    # The matmul reads a variable: what it is bound to says whether the weight is transposed (Gemm).
    bound = ctx.matched_bindings.get(mm.args[1], mm.args[1])
    transposed = isinstance(bound, relax.Call) and bound.op.name == "relax.permute_dims"
    if transposed and (bound.attrs.axes is None or [int(v) for v in bound.attrs.axes] != [1, 0]):
        return False  # only a permute_dims swapping the two axes is a transposed weight
    n = int(mm.ty.shape.values[-1])
    return _weights_ok(ctx, n, 0 if transposed else 1) and _bias_ok(ctx)


def _check_qadd(ctx: Any) -> bool:
    if has_leaking_intermediate_variables(ctx):
        return False
    if not (_per_tensor(ctx, "a") and _per_tensor(ctx, "b") and _per_tensor(ctx, "y")):
        return False
    add = ctx.annotated_expr["add"]
    shapes = [tuple(int(d) for d in v.ty.shape.values) for v in (add.args[0], add.args[1], add)]
    return shapes[0] == shapes[1] == shapes[2] and 1 <= len(shapes[0]) <= 5


def _check_qpool(ctx: Any) -> bool:
    if has_leaking_intermediate_variables(ctx) or not _check_activation_and_output(ctx):
        return False
    e = ctx.annotated_expr
    pool = e["pool"]
    shape = _shape(pool.args[0])
    if shape is None or len(shape) != 4:
        return False
    if pool.op.name == "relax.mean":
        axes = pool.attrs.axis
        return axes is not None and bool(pool.attrs.keepdims) and sorted(int(a) % 4 for a in axes) == [2, 3]
    a = pool.attrs
    if a.layout != "NCHW" or a.out_layout != "NCHW" or bool(a.ceil_mode):
        return False
    # Padding counted in an average is float 0.0, the integer zero point: only that is what oneDNN pads.
    padded = any(int(p) for p in a.padding)
    return not (pool.op.name == "relax.nn.avg_pool2d" and bool(a.count_include_pad) and padded
                and _scalar(e["x_zp"]) != 0)


def _check_qconcat(ctx: Any) -> bool:
    if has_leaking_intermediate_variables(ctx) or not _per_tensor(ctx, "y"):
        return False
    e = ctx.annotated_expr
    n = len(e["concat"].args[0].fields)
    if not all(_per_tensor(ctx, f"x{i}") for i in range(n)):
        return False
    shape = _shape(e["concat"])
    return shape is not None and 1 <= len(shape) <= 5


def _check_qscale_shift(ctx: Any) -> bool:
    """Only the form :func:`fold_quantized_affine` writes: unit scales, zero points 0, vectors of
    one value per channel of an NCHW tensor."""
    if has_leaking_intermediate_variables(ctx) or not _check_activation_and_output(ctx):
        return False
    e = ctx.annotated_expr
    for name in ("x", "y"):
        if _scalar(e[f"{name}_scale"]) != 1.0 or _scalar(e[f"{name}_zp"]) != 0:
            return False
    shape = _shape(e["x_src"])
    if shape is None or len(shape) != 4:
        return False
    for role in ("multiply", "add"):
        v = _shape(e[role].args[1])
        if v != (1, shape[1], 1, 1) or str(e[role].args[1].ty.dtype) != "float32":
            return False
    return _clip_ok(ctx)


def _shape(expr: Any) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    if not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
        return None
    return tuple(int(d) for d in ty.shape.values)


def _clip_ok(ctx: Any) -> bool:
    clip = ctx.annotated_expr.get("clip")
    return clip is None or all(isinstance(a, tvm.ir.Constant) or hasattr(a, "value") for a in clip.args[1:])


def _check_requantize(ctx: Any) -> bool:
    e = ctx.annotated_expr
    call = e.get("dq", e.get("q"))
    if _value(call.args[1]).size != 1 or _value(call.args[2]).size != 1:
        return False
    src = call.args[0]
    if isinstance(src, tvm.ir.Constant):
        return False  # weights are the integer units' business (or folded by prepare_qdq)
    quantized = src if "dq" in e else call
    shape = quantized.ty.shape
    return str(quantized.ty.dtype) in _TYPES and shape is not None and 1 <= len(shape.values) <= 5


# ---- the quant document of a match ------------------------------------------------------------
def _scalar(expr: Any) -> float:
    return float(_value(expr).reshape(-1)[0])


def _quant_attrs(matched: dict) -> dict[str, str]:
    """``quant`` of an integer unit (its constants arrive as composite parameters, so they are
    recorded on the composite): output scales, zero points and the output type."""
    quantized = "q" in matched  # else a float32 output: y_scale 1, no zero point
    y_scale = _scalar(matched["y_scale"]) if quantized else 1.0
    quant: dict[str, Any] = {
        "dst_type": _TYPES[str(matched["q"].ty.dtype)] if quantized else "f32",
        "dst_zero_point": int(_scalar(matched["y_zp"])) if quantized else 0,
    }
    if "add" in matched:
        sa, sb = _scalar(matched["a_scale"]), _scalar(matched["b_scale"])
        za, zb = _scalar(matched["a_zp"]), _scalar(matched["b_zp"])
        quant["scales"] = [sa / y_scale, sb / y_scale]
        quant["shift"] = -(sa * za + sb * zb) / y_scale
    else:
        # In float32, in ONNX Runtime's order ((sx * sw) / sy, its QLinearConv / QLinearMatMul): a
        # multiplier one ulp off flips the rounding of accumulators that sit on a half.
        x_scale, y32 = np.float32(_scalar(matched["x_scale"])), np.float32(y_scale)
        w_scale = _value(matched["w_scale"]).astype(np.float32).reshape(-1)
        quant["scales"] = [float(v) for v in (x_scale * w_scale) / y32]
        quant["src_zero_point"] = int(_scalar(matched["x_zp"]))
    return {QUANT_ATTR: json.dumps(quant)}


def _pool_quant_attrs(matched: dict) -> dict[str, str]:
    """Pooling on the integers: ``pool(x) * sx / sy + (zy - zx * sx / sy)``."""
    scale = _scalar(matched["x_scale"]) / _scalar(matched["y_scale"])
    shift = _scalar(matched["y_zp"]) - _scalar(matched["x_zp"]) * scale
    quant = {"dst_type": _TYPES[str(matched["q"].ty.dtype)], "scales": [scale], "shift": shift}
    return {QUANT_ATTR: json.dumps(quant)}


def _concat_quant_attrs(matched: dict) -> dict[str, str]:
    """Each input's scale relative to the output's and its zero point."""
    n = len(matched["concat"].args[0].fields)
    y_scale = _scalar(matched["y_scale"])
    quant = {"dst_type": _TYPES[str(matched["q"].ty.dtype)],
             "scales": [_scalar(matched[f"x{i}_scale"]) / y_scale for i in range(n)],
             "src_zero_points": [int(_scalar(matched[f"x{i}_zp"])) for i in range(n)],
             "dst_zero_point": int(_scalar(matched["y_zp"]))}
    return {QUANT_ATTR: json.dumps(quant)}


def _scale_shift_quant_attrs(matched: dict) -> dict[str, str]:
    return {QUANT_ATTR: json.dumps({"dst_type": _TYPES[str(matched["q"].ty.dtype)], "scales": [1.0]})}


def _requant_attrs(matched: dict) -> dict[str, str]:
    if "dq" in matched:
        call = matched["dq"]
        quant = {"dst_type": "f32", "scales": [_scalar(call.args[1])], "src_zero_point": int(_scalar(call.args[2]))}
    else:
        call = matched["q"]
        quant = {"dst_type": _TYPES[str(call.ty.dtype)], "scales": [_scalar(call.args[1])],
                 "dst_zero_point": int(_scalar(call.args[2]))}
    return {QUANT_ATTR: json.dumps(quant)}


def describe_int8(composite: relax.Function, pattern: str) -> dict:
    """The region document of an integer unit or a lone (de)quantize (docs/byoc.md)."""
    index = {p: i for i, p in enumerate(composite.params)}
    bound: dict[Any, Any] = {}
    spec: dict[str, Any] = {"num_inputs": len(composite.params)}
    spec["quant"] = json.loads(str(composite.attrs[QUANT_ATTR]))

    def source(expr: Any) -> int:
        """Input position of what ``expr`` carries: through reshape / permute_dims / dequantize."""
        while expr not in index:
            value = bound[expr]
            expr = value.args[0]
        return index[expr]

    for block in composite.body.blocks:
        for b in block.bindings:
            value = b.value
            bound[b.var] = value
            op = value.op.name
            if pattern in ("dnnl.dequantize", "dnnl.quantize"):
                spec.update(op=op.removeprefix("relax."), data=source(value.args[0]))
            elif op == "relax.nn.conv2d":
                a = value.attrs
                spec.update(op="conv2d", data=source(value.args[0]), weight=source(value.args[1]),
                            groups=int(a.groups), **{n: [int(v) for v in getattr(a, n)]
                                                     for n in ("strides", "padding", "dilation")})
            elif op == "relax.matmul":
                w = bound.get(value.args[1])
                spec.update(op="matmul", data=source(value.args[0]), weight=source(value.args[1]),
                            weight_transposed=w is not None and w.op.name == "relax.permute_dims")
            elif pattern.startswith("dnnl.qpool"):
                if op == "relax.mean":
                    h, w = _shape(value.args[0])[2:]
                    spec.update(op="avg_pool2d", data=source(value.args[0]), pool_size=[h, w], strides=[1, 1],
                                padding=[0, 0, 0, 0], dilation=[1, 1], count_include_pad=False)
                elif op != DEQUANTIZE and op != QUANTIZE:
                    a = value.attrs
                    spec.update(op=op.removeprefix("relax.nn."), data=source(value.args[0]),
                                count_include_pad=bool(a.count_include_pad),
                                **{n: [int(v) for v in getattr(a, n)]
                                   for n in ("strides", "padding", "dilation", "pool_size")})
            elif op == "relax.concat":
                rank = len(_shape(value))
                spec.update(op="concat", axis=int(value.attrs.axis) % rank,
                            inputs=[source(f) for f in value.args[0].fields])
            elif pattern.startswith("dnnl.qscale_shift"):
                if op == DEQUANTIZE:
                    spec.update(op="scale_shift", data=source(value.args[0]))
                elif op == "relax.multiply":
                    spec["weight"] = source(value.args[1])
                elif op == "relax.add":
                    spec["bias"] = source(value.args[1])
                elif op == "relax.clip":
                    lo, hi = (float(_value(a)) if isinstance(a, tvm.ir.Constant) else float(a.value)
                              for a in value.args[1:])
                    spec.update(activation="clip", alpha=lo, beta=hi)
            elif op == "relax.add" and pattern.startswith("dnnl.qadd"):
                spec.update(op="add", inputs=[source(value.args[0]), source(value.args[1])])
            elif op == "relax.add":
                spec["bias"] = source(value.args[1])
            elif op == "relax.nn.relu":
                spec["relu"] = True
            elif op == "relax.clip":
                lo, hi = (float(_value(a)) if isinstance(a, tvm.ir.Constant) else float(a.value)
                          for a in value.args[1:])
                spec.update(activation="clip", alpha=lo, beta=hi)
    return spec


# ---- prepare ----------------------------------------------------------------------------------
#: Readers of a dequantized constant that keep it quantized (the integer units' weights), and those
#: of an int32 one (a bias, added after a reshape).
_KEEPS_QUANTIZED = frozenset({"relax.nn.conv2d", "relax.matmul", "relax.permute_dims", "relax.reshape"})
_KEEPS_BIAS = frozenset({"relax.add", "relax.reshape"})
#: Readers of a dequantized activation that get their own copy of it (each integer unit's own).
_OWN_COPY = frozenset({"relax.nn.conv2d", "relax.matmul", "relax.add", "relax.nn.max_pool2d", "relax.nn.avg_pool2d",
                       "relax.mean", "relax.concat"})


def fold_param_dequantize(entry: str = "main") -> tvm.transform.Pass:
    """A dequantize of a constant that no integer unit reads (a batch norm's scale and shift)
    becomes a float32 constant, so the float rewrites (batch-norm folding) see constants. Run it
    before them."""
    return _qdq_pass(entry, fold=True, name="FoldParamDequantize")


def unshare_qdq(entry: str = "main") -> tvm.transform.Pass:
    """Every conv / matmul / add reading a dequantized activation gets its own copy of the
    dequantize, and every quantize and dequantize its own scale and zero point constants (a
    pattern match takes a value or a constant object into one match only). Run it last: rewrites
    by ``rewrite_call`` merge equal bindings again."""
    return _qdq_pass(entry, fold=False, name="UnshareQdq")


def _qdq_pass(entry: str, fold: bool, name: str) -> tvm.transform.Pass:
    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        func = mod[entry]
        values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
        dqs = {v: x for v, x in values.items() if _op(x) == DEQUANTIZE}
        if not dqs:
            return mod
        readers: dict[Any, list[str]] = {v: [] for v in dqs}
        for x in values.values():
            for arg in _args(x):
                if arg in readers:
                    readers[arg].append(_op(x))
        folded = {}
        if fold:
            for v, x in dqs.items():
                src = x.args[0]
                if isinstance(src, tvm.ir.Constant) and not _stays_quantized(x, readers[v]):
                    folded[v] = _fold(x)
            if not folded:
                return mod
        blocks = []
        for block in func.body.blocks:
            bindings = []
            for b in block.bindings:
                value = b.value
                if isinstance(value, relax.Call) and isinstance(block, relax.DataflowBlock):
                    copy_own = not fold and _op(value) in _OWN_COPY
                    args = [relax.Tuple([_remap(f, folded, dqs, copy_own, bindings) for f in arg.fields])
                            if isinstance(arg, relax.Tuple) else _remap(arg, folded, dqs, copy_own, bindings)
                            for arg in value.args]
                    if not fold and _op(value) in (DEQUANTIZE, QUANTIZE):
                        args[1:3] = [_fresh(a) for a in args[1:3]]
                    value = relax.Call(value.op, args, value.attrs, value.ty_args)
                bindings.append(relax.VarBinding(b.var, value) if isinstance(b, relax.VarBinding) else b)
            blocks.append(same_kind_block(block, bindings))
        mod = mod.clone()
        mod[entry] = replace_body(func, blocks)
        return relax.transform.DeadCodeElimination([entry])(mod)

    return tvm.transform.module_pass(run, opt_level=0, name=name)


def _stays_quantized(dq: relax.Call, readers: list[str]) -> bool:
    """Whether a dequantized constant is one an integer unit takes as it is: int8 weights with zero
    points 0 read by a conv / matmul (through a transpose or reshape), or an int32 bias. Any other
    (uint8 weights with a zero point, a batch norm's scale) is folded into a float constant."""
    dtype = str(dq.args[0].ty.dtype)
    if dtype == "int32":
        return all(r in _KEEPS_BIAS | _KEEPS_QUANTIZED for r in readers)
    zero = isinstance(dq.args[2], tvm.ir.Constant) and not np.any(_value(dq.args[2]))
    return dtype == "int8" and zero and all(r in _KEEPS_QUANTIZED for r in readers)


def _fresh(expr: Any) -> Any:
    """A constant of its own: pattern matching takes a constant object into one match only, and the
    frontend gives a quantize and the dequantizes reading it the same scale and zero point."""
    return relax.const(expr.value.numpy()) if isinstance(expr, tvm.ir.Constant) else expr


def _remap(arg: Any, fold: dict, dqs: dict, copy_own: bool, bindings: list) -> Any:
    if isinstance(arg, relax.Var) and arg in fold:
        return fold[arg]
    if copy_own and isinstance(arg, relax.Var) and arg in dqs and not isinstance(dqs[arg].args[0], tvm.ir.Constant):
        copy = relax.DataflowVar(arg.name, arg.ty)
        dq = dqs[arg]
        bindings.append(relax.VarBinding(copy, relax.Call(dq.op, [dq.args[0], *map(_fresh, dq.args[1:])], dq.attrs)))
        return copy
    return arg


def _fold(call: relax.Call) -> Any:
    """``dequantize(constant)`` as a float32 constant (per tensor or along its axis)."""
    q = _value(call.args[0]).astype(np.float64)
    scale, zp = _value(call.args[1]).astype(np.float64), _value(call.args[2]).astype(np.float64)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[int(call.attrs.axis) % q.ndim] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape) if zp.size > 1 else zp
    return relax.const(((q - zp) * scale).astype(np.float32))


def _op(value: Any) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


def _args(value: Any) -> list[Any]:
    if not isinstance(value, relax.Call):
        return []
    out = []
    for a in value.args:
        out.extend(a.fields if isinstance(a, relax.Tuple) else [a])
    return out


# ---- the build report: dnnl_int8_report.py (importable from here too) --------------------------
from .dnnl_int8_report import qdq_report  # noqa: F401
