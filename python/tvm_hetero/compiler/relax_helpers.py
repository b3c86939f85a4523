"""Small facts about Relax IR the compiler passes share: kernel calls, static tensor types, blocks."""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax


class LoweringError(ValueError):
    """The module uses something the lowering cannot turn into a static kernel graph."""


#: Ops that only annotate or move a value: they become aliases, not kernels.
ALIAS_OPS = frozenset({"relax.hint_on_device", "relax.to_vdevice"})


DEVICE_ATTR = "tvm_hetero.device"


OP_ATTR = "tvm_hetero.relax_op"


CALL_TIR = "relax.call_tir"


def is_call_tir(value: Any) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == CALL_TIR


def is_alias_op(value: Any) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in ALIAS_OPS


def static_shape(ty: relax.TensorType) -> tuple[int, ...] | None:
    shape = ty.shape
    if not isinstance(shape, relax.ShapeExpr):
        return None
    dims = []
    for dim in shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            return None
        dims.append(int(dim.value))
    return tuple(dims)


def tensor_type(ty: Any, what: str) -> tuple[tuple[int, ...], str]:
    if not isinstance(ty, relax.TensorType):
        raise LoweringError(f"{what}: expected a tensor, got {ty}")
    shape = static_shape(ty)
    if shape is None or not str(ty.dtype):
        raise LoweringError(f"{what}: dynamic shape {ty} is not supported (only static shapes)")
    return shape, str(ty.dtype)


def same_kind_block(block: relax.BindingBlock, bindings: list[relax.Binding]) -> relax.BindingBlock:
    return (
        relax.DataflowBlock(bindings)
        if isinstance(block, relax.DataflowBlock)
        else relax.BindingBlock(bindings)
    )


def replace_body(func: relax.Function, blocks: list[relax.BindingBlock]) -> relax.Function:
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)



def with_operands(call: relax.Call, mapping: dict) -> relax.Call:
    """``call`` with the variables among its operands (tuple fields included) replaced as
    ``mapping`` says; its type is kept."""

    def operand(expr: Any) -> Any:
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([operand(f) for f in expr.fields])
        return mapping.get(expr, expr) if isinstance(expr, relax.Var) else expr

    return relax.Call(call.op, [operand(a) for a in call.args], call.attrs, call.ty_args, ret_ty=call.ty)
