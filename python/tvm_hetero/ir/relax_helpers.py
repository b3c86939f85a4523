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


def map_bindings(func: relax.Function, rewrite: Any) -> relax.Function:
    """``func`` with each binding ``b`` of its body replaced by ``rewrite(b)``: a binding, or a list
    of bindings that take its place (blocks keep their kind)."""
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            out = rewrite(binding)
            bindings.extend(out if isinstance(out, list) else [out])
        blocks.append(same_kind_block(block, bindings))
    return replace_body(func, blocks)


def with_entry_body(mod: tvm.IRModule, entry: str, func: relax.Function, blocks: list) -> tvm.IRModule:
    """``mod`` (a module the caller may change) with ``entry`` given ``blocks`` as its body."""
    mod[entry] = replace_body(func, blocks)
    return mod


def expr_shape(expr: Any) -> tuple[int, ...] | None:
    """The static shape of an expression's tensor type, or None (not a tensor, or symbolic)."""
    ty = getattr(expr, "ty", None)
    return static_shape(ty) if isinstance(ty, relax.TensorType) else None


def all_float32(*exprs: Any) -> bool:
    """Every expression is a float32 tensor."""
    return all(isinstance(getattr(e, "ty", None), relax.TensorType) and str(e.ty.dtype) == "float32" for e in exprs)


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


def use_counts(func: relax.Function) -> dict[relax.Var, int]:
    """How many times each variable is read, every occurrence counted (``a * a`` reads ``a`` twice),
    the function's output included."""
    counts: dict[relax.Var, int] = {}

    def count(expr: Any) -> None:
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1
        elif isinstance(expr, relax.Call):
            for arg in expr.args:
                count(arg)
        elif isinstance(expr, relax.Tuple):
            for field in expr.fields:
                count(field)
        elif isinstance(expr, relax.TupleGetItem):
            count(expr.tuple_value)

    for block in func.body.blocks:
        for binding in block.bindings:
            count(binding.value)
    count(func.body.body)
    return counts


def readers(func: relax.Function) -> dict[relax.Var, list[Any]]:
    """For each variable, the variables of the bindings reading it, in binding order, once each
    (``None``: the function's output)."""
    out: dict[relax.Var, list[Any]] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            for var in relax.analysis.free_vars(binding.value):
                out.setdefault(var, []).append(binding.var)
    for var in relax.analysis.free_vars(func.body.body):
        out.setdefault(var, []).append(None)
    return out


def entry_pass(entry: str, transform: Any, name: str) -> tvm.transform.Pass:
    """A module pass applying ``transform(function) -> function`` to ``entry`` (which returns the
    function itself when it changes nothing), with dead code removed after a change."""

    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        original = mod[entry]
        func = transform(original)
        if func is original:
            return mod
        mod = mod.clone()
        mod[entry] = func
        return relax.transform.DeadCodeElimination([entry])(mod)

    return tvm.transform.module_pass(run, opt_level=0, name=name)
