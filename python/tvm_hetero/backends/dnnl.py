"""The oneDNN backend: conv2d and matmul with fused bias / residual sum / activation, pooling,
channel shuffle, softmax, layer norm, concat, LRN, per-channel scale + shift and batched matmul;
consecutive regions are joined into blocks (:mod:`.merge_regions`) unless ``merge=False``.

- ``prepare`` folds per-channel affine ops into convolutions whose weights are constants:
  ``batch_norm`` (inference), ``multiply`` and ``add`` by per-channel constants become the
  convolution's weights and bias (:func:`tvm_hetero.ir.prepare_passes.FoldConvAffine`), and ONNX's two-input ``Sum``
  (``sum(stack(broadcast_to(a), broadcast_to(b)))``) becomes ``add(a, b)`` so it can be fused as a
  residual (:class:`SimplifyStackSum`). A reshape of a constant read by several ops (rewrites
  merge the reshapes of equal biases) is copied per reader (:class:`UnshareConstantReshapes`), so
  each conv can take its bias in without leaking it to the other reader. Batch norms no conv took
  become ``x * scale + shift`` (:class:`FoldChannelAffine`); inference dropout and ``broadcast_to``
  a tensor's own shape are dropped (:class:`DropNoOps`).
- ``patterns``: ``conv2d [+bias] [+residual] [+activation]`` (NCHW/OIHW, any strides, padding,
  dilation and groups), ``matmul [+bias] [+activation]`` on data of rank 2-5 with a (K, N) or
  transposed (N, K) weight (activation: relu, clip, sigmoid, hardswish, gelu, gelu_tanh, silu),
  ``max_pool2d`` and ``avg_pool2d`` (NCHW, no ceil mode), ShuffleNet's channel shuffle
  (reshape-transpose-reshape, run as one reorder), ``softmax`` and last-axis ``layer_norm``,
  ``concat [+relu]`` of 2-64 tensors, a global ``mean`` over H, W (an average pooling), the
  frontends' LRN decomposition, ``x * scale + shift [+relu]`` per channel, and ``matmul`` of two
  computed tensors of rank 3-4 (attention).
  Conv and matmul weights and biases must be weights (constants or params), so the runtime may
  keep them reordered. Every pattern annotates its anchor op as ``"anchor"``.
- ``codegen``: one ``tvm_hetero_dnnl`` module (src/backends/dnnl_region_module.cc) holding every
  region's description as JSON; it builds the primitives on first call and is binary-serializable.
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

from ..ir.constant_values import scalar_value
from ..ir.patterns import LRN_ATTR, lrn_pattern
from ..ir.prepare_passes import (
    DropNoOps,
    FoldChannelAffine,
    FoldConvAffine,
    SimplifyStackSum,
    UnshareConstantReshapes,
)
from ..ir.relax_helpers import all_float32, expr_shape
from .base import Backend, Region, WeightPredicate
from .dnnl_int8 import (
    INT8_PATTERNS,
    describe_int8,
    fold_param_dequantize,
    int8_patterns,
    requantize_patterns,
    unshare_qdq,
)
from .dnnl_int8_rewrites import fold_quantized_affine, simplify_qdq
from .dnnl_int8_weights import PATTERN as INT8_WEIGHT_PATTERN
from .dnnl_int8_weights import describe_int8_weight_matmul, int8_weight_matmul_patterns

_FORMAT = "tvm-hetero-dnnl/1"
_F32_MAX = float(np.finfo(np.float32).max)


class DnnlBackend(Backend):
    """oneDNN (libdnnl) on the CPU; available when libtvm_hetero was built with it."""

    name = "dnnl"

    def __init__(
        self,
        device: int | None = 0,
        min_flops: float = 0.0,
        devices: Any = None,
        merge: bool = True,
    ) -> None:
        # Blocks by default: they keep oneDNN's layouts between primitives (False: one region per
        # composite, reordered in and out at each; for comparisons and pipeline stages).
        super().__init__(device, min_flops, devices, merge)

    def available(self) -> bool:
        return bool(tvm.get_global_func("tvm_hetero.dnnl.available")())

    def patterns(self, is_weight: WeightPredicate) -> list[FusionPattern]:
        out = int8_patterns()  # QDQ units first: they take their dequantizes and quantize
        out += int8_weight_matmul_patterns(is_weight)  # float data, 8-bit weights (tvm_hetero.llm)
        for bias in (True, False):
            # The residual's two operand orders are separate patterns: when one order's match is
            # rejected (e.g. it would swallow a value read outside), the other is still tried.
            for residual in ("left", "right", None):
                for act in ACTIVATIONS:
                    out.append(self._conv_pattern(bias, residual, act, is_weight))
        for bias in (True, False):
            for act in ACTIVATIONS:
                out.append(self._matmul_pattern(bias, act, is_weight))
        bmm = is_op("relax.matmul")(wildcard(), wildcard())
        out.append(FusionPattern("dnnl.batch_matmul", bmm, {"anchor": bmm}, _check_batch_matmul))
        out.append(_channel_shuffle_pattern())
        norm = is_op("relax.nn.layer_norm")(wildcard(), wildcard(), wildcard())
        out.append(FusionPattern("dnnl.layer_norm", norm, {"anchor": norm}, _check_layer_norm))
        softmax = is_op("relax.nn.softmax")(wildcard())
        out.append(FusionPattern("dnnl.softmax", softmax, {"anchor": softmax}, _check_softmax))
        for op in ("max_pool2d", "avg_pool2d"):
            pool = is_op(f"relax.nn.{op}")(wildcard())
            out.append(FusionPattern(f"dnnl.{op}", pool, {"anchor": pool}, _check_pool))
        out.append(lrn_pattern("dnnl.lrn", _check_lrn))
        for act in ("relu", None):
            out.append(_scale_shift_pattern(act, is_weight))
        mean = is_op("relax.mean")(wildcard())
        out.append(FusionPattern("dnnl.global_avg_pool2d", mean, {"anchor": mean}, _check_global_mean))
        for n in range(2, MAX_CONCAT_INPUTS + 1):
            concat = is_op("relax.concat")(is_tuple([wildcard() for _ in range(n)]))
            ann = {"anchor": concat, "concat": concat}
            relu = _activation(concat, "relu", ann)  # ShuffleNet's concat then ReLU
            out.append(FusionPattern(f"dnnl.concat{n}_relu", relu, ann, _check_concat))
            ann = {"anchor": concat, "concat": concat}
            out.append(FusionPattern(f"dnnl.concat{n}", concat, ann, _check_concat))
        return out + requantize_patterns()  # last: what QDQ is left around float regions

    def prepare(self, mod: tvm.IRModule, entry: str) -> tvm.IRModule:
        mod = simplify_qdq(entry)(mod)  # quantized constants as constants
        mod = fold_param_dequantize(entry)(mod)  # a QDQ model's batch norm constants as floats
        mod = SimplifyStackSum(entry)(mod)  # before DropNoOps: it matches the broadcasts
        mod = DropNoOps(entry)(mod)
        mod = simplify_qdq(entry)(mod)  # what a dropped op leaves: quantize(dequantize(x)) is x
        mod = FoldConvAffine(entry)(mod)
        mod = FoldChannelAffine(entry)(mod)
        mod = fold_quantized_affine(entry)(mod)  # per-channel affine QDQ units in integer units
        mod = UnshareConstantReshapes(entry)(mod)
        return unshare_qdq(entry)(mod)  # last: the rewrites above merge equal bindings

    def describe(self, composite: relax.Function, pattern: str) -> dict:
        if pattern.startswith(INT8_WEIGHT_PATTERN):
            return describe_int8_weight_matmul(composite)
        if pattern.startswith(INT8_PATTERNS) or pattern in ("dnnl.quantize", "dnnl.dequantize"):
            return describe_int8(composite, pattern)
        return _describe(composite, pattern)

    def codegen(self, regions: list[Region]) -> tvm.runtime.Module:
        doc = json.dumps({"format": _FORMAT, "regions": [r.spec for r in regions]})
        return tvm.get_global_func("tvm_hetero.dnnl.create_module")(doc)

    # -- patterns --
    def _conv_pattern(
        self, bias: bool, residual: str | None, act: str | None, is_weight: WeightPredicate
    ) -> FusionPattern:
        """``residual``: None, or which operand of the residual add the conv is (left / right)."""
        data, weight = wildcard(), wildcard()
        top = conv = is_op("relax.nn.conv2d")(data, weight)
        ann = {"conv": conv, "anchor": conv, "weight": weight}
        if bias:
            top, ann["bias_add"], ann["bias"] = _bias_add(top)
        if residual:
            res = wildcard()
            operands = (top, res) if residual == "left" else (res, top)
            top = ann["residual_add"] = is_op("relax.add")(*operands)
            ann["residual"] = res
        top = _activation(top, act, ann)
        name = "dnnl.conv2d" + "_bias" * bias + "_residual" * bool(residual) + (f"_{act}" if act else "")
        return FusionPattern(name, top, ann, lambda ctx: self._check_conv(ctx, is_weight))

    def _matmul_pattern(self, bias: bool, act: str | None, is_weight: WeightPredicate) -> FusionPattern:
        data, weight_src = wildcard(), wildcard()
        panels = is_op("relax.reshape")(is_op("relax.permute_dims")(weight_src), wildcard())  # weight_panels
        weight = is_op("relax.permute_dims")(weight_src) | panels | weight_src
        top = mm = is_op("relax.matmul")(data, weight)
        ann = {"matmul": mm, "anchor": mm, "weight": weight_src}
        if bias:
            top, ann["bias_add"], ann["bias"] = _bias_add(top)
        top = _activation(top, act, ann)
        name = "dnnl.matmul" + "_bias" * bias + (f"_{act}" if act else "")
        return FusionPattern(name, top, ann, lambda ctx: self._check_matmul(ctx, is_weight))

    def _check_conv(self, ctx: Any, is_weight: WeightPredicate) -> bool:
        if has_leaking_intermediate_variables(ctx) or not _check_activation(ctx):  # one output
            return False
        conv = ctx.annotated_expr["conv"]
        a = conv.attrs
        if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW"):
            return False
        if a.out_dtype not in (None, "", "float32") and str(a.out_dtype) not in ("", "float32"):
            return False
        if not all_float32(conv.args[0], conv.args[1], conv) or not is_weight(ctx.annotated_expr["weight"]):
            return False
        out = expr_shape(conv)
        if out is None or len(out) != 4:
            return False
        w = expr_shape(conv.args[1])
        flops = 2.0 * np.prod(out) * np.prod(w[1:])
        if flops < self.min_flops:
            return False
        if "bias" in ctx.annotated_expr and not _is_channel_bias(ctx, is_weight, out[1], rank=4):
            return False
        if "residual" in ctx.annotated_expr:
            res = ctx.annotated_expr["residual"]
            if expr_shape(res) != out or not all_float32(res):
                return False
        return True

    def _check_matmul(self, ctx: Any, is_weight: WeightPredicate) -> bool:
        if has_leaking_intermediate_variables(ctx) or not _check_activation(ctx):  # one output
            return False
        mm = ctx.annotated_expr["matmul"]
        x, w, out = expr_shape(mm.args[0]), expr_shape(mm.args[1]), expr_shape(mm)
        # data of rank 2-5 (a transformer's (batch, tokens, features)) is read as 2-D: rows x K
        if x is None or w is None or not 2 <= len(x) <= 5 or len(w) != 2:
            return False
        if not all_float32(mm.args[0], mm.args[1], mm):
            return False
        weight_arg = mm.args[1]
        if isinstance(weight_arg, relax.Var):
            bound = ctx.matched_bindings.get(weight_arg)
            if bound is not None and isinstance(bound, relax.Call) and bound.op.name == "relax.permute_dims":
                axes = bound.attrs.axes
                if axes is not None and [int(v) for v in axes] != [1, 0]:
                    return False
            if weight_panels(weight_arg, ctx.matched_bindings) < 0:
                return False
        if not is_weight(ctx.annotated_expr["weight"]):
            return False
        if 2.0 * np.prod(x) * w[1] < self.min_flops:
            return False
        return "bias" not in ctx.annotated_expr or _is_last_axis_bias(ctx, is_weight, out)


def set_num_threads(threads: int) -> None:
    """Threads oneDNN (OpenMP) uses for calls from this thread."""
    tvm.get_global_func("tvm_hetero.dnnl.set_num_threads")(int(threads))


def info() -> dict:
    """``{"available", "version", "cpu_runtime", "threads", "scratch_bytes"}`` of the oneDNN in
    libtvm_hetero; ``scratch_bytes``: the per-thread scratch (region arenas) now allocated."""
    return json.loads(tvm.get_global_func("tvm_hetero.dnnl.info")())


# ---- pattern helpers ------------------------------------------------------------------------
#: Activations fused as the last post-op of a conv or matmul region (None: no activation).
#: ``clip`` covers ReLU6 and hardtanh; ``hardswish`` is the frontends' decomposition
#: ``x * clip(x + 3, 0, 6) / 6``.
ACTIVATIONS = ("relu", "clip", "sigmoid", "hardswish", "gelu", "gelu_tanh", "silu", None)
_UNARY_ACTIVATIONS = {
    "relu": "relax.nn.relu",
    "sigmoid": "relax.sigmoid",
    "gelu": "relax.nn.gelu",
    "gelu_tanh": "relax.nn.gelu_tanh",
    "silu": "relax.nn.silu",
}


def _activation(top: Any, act: str | None, ann: dict) -> Any:
    """``act`` applied to ``top``; the activation's root call is annotated as ``"activation"``."""
    if act is None:
        return top
    if act in _UNARY_ACTIVATIONS:
        out = is_op(_UNARY_ACTIVATIONS[act])(top)
    elif act == "clip":
        out = is_op("relax.clip")(top, wildcard(), wildcard())
    else:  # hardswish: top * clip(top + 3, 0, 6) / 6
        three, six = is_const(), is_const()
        clip = is_op("relax.clip")(is_op("relax.add")(top, three), wildcard(), wildcard())
        out = is_op("relax.multiply")(top, is_op("relax.divide")(clip, six))
        ann.update(hs_three=three, hs_six=six, hs_clip=clip)
    ann["activation"] = out
    return out


