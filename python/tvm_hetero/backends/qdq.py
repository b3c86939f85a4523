"""QDQ units: the float computation a quantized (QDQ) model does between its dequantizes and quantizes.

A QDQ model (ONNX Runtime's ``quantize_static`` in QDQ format, or any model with
QuantizeLinear/DequantizeLinear pairs) is imported by TVM's ONNX frontend as float ops wrapped in
``relax.dequantize`` / ``relax.quantize`` calls::

    lv1 = R.dequantize(lv, scale, zp, axis=1)             # activation: uint8 -> float32
    lv2 = R.dequantize(metadata[..], w_scale, w_zp, axis=0)  # weight: int8 constant -> float32
    lv3 = R.nn.conv2d(lv1, lv2, ...)                       # the anchor
    lv4 = R.dequantize(metadata[..], b_scale, R.const(0, "int32"), axis=0)  # bias: int32 constant
    lv5 = R.reshape(lv4, [1, C, 1, 1]); lv6 = R.add(lv3, lv5)
    lv7 = R.quantize(lv6, y_scale, y_zp, out_dtype="uint8", axis=1)

Scales and zero points are ``tvm.ir.Constant`` (a scalar per tensor, a vector per channel); ``axis``
is meaningful only for a vector scale (the frontend writes ``axis=1`` for a scalar one).

A **unit** is one connected island of float ops (connected through values one float op makes and
another reads) together with the dequantize bindings it reads and the quantize bindings reading it.
Its anchor is its main op (a convolution or matmul before an add, an add before a ReLU; see
``_ANCHOR_RANK``); its ``kind`` is the anchor's op name without ``relax.``/``relax.nn.``
(``"conv2d"``, ``"matmul"``, ``"add"``, ``"max_pool2d"``, ``"concat"``, ``"batch_norm"``, ...). ONNX
``Gemm`` arrives as ``matmul`` of the dequantized weight's ``permute_dims`` plus an add: kind
``"matmul"`` with ``weight_transposed``.

Guarantees: units never share a float op; ``unit.bindings`` holds every variable of the unit
(dequantizes, float ops, quantizes), so a partitioner that keeps them together keeps the unit
atomic. A dequantize may feed several units (an activation read by two convolutions): it is then
in each unit's ``bindings`` and its ``shared`` flag says so; a partitioner duplicates it or keeps
those units in one region. The matcher only reads the function; it never rewrites it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..ir.constant_values import is_tensor_constant, tensor_value

DEQUANTIZE = "relax.dequantize"
QUANTIZE = "relax.quantize"

#: The anchor of a unit is its op of lowest rank here (others rank after every listed op).
_ANCHOR_RANK = {
    "relax.nn.conv2d": 0,
    "relax.nn.conv2d_transpose": 0,
    "relax.matmul": 1,
    "relax.nn.batch_norm": 2,
    "relax.nn.max_pool2d": 3,
    "relax.nn.avg_pool2d": 3,
    "relax.mean": 3,
    "relax.concat": 4,
    "relax.nn.softmax": 4,
    "relax.nn.layer_norm": 4,
    "relax.add": 5,
    "relax.sum": 5,  # ONNX Sum arrives as sum(stack(broadcast_to(a), broadcast_to(b))): an add
    "relax.multiply": 6,
}
#: Ops that only carry a constant weight or bias to the anchor (reshape of a bias, transpose of a
#: Gemm weight); a unit's roles look through them.
_CARRIERS = frozenset({"relax.reshape", "relax.permute_dims", "relax.expand_dims"})


@dataclass(frozen=True, eq=False)
class QuantizationOp:
    """One ``relax.quantize`` or ``relax.dequantize`` binding: what both carry."""

    #: The variable it binds.
    var: relax.Var
    #: What it converts: for a dequantize the quantized tensor (a ``tvm.ir.Constant`` for a weight or
    #: bias, a variable for an activation); for a quantize the unit's float output.
    source: relax.Expr
    #: Scale and zero point as numpy arrays (scalar: per tensor; 1-D: per channel along ``axis``);
    #: None when they are not constants.
    scale: np.ndarray | None
    zero_point: np.ndarray | None
    #: The channel axis of a per-channel scale (normalised to be non-negative).
    axis: int
    #: The quantized type ("uint8", "int8", "int32").
    dtype: str

    @property
    def per_channel(self) -> bool:
        return self.scale is not None and self.scale.size > 1


@dataclass(frozen=True, eq=False)
class Dequantize(QuantizationOp):
    """One ``relax.dequantize`` binding a unit reads."""

    #: Whether another unit reads this dequantize too.
    shared: bool = False

    @property
    def is_constant(self) -> bool:
        return isinstance(self.source, tvm.ir.Constant)


@dataclass(frozen=True, eq=False)
class Quantize(QuantizationOp):
    """One ``relax.quantize`` binding reading a unit's output."""


