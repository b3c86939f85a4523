"""Relax regions as ONNX models: how a region reaches a vendor runtime that takes ONNX (an EP).

:func:`describe` turns one composite function (a matched op and its fused neighbours) into a
JSON-able list of ONNX nodes over the composite's parameters; :func:`assemble` joins a region's
steps (one, or a block's) into one ``onnx.ModelProto`` whose weights are initializers and whose
other inputs are graph inputs. :data:`EXPORTERS` is the op table: a Relax op has an ONNX form
here or it is not offered to the vendor. Single ONNX ops are used where ONNX has them (LRN,
LayerNormalization, Softmax, QuantizeLinear / DequantizeLinear), so the vendor sees what it knows.

Guarantee: an exported node computes what its Relax op computes on the same values (the tests
run each exported op on ONNX Runtime's CPU EP against TVM); anything else raises
:class:`Unexportable` naming the op, and the op then stays with TVM.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_const, is_op, wildcard

from ..ir.constant_values import is_tensor_constant, scalar_value, tensor_value

#: The ONNX IR version regions are written in (ONNX Runtime 1.31 refuses newer ones).
IR_VERSION = 9
#: The ONNX opset of exported regions (LayerNormalization is 17).
OPSET = 17
#: Ops ONNX Runtime registers in the ONNX domain beyond the standard (its transformer exports write
#: RMSNorm so): ONNX's checker has no schema for them.
RUNTIME_ONNX_OPS = frozenset({"SimplifiedLayerNormalization"})


def node_name(step: int, k: int) -> str:
    """The name of a region's ONNX node: the ``k``-th node of its block's step ``step``."""
    return f"s{step}_n{k}"


def step_of_node(name: str) -> int | None:
    """The block step an ONNX node of a region belongs to (the inverse of :func:`node_name`), or None
    for a node this module did not name (one the vendor made, say)."""
    head, sep, tail = name.partition("_n")
    if not sep or not head.startswith("s") or not head[1:].isdigit() or not tail.isdigit():
        return None
    return int(head[1:])


class Unexportable(ValueError):
    """A Relax op (or one of its attributes) with no ONNX form here."""


# ---- describing a composite ---------------------------------------------------------------------
class _Nodes:
    """The nodes of one composite being described: refs are ``["p", i]`` (parameter i),
    ``["v", k]`` (node k's output) or ``["c", k]`` (inline constant k)."""

    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self.consts: list[dict] = []

    def const(self, value: np.ndarray) -> list:
        value = np.asarray(value)
        self.consts.append({"dtype": str(value.dtype), "shape": list(value.shape), "data": value.ravel().tolist()})
        return ["c", len(self.consts) - 1]

    def add(self, op: str, inputs: list, attrs: dict | None = None, domain: str = "") -> list:
        self.nodes.append({"op": op, "inputs": inputs, "attrs": attrs or {}, "domain": domain})
        return ["v", len(self.nodes) - 1]


def describe(composite: relax.Function, scalars: dict[str, float] | None = None) -> dict:
    """The ONNX nodes of ``composite`` (its parameters are the region's inputs): ``{"nodes",
    "consts", "out", "params": [{"shape", "dtype"}], "shape", "dtype"}``. ``scalars`` carries
    values a pattern recorded on the composite (an LRN's alpha, beta, k)."""
    nodes = _Nodes()
    refs: dict[Any, list] = {p: ["p", i] for i, p in enumerate(composite.params)}

    def ref(expr: Any) -> list:
        if is_tensor_constant(expr):
            return nodes.const(tensor_value(expr))
        if expr in refs:
            return refs[expr]
        raise Unexportable(f"an operand ({type(expr).__name__}) that is neither a value of the region nor a constant")

    last = None
    whole, inside_whole = _decompositions(composite)
    var2val = relax.analysis.get_var2val(composite)
    for block in composite.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if binding.var in inside_whole:
                continue
            if binding.var in whole:
                op, domain, data, attrs = whole[binding.var]
                refs[binding.var] = last = nodes.add(op, [ref(data)], attrs, domain)
                continue
            if isinstance(value, relax.Tuple):
                refs[binding.var] = ["t", [ref(f) for f in value.fields]]
                continue
            if isinstance(value, relax.TupleGetItem):  # only a batch norm's normalized output
                made = var2val.get(value.tuple_value)
                if int(value.index) != 0 or getattr(getattr(made, "op", None), "name", "") != "relax.nn.batch_norm":
                    raise Unexportable("a tuple item other than a batch norm's output")
                refs[binding.var] = last = ref(value.tuple_value)
                continue
            if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
                raise Unexportable(f"a binding that is not an op call: {type(value).__name__}")
            name = value.op.name
            exporter = EXPORTERS.get(name)
            if exporter is None:
                raise Unexportable(f"{name} has no ONNX form here")
            args = []
            for arg in value.args:
                if isinstance(arg, relax.Tuple) and not any(isinstance(f, tirx.IntImm) for f in arg.fields):
                    args.append(["t", [ref(f) for f in arg.fields]])
                elif isinstance(arg, relax.Var) or is_tensor_constant(arg):
                    args.append(ref(arg))
                else:  # a prim value, a shape, a string or a data type: part of the op, not an operand
                    args.append(["x", arg])
            refs[binding.var] = last = exporter(nodes, value, args, scalars or {})
    out_expr = composite.body.body
    if last is None or out_expr not in refs:
        raise Unexportable("a region whose output is not one of its op results")
    ret = composite.ret_ty if hasattr(composite, "ret_ty") else out_expr.ty
    return {
        "nodes": nodes.nodes,
        "consts": nodes.consts,
        "out": refs[out_expr],
        "params": [_tensor_info(p.ty) for p in composite.params],
        **_tensor_info(ret),
    }


# GELU as the ONNX exporters write it without a Gelu op: x * (erf(x / sqrt(2)) + 1) * 0.5.
GELU_X = wildcard()
_GELU_SQRT2, _GELU_ONE, _GELU_HALF = is_const(), is_const(), is_const()
ERF_GELU = is_op("relax.multiply")(
    is_op("relax.multiply")(GELU_X, is_op("relax.add")(
        is_op("relax.erf")(is_op("relax.divide")(GELU_X, _GELU_SQRT2)), _GELU_ONE)),
    _GELU_HALF)
ERF_GELU_ANNOTATIONS = {"anchor": ERF_GELU, "data": GELU_X, "sqrt2": _GELU_SQRT2, "one": _GELU_ONE,
                        "half": _GELU_HALF}


def is_erf_gelu(named: dict) -> bool:
    """The matched constants are sqrt(2), 1 and 0.5 (scalars): then the pattern is GELU exactly."""
    for name, value in {"sqrt2": 2 ** 0.5, "one": 1.0, "half": 0.5}.items():
        const = scalar_value(named[name])
        if const is None or abs(const - value) > 1e-5 * value:
            return False
    return True


def _decompositions(composite: relax.Function) -> tuple[dict[Any, tuple[str, str, Any, dict]], set[Any]]:
    """The frontends' decompositions of one ONNX op inside ``composite`` (a QDQ unit holds one whole,
    between its dequantize and quantize): LRN, and GELU written with Erf (as com.microsoft's Gelu).
    Returns per output variable ``(op, domain, data, attributes)``, and the variables inside them,
    which nothing else reads (else a decomposition is left as it is)."""
    from ..ir.patterns import lrn_pattern  # the one statement of the LRN decomposition's shape

    lrn = lrn_pattern("lrn", lambda _ctx: True)
    kinds = [("LRN", "", lrn.pattern, lrn.annotation_patterns, _lrn_attrs),
             ("Gelu", "com.microsoft", ERF_GELU, ERF_GELU_ANNOTATIONS, lambda n: {} if is_erf_gelu(n) else None)]
    var2val = relax.analysis.get_var2val(composite)
    var_of = {val: v for v, val in var2val.items()}  # matched values are expressions: name them
    users: dict[Any, int] = {}
    for block in composite.body.blocks:
        for binding in block.bindings:
            for var in relax.analysis.free_vars(binding.value):
                users[var] = users.get(var, 0) + 1
    for var in relax.analysis.free_vars(composite.body.body):
        users[var] = users.get(var, 0) + 1
    found: dict[Any, tuple[str, str, Any, dict]] = {}
    inside: set[Any] = set()
    for var, value in var2val.items():
        if not isinstance(value, relax.Call) or var in inside:
            continue
        for op, domain, pattern, named_patterns, attrs_of in kinds:
            matched = pattern.extract_matched_expr(value, var2val)
            if matched is None:
                continue
            named = {n: matched[p] for n, p in named_patterns.items() if p in matched}
            data = var_of.get(named["data"], named["data"])
            exprs = [e for p, e in matched.items() if not p.same_as(named_patterns["data"])]
            interior = {v for v, val in var2val.items()
                        if not v.same_as(var) and not v.same_as(data) and any(e.same_as(val) for e in exprs)}
            attrs = attrs_of(named)
            if attrs is None or any(users.get(v, 0) != 1 for v in interior):
                continue
            found[var] = (op, domain, data, attrs)
            inside |= interior
            break
    return found, inside


def _lrn_attrs(named: dict) -> dict | None:
    """ONNX LRN's attributes: a window of odd size over channels only, centred, averaged with its
    padding (ONNX's sum / size); None where the match is something else."""
    pool = named["pool"].attrs
    size = [int(v) for v in pool.pool_size]
    half = (size[0] - 1) // 2
    if (size[0] % 2 != 1 or size[1:] != [1, 1] or [int(v) for v in pool.padding] != [half, 0, 0, half, 0, 0]
            or [int(v) for v in pool.strides] != [1, 1, 1] or not bool(pool.count_include_pad)):
        return None
    scalar = {n: scalar_value(named[n]) for n in ("alpha", "beta", "k")}
    if any(v is None for v in scalar.values()):
        return None
    return {"size": size[0], "alpha": scalar["alpha"], "beta": scalar["beta"], "bias": scalar["k"]}


def _tensor_info(ty: Any) -> dict:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        raise Unexportable(f"a value that is not a tensor of known shape ({ty})")
    return {"shape": [int(d) for d in ty.shape.values], "dtype": str(ty.dtype)}


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


def _shape_of(call: relax.Call) -> list[int]:
    return _tensor_info(call.ty)["shape"]


def _unary(op: str) -> Callable:
    return lambda n, call, args, _s: n.add(op, [args[0]])


def _binary(op: str) -> Callable:
    return lambda n, call, args, _s: n.add(op, [args[0], args[1]])


def _conv2d(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    a = call.attrs
    if a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or (a.out_layout not in ("", "NCHW")):
        raise Unexportable(f"conv2d in layout {a.data_layout}/{a.kernel_layout}")
    pads = _ints(a.padding)  # top, left, bottom, right == ONNX's begin..., end...
    return n.add("Conv", [args[0], args[1]], {"strides": _ints(a.strides), "pads": pads,
                                               "dilations": _ints(a.dilation), "group": int(a.groups)})


def _pool2d(op: str) -> Callable:
    def export(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
        a = call.attrs
        if a.layout != "NCHW":
            raise Unexportable(f"{call.op.name} in layout {a.layout}")
        attrs = {"kernel_shape": _ints(a.pool_size), "strides": _ints(a.strides), "pads": _ints(a.padding),
                 "ceil_mode": int(bool(a.ceil_mode))}
        if any(d != 1 for d in _ints(a.dilation)):
            attrs["dilations"] = _ints(a.dilation)
        if op == "AveragePool":
            attrs["count_include_pad"] = int(bool(a.count_include_pad))
        return n.add(op, [args[0]], attrs)
    return export


def _reshape_like_output(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    return n.add("Reshape", [args[0], n.const(np.array(_shape_of(call), "int64"))])


def _permute(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    axes = call.attrs.axes
    rank = len(_tensor_info(call.args[0].ty)["shape"])
    perm = _ints(axes) if axes is not None else list(reversed(range(rank)))
    return n.add("Transpose", [args[0]], {"perm": perm})


def _concat(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    if args[0][0] != "t":
        raise Unexportable("concat of a tuple that is not written out")
    return n.add("Concat", list(args[0][1]), {"axis": int(call.attrs.axis)})


def _reduce(op: str, axes_as_input: bool) -> Callable:
    def export(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
        rank = len(_tensor_info(call.args[0].ty)["shape"])
        axes = _ints(call.attrs.axis) if call.attrs.axis is not None else list(range(rank))
        keep = int(bool(call.attrs.keepdims))
        if axes_as_input:
            return n.add(op, [args[0], n.const(np.array(axes, "int64"))], {"keepdims": keep})
        return n.add(op, [args[0]], {"axes": axes, "keepdims": keep})
    return export


def _softmax(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    return n.add("Softmax", [args[0]], {"axis": int(call.attrs.axis)})


def _layer_norm(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    a = call.attrs
    rank = len(_tensor_info(call.args[0].ty)["shape"])
    axes = sorted(int(x) % rank for x in a.axes)
    if axes != list(range(axes[0], rank)) or not (a.center and a.scale):
        raise Unexportable("layer_norm over axes that do not end the shape, or without scale and shift")
    return n.add("LayerNormalization", [args[0], args[1], args[2]], {"axis": axes[0], "epsilon": float(a.epsilon)})


def _batch_norm(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    """Inference batch norm (its output 0, the normalized data; a QDQ model keeps it unfolded:
    the quantizer put a QuantizeLinear between it and its convolution)."""
    a = call.attrs
    if int(a.axis) != 1 or bool(a.training) or not (a.center and a.scale):
        raise Unexportable("batch_norm other than inference over axis 1 with scale and shift")
    return n.add("BatchNormalization", args[:5], {"epsilon": float(a.epsilon)})


def _expand_dims(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    return n.add("Unsqueeze", [args[0], n.const(np.array(_ints(call.attrs.axis), "int64"))])


def _squeeze(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    if call.attrs.axis is None:
        return n.add("Squeeze", [args[0]])
    return n.add("Squeeze", [args[0], n.const(np.array(_ints(call.attrs.axis), "int64"))])


def _broadcast_to(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    return n.add("Expand", [args[0], n.const(np.array(_shape_of(call), "int64"))])


def _stack(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    axis = int(call.attrs.axis)
    axes = n.const(np.array([axis], "int64"))
    parts = [n.add("Unsqueeze", [field, axes]) for field in args[0][1]]
    return n.add("Concat", parts, {"axis": axis})


def _clip(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    dtype = _tensor_info(call.ty)["dtype"]
    bounds = [scalar_value(arg) for arg in call.args[1:3]]  # prim values (int or float) or 1-element tensors
    if None in bounds:
        raise Unexportable("clip with a bound that is not one constant number")
    return n.add("Clip", [args[0], *(n.const(np.array(b, dtype)) for b in bounds)])


#: relax.nn.pad's modes with an ONNX Pad mode (TVM computes any other as constant padding: not exported).
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


def _pad(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    a = call.attrs
    mode = _PAD_MODES.get(str(a.pad_mode))
    if mode is None:
        raise Unexportable(f"pad in mode {a.pad_mode}")
    widths = _ints(a.pad_width)  # (before, after) per axis; ONNX wants every before, then every after
    inputs = [args[0], n.const(np.array(widths[0::2] + widths[1::2], "int64"))]
    if mode == "constant":
        inputs.append(n.const(np.array(float(a.pad_value), _tensor_info(call.ty)["dtype"])))
    return n.add("Pad", inputs, {"mode": mode})


def _gelu(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    return n.add("Gelu", [args[0]], domain="com.microsoft")


def _gelu_tanh(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    """GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in ops every
    opset has (ONNX's Gelu takes ``approximate`` only from opset 20)."""
    dtype = _tensor_info(call.ty)["dtype"]
    x = args[0]
    cube = n.add("Mul", [n.add("Mul", [x, x]), x])
    inner = n.add("Add", [x, n.add("Mul", [cube, n.const(np.array(0.044715, dtype))])])
    tanh = n.add("Tanh", [n.add("Mul", [inner, n.const(np.array(np.sqrt(2.0 / np.pi), dtype))])])
    half = n.add("Mul", [x, n.const(np.array(0.5, dtype))])
    return n.add("Mul", [half, n.add("Add", [tanh, n.const(np.array(1.0, dtype))])])


def _astype(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    from onnx import helper

    return n.add("Cast", [args[0]], {"to": helper.np_dtype_to_tensor_dtype(np.dtype(str(call.attrs.dtype)))})


def _qdq(op: str) -> Callable:
    def export(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
        return n.add(op, [args[0], args[1], args[2]], {"axis": int(call.attrs.axis)})
    return export


#: TIR functions the frontends emit through ``call_tir`` (ONNX Clip's bounds) with an ONNX form.
_TIR_ELEMENTWISE = {"maximum": "Max", "minimum": "Min"}


def _call_tir(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    callee = call.args[0]
    name = getattr(callee, "name_hint", "").rstrip("0123456789").rstrip("_")
    op = _TIR_ELEMENTWISE.get(name)
    if op is None or args[1][0] != "t" or len(args[1][1]) != 2:
        raise Unexportable(f"call_tir of {getattr(callee, 'name_hint', callee)} has no ONNX form here")
    return n.add(op, list(args[1][1]))


def _take(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    return n.add("Gather", [args[0], args[1]], {"axis": int(call.attrs.axis or 0)})


def _strided_slice(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    """Slice with constant bounds (Relax keeps them as prim values: axes, begin, end, strides)."""
    def ints(expr: Any) -> list[int] | None:
        fields = list(getattr(expr, "fields", [None]))
        if not all(isinstance(f, tirx.IntImm) for f in fields):
            return None
        return [int(f.value) for f in fields]

    axes, begin, end = (ints(call.args[i]) for i in (1, 2, 3))
    strides = ints(call.args[4]) if len(call.args) > 4 else None
    if axes is None or begin is None or end is None or (len(call.args) > 4 and strides is None):
        raise Unexportable("strided_slice with bounds that are not constant integers")
    inputs = [args[0], *(n.const(np.array(v, "int64")) for v in (begin, end, axes))]
    if strides is not None:
        inputs.append(n.const(np.array(strides, "int64")))
    return n.add("Slice", inputs)


def _silu(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    """x * sigmoid(x): ONNX before opset 22 has no Swish, and this is the form vendors fuse."""
    return n.add("Mul", [args[0], n.add("Sigmoid", [args[0]])])


def _rms_norm(n: _Nodes, call: relax.Call, args: list, _s: dict) -> list:
    """ONNX Runtime's SimplifiedLayerNormalization (registered in the ONNX domain): x / sqrt(mean(x^2)
    + eps) * weight over the last axes, the form ONNX Runtime's transformer exports write RMSNorm in."""
    rank = len(_tensor_info(call.args[0].ty)["shape"])
    axes = sorted(int(x) % rank for x in call.attrs.axes)
    if axes != list(range(axes[0], rank)):
        raise Unexportable("rms_norm over axes that do not end the shape")
    return n.add("SimplifiedLayerNormalization", [args[0], args[1]],
                 {"axis": axes[0], "epsilon": float(call.attrs.epsilon)})


#: Relax op -> ``exporter(nodes, call, args, scalars) -> ref``.
EXPORTERS: dict[str, Callable] = {
    "relax.nn.conv2d": _conv2d,
    "relax.nn.max_pool2d": _pool2d("MaxPool"),
    "relax.nn.avg_pool2d": _pool2d("AveragePool"),
    "relax.add": _binary("Add"),
    "relax.subtract": _binary("Sub"),
    "relax.multiply": _binary("Mul"),
    "relax.divide": _binary("Div"),
    "relax.power": _binary("Pow"),
    "relax.matmul": _binary("MatMul"),
    "relax.nn.relu": _unary("Relu"),
    "relax.sigmoid": _unary("Sigmoid"),
    "relax.tanh": _unary("Tanh"),
    "relax.sqrt": _unary("Sqrt"),
    "relax.exp": _unary("Exp"),
    "relax.erf": _unary("Erf"),
    "relax.asin": _unary("Asin"),
    "relax.negative": _unary("Neg"),
    "relax.nn.gelu": _gelu,
    "relax.nn.gelu_tanh": _gelu_tanh,
    "relax.clip": _clip,
    "relax.nn.pad": _pad,
    "relax.reshape": _reshape_like_output,
    "relax.permute_dims": _permute,
    "relax.concat": _concat,
    "relax.mean": _reduce("ReduceMean", axes_as_input=False),
    "relax.sum": _reduce("ReduceSum", axes_as_input=True),
    "relax.max": _reduce("ReduceMax", axes_as_input=False),
    "relax.nn.softmax": _softmax,
    "relax.nn.layer_norm": _layer_norm,
    "relax.nn.batch_norm": _batch_norm,
    "relax.expand_dims": _expand_dims,
    "relax.squeeze": _squeeze,
    "relax.broadcast_to": _broadcast_to,
    "relax.stack": _stack,
    "relax.astype": _astype,
    "relax.quantize": _qdq("QuantizeLinear"),
    "relax.dequantize": _qdq("DequantizeLinear"),
    "relax.take": _take,
    "relax.strided_slice": _strided_slice,
    "relax.nn.silu": _silu,
    "relax.nn.rms_norm": _rms_norm,
    "relax.call_tir": _call_tir,
    "relax.less": _binary("Less"),
    "relax.greater": _binary("Greater"),
    "relax.equal": _binary("Equal"),
    "relax.where": lambda n, call, args, _s: n.add("Where", [args[0], args[1], args[2]]),
}


def describe_lrn(composite: relax.Function, scalars: dict[str, float]) -> dict:
    """An LRN composite (the frontends' decomposition, matched whole) as one ONNX LRN."""
    nodes = _Nodes()
    pool = next(b.value for blk in composite.body.blocks for b in blk.bindings
                if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.avg_pool3d")
    size = int(pool.attrs.pool_size[0])
    out = nodes.add("LRN", [["p", 0]], {"size": size, "alpha": float(scalars["alpha"]),
                                        "beta": float(scalars["beta"]), "bias": float(scalars["k"])})
    return {"nodes": nodes.nodes, "consts": nodes.consts, "out": out,
            "params": [_tensor_info(p.ty) for p in composite.params], **_tensor_info(composite.ret_ty)}


# ---- assembling a region ------------------------------------------------------------------------
def assemble(spec: dict, weights: dict[int, np.ndarray], name: str) -> tuple[bytes, list[int], str]:
    """One ONNX model for a region ``spec`` (one step, or a block's ``steps``). ``weights`` maps the
    region's input positions to their values, which become initializers. Returns the serialized
    model, the input positions that stay graph inputs (bound at run time, named ``in<position>``),
    and the name of the model's one output, the region's value."""
    import onnx
    from onnx import helper, numpy_helper

    steps = spec["steps"] if spec.get("op") == "block" else [{**spec, "args": list(range(len(spec["params"])))}]
    num_inputs = int(spec["num_inputs"]) if spec.get("op") == "block" else len(spec["params"])
    input_info: dict[int, dict] = {}
    for step in steps:
        for k, arg in enumerate(step["args"]):
            if arg < num_inputs:
                input_info.setdefault(arg, step["params"][k])
    graph_nodes, initializers, graph_inputs, bound = [], [], [], []
    for position in range(num_inputs):
        info = input_info[position]
        if position in weights:
            initializers.append(numpy_helper.from_array(np.asarray(weights[position]).astype(info["dtype"]),
                                                        f"in{position}"))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                f"in{position}", helper.np_dtype_to_tensor_dtype(np.dtype(info["dtype"])), info["shape"]))
            bound.append(position)
    step_out: list[str] = []
    for s, step in enumerate(steps):
        params = [f"in{a}" if a < num_inputs else step_out[a - num_inputs] for a in step["args"]]
        for c, const in enumerate(step["consts"]):
            initializers.append(numpy_helper.from_array(
                np.array(const["data"], const["dtype"]).reshape(const["shape"]), f"s{s}_c{c}"))

        def resolve(ref: list, s: int = s, params: list = params) -> str:
            kind, index = ref
            return params[index] if kind == "p" else f"s{s}_c{index}" if kind == "c" else f"s{s}_v{index}"

        for k, node in enumerate(step["nodes"]):
            inputs = []
            for ref in node["inputs"]:
                inputs.extend(resolve(r) for r in ref[1]) if ref[0] == "t" else inputs.append(resolve(ref))
            graph_nodes.append(helper.make_node(node["op"], inputs, [f"s{s}_v{k}"], name=node_name(s, k),
                                                domain=node.get("domain", ""), **node["attrs"]))
        step_out.append(resolve(step["out"]))
    last = steps[-1]
    output = helper.make_tensor_value_info(step_out[-1], helper.np_dtype_to_tensor_dtype(np.dtype(last["dtype"])),
                                           last["shape"])
    graph_nodes = fuse_conv_bias(graph_nodes, {i.name: i for i in initializers}, {step_out[-1]})
    graph = helper.make_graph(graph_nodes, name, graph_inputs, [output], initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="tvm-hetero")
    if not any(node.op_type in RUNTIME_ONNX_OPS and not node.domain for node in graph_nodes):
        onnx.checker.check_model(model)  # ONNX's checker does not know ONNX Runtime's own ops (the runtime checks them)
    return model.SerializeToString(), bound, step_out[-1]


def fuse_conv_bias(nodes: list, initializers: dict, outputs: set[str]) -> list:
    """``Add(Conv(x, w), Reshape(b, [1, C, 1, 1]))`` as ``Conv(x, w, b)`` where ``b`` has C values and
    nothing else reads the Conv or the Reshape: ONNX's own form of a biased convolution (and the
    only one a vendor takes as a QDQ unit, with ``b`` dequantized from int32)."""
    from onnx import numpy_helper

    readers: dict[str, int] = {}
    for node in nodes:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    made_by = {out: node for node in nodes for out in node.output}
    dropped: set[int] = set()
    for node in nodes:
        if node.op_type == "Add" and len(node.input) == 2:
            for conv_in, bias_in in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
                conv, reshape = made_by.get(conv_in), made_by.get(bias_in)
                if (conv is None or reshape is None or conv.op_type != "Conv" or len(conv.input) != 2
                        or reshape.op_type != "Reshape" or readers.get(conv_in) != 1 or readers.get(bias_in) != 1
                        or conv_in in outputs or bias_in in outputs or reshape.input[1] not in initializers):
                    continue
                shape = numpy_helper.to_array(initializers[reshape.input[1]]).tolist()
                if len(shape) != 4 or shape[0] != 1 or shape[2:] != [1, 1] or not _is_vector(
                        reshape.input[0], initializers, made_by):
                    continue
                conv.input.append(reshape.input[0])
                conv.output[0] = node.output[0]
                dropped.update({id(node), id(reshape)})
                break
    return _topological([node for node in nodes if id(node) not in dropped])


def _topological(nodes: list) -> list:
    """``nodes`` in an order where each is after what it reads (ONNX requires it; a fused
    convolution now reads a bias made after it)."""
    made_by = {out: i for i, node in enumerate(nodes) for out in node.output}
    placed: set[int] = set()
    order: list = []
    for root in range(len(nodes)):
        stack = [(root, False)]
        while stack:  # depth first, without recursion (graphs of thousands of nodes)
            i, inputs_done = stack.pop()
            if inputs_done:
                order.append(nodes[i])
                continue
            if i in placed:
                continue
            placed.add(i)
            stack.append((i, True))
            stack.extend((made_by[name], False) for name in reversed(nodes[i].input)
                         if name in made_by and made_by[name] not in placed)
    return order


def _is_vector(name: str, initializers: dict, made_by: dict) -> bool:
    """A one-dimensional initializer, or the dequantize of one (a QDQ model's int32 bias)."""
    producer = made_by.get(name)
    if producer is not None and producer.op_type == "DequantizeLinear":
        name = producer.input[0]
    return name in initializers and len(initializers[name].dims) == 1


def spec_text(spec: dict) -> str:
    """A region spec as compact JSON (for hashing and the module document)."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))