def _check_activation(ctx: Any) -> bool:
    """Clip bounds are numbers; hardswish's constants are 3, (0, 6) and 6."""
    ann = ctx.annotated_expr
    if "activation" not in ann:
        return True
    act = ann["activation"]
    if "hs_clip" in ann:
        return (
            _scalar(ann["hs_three"]) == 3.0
            and _scalar(ann["hs_six"]) == 6.0
            and _clip_bounds(ann["hs_clip"]) == (0.0, 6.0)
        )
    if act.op.name == "relax.clip":
        return _clip_bounds(act) is not None
    return True


def _scalar(expr: Any) -> float | None:
    return scalar_value(expr)


def _clip_bounds(call: relax.Call) -> tuple[float, float] | None:
    """The (min, max) of a ``relax.clip`` whose bounds are numbers."""
    bounds = []
    for arg in call.args[1:3]:
        value = arg
        for _ in range(2):  # a PrimValue holding an IntImm / FloatImm holding a number
            value = getattr(value, "value", value)
        if not isinstance(value, (int, float)):
            return None
        bounds.append(float(value))
    return bounds[0], bounds[1]


def _bias_add(top: Any) -> tuple[Any, Any, Any]:
    """``add(top, bias)`` or ``add(bias, top)`` (torch's linear), where the bias may be reshaped
    on the way (ONNX Conv's B)."""
    src = wildcard()
    bias = is_op("relax.reshape")(src, wildcard()) | src
    add = is_op("relax.add")(top, bias) | is_op("relax.add")(bias, top)
    return add, add, src