@dataclass(frozen=True, eq=False)
class QdqUnit:
    """One QDQ unit: dequantizes -> float ops (anchor first among them) -> quantize."""

    #: The anchor op's short name: "conv2d", "matmul", "add", "max_pool2d", "concat", ...
    kind: str
    #: The variable bound to the anchor call, and the call.
    anchor: relax.Var
    anchor_call: relax.Call
    #: Dequantized activations the unit reads (in the anchor's argument order where it reads them
    #: directly), weight and bias (the anchor's; None when absent or not dequantized).
    activations: tuple[Dequantize, ...]
    weight: Dequantize | None
    bias: Dequantize | None
    #: Every other dequantized constant the unit reads (a batch norm's scale and shift).
    constants: tuple[Dequantize, ...]
    #: The float ops of the unit, in binding order (the anchor among them).
    ops: tuple[relax.Var, ...]
    #: The unit's float output (the value leaving the island) and the quantize reading it (None: the
    #: output stays float, e.g. a model's last matmul whose result is returned).
    output: relax.Var
    quantize: Quantize | None
    #: Gemm: the weight reaches the matmul through ``permute_dims`` (stored (N, K)).
    weight_transposed: bool = False

    @property
    def bindings(self) -> tuple[relax.Var, ...]:
        """Every variable of the unit: dequantizes, float ops, the quantize."""
        out = [d.var for d in (*self.activations, self.weight, self.bias, *self.constants) if d is not None]
        out += self.ops
        if self.quantize is not None:
            out.append(self.quantize.var)
        return tuple(out)

    @property
    def op_names(self) -> tuple[str, ...]:
        """The Relax op of each float op, in order."""
        return tuple(_op_name(self._values[v]) for v in self.ops)

    # The bound value of each float op (set by the matcher; not part of the public fields).
    _values: Any = field(default=None, repr=False)


def find_qdq_units(func: relax.Function) -> list[QdqUnit]:
    """Every QDQ unit of ``func`` (before legalization), in the order of their anchors.

    An island of float ops becomes a unit when it reads at least one dequantized activation or
    feeds a quantize; islands that touch no dequantize or quantize (a float model's ops) are not
    units.
    """
    values: dict[relax.Var, relax.Expr] = {}
    order: dict[relax.Var, int] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding):
                order[binding.var] = len(order)
                values[binding.var] = binding.value
    readers: dict[relax.Var, list[relax.Var]] = {v: [] for v in values}
    for var, value in values.items():
        for used in _vars_read(value):
            if used in readers:
                readers[used].append(var)

    def is_float_op(v: relax.Var) -> bool:
        name = _op_name(values.get(v))
        return name is not None and name not in (QUANTIZE, DEQUANTIZE) or isinstance(
            values.get(v), relax.TupleGetItem
        )

    # Islands: union of float ops joined by a value one makes and another reads.
    parent = {v: v for v in values if is_float_op(v)}

    def root(v: relax.Var) -> relax.Var:
        while parent[v] is not v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for v in parent:
        for used in _vars_read(values[v]):
            if used in parent:
                a, b = root(v), root(used)
                if a is not b:
                    parent[a] = b
    islands: dict[relax.Var, list[relax.Var]] = {}
    for v in sorted(parent, key=order.__getitem__):
        islands.setdefault(root(v), []).append(v)

    dq_readers: dict[relax.Var, set[relax.Var]] = {}
    for members in islands.values():
        for v in members:
            for used in _vars_read(values[v]):
                if _op_name(values.get(used)) == DEQUANTIZE:
                    dq_readers.setdefault(used, set()).add(root(v))

    units = []
    for members in islands.values():
        unit = _unit(members, values, readers, dq_readers)
        if unit is not None:
            units.append(unit)
    units.sort(key=lambda u: order[u.anchor])
    return units