def _bias_operand(ctx: Any) -> Any:
    """The operand of the bias add that is not computed inside the match (the bias, or its reshape)."""
    add = ctx.annotated_expr["bias_add"]
    bias = ctx.annotated_expr["bias"]
    for arg in add.args:
        value = ctx.matched_bindings.get(arg) if isinstance(arg, relax.Var) else None
        if arg.same_as(bias) or (
            isinstance(value, relax.Call) and value.op.name == "relax.reshape" and value.args[0].same_as(bias)
        ):
            return arg
    return add.args[1]


def _is_channel_bias(ctx: Any, is_weight: WeightPredicate, channels: int, rank: int) -> bool:
    if not is_weight(ctx.annotated_expr["bias"]):
        return False
    operand = _bias_operand(ctx)
    shape = expr_shape(operand)
    if shape is None or len(shape) > rank or not all_float32(operand):
        return False
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    want = (1, channels) + (1,) * (rank - 2)
    return padded == want


def _is_last_axis_bias(ctx: Any, is_weight: WeightPredicate, out: tuple[int, ...]) -> bool:
    """A weight of shape (..., 1, N) broadcast along every axis of ``out`` but the last."""
    if not is_weight(ctx.annotated_expr["bias"]):
        return False
    operand = _bias_operand(ctx)
    shape = expr_shape(operand)
    if shape is None or len(shape) > len(out) or not all_float32(operand):
        return False
    return (1,) * (len(out) - len(shape)) + tuple(shape) == (1,) * (len(out) - 1) + (out[-1],)


def _check_batch_matmul(ctx: Any) -> bool:
    """(..., M, K) @ (..., K, N) of two float32 tensors of rank 3-4 with equal batch dims (attention)."""
    call = ctx.matched_expr
    a, b = expr_shape(call.args[0]), expr_shape(call.args[1])
    if a is None or b is None or len(a) != len(b) or not 3 <= len(a) <= 4:
        return False
    return a[:-2] == b[:-2] and a[-1] == b[-2] and all_float32(*call.args, call)


def _channel_shuffle_pattern() -> FusionPattern:
    """ShuffleNet's channel shuffle: reshape to (N, g, C/g, H, W), swap axes 1 and 2, reshape back."""
    x = wildcard()
    grouped = is_op("relax.reshape")(x, wildcard())
    swapped = is_op("relax.permute_dims")(grouped)
    out = is_op("relax.reshape")(swapped, wildcard())
    ann = {"anchor": swapped, "data": x, "grouped": grouped, "swapped": swapped}
    return FusionPattern("dnnl.channel_shuffle", out, ann, _check_channel_shuffle)


def _check_channel_shuffle(ctx: Any) -> bool:
    if has_leaking_intermediate_variables(ctx):
        return False
    ann = ctx.annotated_expr
    x, grouped, out = expr_shape(ann["data"]), expr_shape(ann["grouped"]), expr_shape(ctx.matched_expr)
    axes = ann["swapped"].attrs.axes
    dtype = getattr(getattr(ann["data"], "ty", None), "dtype", None)
    if x is None or grouped is None or len(x) != 4 or out != x or str(dtype) not in ("float32", "uint8", "int8"):
        return False  # data movement: a QDQ model's shuffle moves its u8 / s8 values as they are
    n, c, h, w = x
    g = grouped[1] if len(grouped) == 5 else 0
    return (
        axes is not None
        and [int(a) for a in axes] == [0, 2, 1, 3, 4]
        and g > 0
        and grouped == (n, g, c // g, h, w)
    )


def _check_layer_norm(ctx: Any) -> bool:
    """Over the last axis only, with scale and shift, each a vector of the last axis' size."""
    call = ctx.matched_expr
    a = call.attrs
    shape = expr_shape(call.args[0])
    if shape is None or not 2 <= len(shape) <= 5 or not (bool(a.center) and bool(a.scale)):
        return False
    if [int(v) % len(shape) for v in a.axes] != [len(shape) - 1] or not all_float32(*call.args, call):
        return False
    return all(expr_shape(v) is not None and int(np.prod(expr_shape(v))) == shape[-1] for v in call.args[1:3])


def _check_softmax(ctx: Any) -> bool:
    call = ctx.matched_expr
    shape = expr_shape(call.args[0])
    return shape is not None and 1 <= len(shape) <= 5 and all_float32(call.args[0], call)


#: The most inputs a concat region takes (one pattern per count).
MAX_CONCAT_INPUTS = 64


def _check_concat(ctx: Any) -> bool:
    """Tensors of rank 1-5 with known shapes, float32."""
    if has_leaking_intermediate_variables(ctx):
        return False
    call = ctx.annotated_expr["concat"]
    out = expr_shape(call)
    fields = call.args[0].fields
    return (
        out is not None
        and 1 <= len(out) <= 5
        and all(expr_shape(f) is not None for f in fields)
        and all_float32(call, *fields)
    )


def _check_lrn(ctx: Any) -> bool:
    """A window of odd size over channels only, centred, averaged with its padding (ONNX's sum / size)."""
    if has_leaking_intermediate_variables(ctx):
        return False
    ann = ctx.annotated_expr
    shape, a = expr_shape(ann["data"]), ann["pool"].attrs
    if shape is None or len(shape) != 4 or not all_float32(ann["data"]) or a.layout != "NCDHW":
        return False
    size = [int(v) for v in a.pool_size]
    half = (size[0] - 1) // 2
    return (
        size[0] % 2 == 1
        and size[1:] == [1, 1]
        and [int(v) for v in a.strides] == [1, 1, 1]
        and [int(v) for v in a.dilation] == [1, 1, 1]
        and [int(v) for v in a.padding] == [half, 0, 0, half, 0, 0]
        and bool(a.count_include_pad)
        and not bool(a.ceil_mode)
        and None not in (_scalar(ann["alpha"]), _scalar(ann["k"]), _scalar(ann["beta"]))
    )


def _scale_shift_pattern(act: str | None, is_weight: WeightPredicate) -> FusionPattern:
    """``x * scale + shift`` per channel of an NCHW tensor [+ activation]: a batch norm that no
    convolution took (DenseNet's before each conv), as folded by :func:`FoldChannelAffine`."""
    x, scale, shift = wildcard(), wildcard(), wildcard()
    mul = is_op("relax.multiply")(x, scale)
    top = is_op("relax.add")(mul, shift)
    ann = {"anchor": mul, "data": x, "scale": scale, "shift": shift}
    top = _activation(top, act, ann)
    name = "dnnl.scale_shift" + (f"_{act}" if act else "")
    return FusionPattern(name, top, ann, lambda ctx: _check_scale_shift(ctx, is_weight))


def _check_scale_shift(ctx: Any, is_weight: WeightPredicate) -> bool:
    if has_leaking_intermediate_variables(ctx) or not _check_activation(ctx):
        return False
    ann = ctx.annotated_expr
    shape = expr_shape(ann["data"])
    if shape is None or len(shape) != 4 or not all_float32(ann["data"], ann["scale"], ann["shift"]):
        return False
    want = (1, shape[1], 1, 1)
    for role in ("scale", "shift"):
        v = expr_shape(ann[role])
        if not is_weight(ann[role]) or v is None or (1,) * (4 - len(v)) + tuple(v) != want:
            return False
    return True


def _check_global_mean(ctx: Any) -> bool:
    """``mean(x, axis=[2, 3], keepdims=True)`` of an NCHW tensor: a global average pooling."""
    call = ctx.matched_expr
    shape = expr_shape(call.args[0])
    axes = call.attrs.axis
    if shape is None or len(shape) != 4 or axes is None or not bool(call.attrs.keepdims):
        return False
    return sorted(int(a) % 4 for a in axes) == [2, 3] and all_float32(call.args[0], call)


def _check_pool(ctx: Any) -> bool:
    call = ctx.matched_expr
    a = call.attrs
    shape = expr_shape(call.args[0])
    return (
        shape is not None
        and len(shape) == 4
        and a.layout == "NCHW"
        and a.out_layout == "NCHW"
        and not bool(a.ceil_mode)
        and all_float32(call.args[0], call)
    )


# ---- region descriptions --------------------------------------------------------------------
def _describe(composite: relax.Function, pattern: str) -> dict:
    """The JSON the C++ module reads (docs/byoc.md): op, attributes, and input index per role."""
    index = {p: i for i, p in enumerate(composite.params)}
    bound: dict[relax.Var, Any] = {}
    spec: dict[str, Any] = {"num_inputs": len(composite.params)}
    anchor_out = None
    adds = 0
    clip_inputs = {
        b.value.args[0]
        for block in composite.body.blocks
        for b in block.bindings
        if "_hardswish" in pattern and isinstance(b.value, relax.Call) and b.value.op.name == "relax.clip"
    }
    for block in composite.body.blocks:
        for binding in block.bindings:
            value = binding.value
            bound[binding.var] = value
            op = value.op.name
            if op == "relax.nn.layer_norm":
                spec.update(
                    op="layer_norm",
                    data=_input(value.args[0], index, bound),
                    weight=_input(value.args[1], index, bound),
                    bias=_input(value.args[2], index, bound),
                    epsilon=float(value.attrs.epsilon),
                )
                continue
            if op == "relax.nn.softmax":
                rank = len(expr_shape(value.args[0]))
                spec.update(op="softmax", axis=int(value.attrs.axis) % rank, data=_input(value.args[0], index, bound))
                continue
            if op == "relax.concat":
                rank = len(expr_shape(value))
                tup = value.args[0] if isinstance(value.args[0], relax.Tuple) else bound[value.args[0]]
                inputs = [_input(f, index, bound) for f in tup.fields]
                spec.update(op="concat", axis=int(value.attrs.axis) % rank, inputs=inputs)
                continue
            if pattern == "dnnl.lrn":
                if op == "relax.nn.avg_pool3d":
                    spec.update(op="lrn", local_size=int(value.attrs.pool_size[0]))
                    spec.update(json.loads(str(composite.attrs[LRN_ATTR])))
                elif op == "relax.divide":
                    spec["data"] = _input(value.args[0], index, bound)
                continue
            if pattern.startswith("dnnl.scale_shift"):
                if op == "relax.multiply":
                    spec.update(op="scale_shift", data=_input(value.args[0], index, bound))
                    spec["weight"] = _input(value.args[1], index, bound)
                elif op == "relax.add":
                    spec["bias"] = _input(value.args[1], index, bound)
                elif op == "relax.nn.relu":
                    spec["relu"] = True
                continue
            if op == "relax.mean":
                h, w = expr_shape(value.args[0])[2:]
                spec.update(
                    op="avg_pool2d", data=_input(value.args[0], index, bound), pool_size=[h, w], strides=[1, 1],
                    padding=[0, 0, 0, 0], dilation=[1, 1], count_include_pad=False,
                )  # fmt: skip
                continue
            if pattern == "dnnl.channel_shuffle":
                if op == "relax.permute_dims":
                    spec.update(op="channel_shuffle", groups=int(expr_shape(value.args[0])[1]))
                elif "data" not in spec:
                    spec["data"] = _input(value.args[0], index, bound)
                continue
            if pattern == "dnnl.batch_matmul":
                spec.update(op="batch_matmul", inputs=[_input(a, index, bound) for a in value.args])
                continue
            if op in ("relax.nn.conv2d", "relax.matmul", "relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
                spec["op"] = op.rsplit(".", 1)[1]
                spec["data"] = _input(value.args[0], index, bound)
                anchor_out = binding.var
                a = value.attrs
                if op == "relax.nn.conv2d":
                    spec["weight"] = _input(value.args[1], index, bound)
                    spec.update(_ints(a, "strides", "padding", "dilation"), groups=int(a.groups))
                elif op == "relax.matmul":
                    spec["weight"] = _input(value.args[1], index, bound)
                    w = bound.get(value.args[1])
                    spec["weight_transposed"] = (
                        isinstance(w, relax.Call) and w.op.name == "relax.permute_dims"
                    )
                    if weight_panels(value.args[1], bound) > 0:
                        spec["weight_panels"] = PANEL_WIDTH
                else:
                    spec.update(_ints(a, "strides", "padding", "dilation", "pool_size"))
                    spec["count_include_pad"] = bool(a.count_include_pad)
            elif op == "relax.add" and binding.var in clip_inputs:
                continue  # hardswish's + 3
            elif op == "relax.add":
                other = value.args[1] if _derives_from(value.args[0], anchor_out, bound) else value.args[0]
                role = "bias" if "_bias" in pattern and adds == 0 else "residual"
                spec[role] = _input(other, index, bound)
                adds += 1
            elif op == "relax.nn.relu":
                spec["relu"] = True
            elif op == "relax.clip" and "_hardswish" not in pattern:
                spec["activation"] = "clip"
                lo, hi = _clip_bounds(value)  # JSON has no infinity; float32's extremes do the same
                spec["alpha"], spec["beta"] = max(lo, -_F32_MAX), min(hi, _F32_MAX)
            elif op in _ACTIVATION_OF_OP:
                spec["activation"] = _ACTIVATION_OF_OP[op]
    if "_hardswish" in pattern:
        spec["activation"] = "hardswish"
    return spec


_ACTIVATION_OF_OP = {v: k for k, v in _UNARY_ACTIVATIONS.items() if k != "relu"}


def _ints(attrs: Any, *names: str) -> dict[str, list[int]]:
    return {n: [int(v) for v in getattr(attrs, n)] for n in names}


#: Columns per panel of a matmul weight stored in panels: (N / 16, K, 16), which the graph reads as
#: ``reshape(permute_dims(P, [1, 0, 2]), [K, N])`` and the region reads as stored
#: (src/backends/one_row_matmul.h; oneDNN's BA16a16b layout of (K, N) when 16 divides K).
PANEL_WIDTH = 16


def weight_panels(weight: Any, bound: dict) -> int:
    """For a matmul's weight operand: :data:`PANEL_WIDTH` when it is a weight in panels read as (K, N)
    (16 dividing K), 0 when it is no reshape at all, -1 for any other reshape (not a region's weight)."""
    value = bound.get(weight) if isinstance(weight, relax.Var) else None
    if not isinstance(value, relax.Call) or value.op.name != "relax.reshape":
        return 0
    inner = bound.get(value.args[0]) if isinstance(value.args[0], relax.Var) else value.args[0]
    if not isinstance(inner, relax.Call) or inner.op.name != "relax.permute_dims" or inner.attrs.axes is None:
        return -1
    stored, shape = expr_shape(inner.args[0]), expr_shape(weight)
    if [int(v) for v in inner.attrs.axes] != [1, 0, 2] or stored is None or shape is None or len(stored) != 3:
        return -1
    n_panels, k, width = stored
    if width != PANEL_WIDTH or k % PANEL_WIDTH or list(shape) != [k, n_panels * width]:
        return -1
    return PANEL_WIDTH


def _input(expr: Any, index: dict, bound: dict) -> int:
    """Input position of ``expr``, looking through reshape / permute_dims of an input."""
    while expr not in index:
        value = bound.get(expr)
        if not isinstance(value, relax.Call) or value.op.name not in ("relax.reshape", "relax.permute_dims"):
            raise ValueError(f"oneDNN region: operand {expr} is not a region input")
        expr = value.args[0]
    return index[expr]


def _derives_from(expr: Any, root: Any, bound: dict) -> bool:
    while True:
        if expr.same_as(root):
            return True
        value = bound.get(expr)
        if not isinstance(value, relax.Call) or not value.args:
            return False
        expr = value.args[0]