def _unit(
    members: list[relax.Var],
    values: dict[relax.Var, relax.Expr],
    readers: dict[relax.Var, list[relax.Var]],
    dq_readers: dict[relax.Var, set[relax.Var]],
) -> QdqUnit | None:
    inside = set(members)
    dqs: list[relax.Var] = []
    for v in members:
        for used in _vars_read(values[v]):
            if _op_name(values.get(used)) == DEQUANTIZE and used not in dqs:
                dqs.append(used)
    outputs = [v for v in members if any(r not in inside for r in readers[v]) or not readers[v]]
    # Outputs read only as a tuple's parts (batch norm's mean and variance) are not outputs.
    outputs = [v for v in outputs if not isinstance(values[v], relax.TupleGetItem) or readers[v]]
    quantizes = [r for v in outputs for r in readers[v] if _op_name(values[r]) == QUANTIZE]
    activations = [d for d in dqs if not isinstance(values[d].args[0], tvm.ir.Constant)]
    if not activations and not quantizes:
        return None
    anchor = min(
        (v for v in members if isinstance(values[v], relax.Call)),
        key=lambda v: _ANCHOR_RANK.get(_op_name(values[v]), len(_ANCHOR_RANK)),
        default=None,
    )
    if anchor is None:
        return None
    call = values[anchor]
    shared = {d for d in dqs if len(dq_readers.get(d, ())) > 1}

    def dequantize(d: relax.Var) -> Dequantize:
        return _dequantize(d, values[d], d in shared)

    weight = bias = None
    transposed = False
    if len(call.args) > 1:
        w, carried = _through_carriers(call.args[1], values, inside)
        is_const = w in dqs and isinstance(values[w].args[0], tvm.ir.Constant)
        if is_const and _op_name(call) != "relax.add":
            weight = dequantize(w)
            transposed = "relax.permute_dims" in carried
    for d in dqs:
        src = values[d].args[0]
        if is_tensor_constant(src) and str(src.ty.dtype) == "int32":
            bias = dequantize(d) if bias is None else bias
    roles = {x.var for x in (weight, bias) if x is not None}
    acts = _in_argument_order(call, activations, values)
    constants = tuple(dequantize(d) for d in dqs if d not in roles and d not in acts)
    output = outputs[-1] if outputs else members[-1]
    quantize = None
    if len(outputs) == 1:
        qs = [r for r in readers[output] if _op_name(values[r]) == QUANTIZE]
        if qs:
            quantize = _quantize(qs[0], values[qs[0]])
    unit = QdqUnit(
        kind=_kind(call, values),
        anchor=anchor,
        anchor_call=call,
        activations=tuple(dequantize(d) for d in acts),
        weight=weight,
        bias=bias,
        constants=constants,
        ops=tuple(members),
        output=output,
        quantize=quantize,
        weight_transposed=transposed,
    )
    object.__setattr__(unit, "_values", {v: values[v] for v in members})
    return unit


def _in_argument_order(call: relax.Call, acts: list[relax.Var], values: dict) -> list[relax.Var]:
    """The activation dequantizes, those the anchor reads directly first, in its argument order."""
    direct = []
    for arg in _flat_args(call):
        if isinstance(arg, relax.Var) and arg in acts and arg not in direct:
            direct.append(arg)
    return direct + [a for a in acts if a not in direct]


def _flat_args(call: relax.Call) -> list[relax.Expr]:
    out = []
    for arg in call.args:
        out.extend(arg.fields if isinstance(arg, relax.Tuple) else [arg])
    return out


def _through_carriers(expr: relax.Expr, values: dict, inside: set) -> tuple[Any, list[str]]:
    """Follow reshape / permute_dims / expand_dims inside the unit back to what they carry."""
    carried = []
    while isinstance(expr, relax.Var) and expr in inside and _op_name(values[expr]) in _CARRIERS:
        carried.append(_op_name(values[expr]))
        expr = values[expr].args[0]
    return expr, carried


def _quantization(var: relax.Var, call: relax.Call) -> dict:
    """What a quantize and a dequantize call both say: the source, its scale and zero point, the axis."""
    src, scale, zp = call.args[0], call.args[1], call.args[2]
    return {"var": var, "source": src, "scale": _const(scale), "zero_point": _const(zp), "axis": _axis(call, src)}


def _dequantize(var: relax.Var, call: relax.Call, shared: bool) -> Dequantize:
    return Dequantize(**_quantization(var, call), dtype=_dtype(call.args[0]), shared=shared)


def _quantize(var: relax.Var, call: relax.Call) -> Quantize:
    return Quantize(**_quantization(var, call), dtype=str(call.attrs.out_dtype))


def _const(expr: relax.Expr) -> np.ndarray | None:
    return tensor_value(expr)


def _axis(call: relax.Call, src: relax.Expr) -> int:
    axis = int(call.attrs.axis)
    ty = src.ty
    ndim = getattr(ty, "ndim", -1)
    return axis + ndim if axis < 0 and ndim > 0 else axis


def _dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def _kind(call: relax.Call, values: dict) -> str:
    op = _op_name(call)
    if (op == "relax.sum" and isinstance(call.args[0], relax.Var)
            and _op_name(values.get(call.args[0])) == "relax.stack"):
        return "add"  # see _ANCHOR_RANK
    return op.removeprefix("relax.").removeprefix("nn.")


def _op_name(value: Any) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


def _vars_read(value: relax.Expr) -> list[relax.Var]:
    """The variables an expression reads (through tuples and tuple items)."""
    if isinstance(value, relax.Var):
        return [value]
    if isinstance(value, relax.Call):
        out = []
        for arg in value.args:
            out.extend(_vars_read(arg))
        return out
    if isinstance(value, relax.Tuple):
        out = []
        for f in value.fields:
            out.extend(_vars_read(f))
        return out
    if isinstance(value, relax.TupleGetItem):
        return _vars_read(value.tuple_value)
    return []


def summarize(units: list[QdqUnit]) -> dict[str, int]:
    """How many units of each kind: ``{"conv2d": 26, "concat": 8, ...}``."""
    out: dict[str, int] = {}
    for u in units:
        out[u.kind] = out.get(u.kind, 0) + 1
    return dict(sorted(out.items()))


__all__ = ["DEQUANTIZE", "QUANTIZE", "Dequantize", "QdqUnit", "Quantize", "find_qdq_units", "summarize"]
