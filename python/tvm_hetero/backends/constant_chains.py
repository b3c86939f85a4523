"""Fold the constant chains a frontend leaves in front of an accelerator's graph.

TVM's ONNX frontend computes some values from constants alone at run time: a Gather's index
normalisation reads ``shape_of`` of a static-shaped table (``where(less(i, 0), i + shape[0], i)``), a
quantizer's scalar arrives as ``quantize(constant)``, a position-embedding lookup takes constant rows
of a constant table. ONNX Runtime folds these before its execution providers see the graph; left as
ops here they are host work in the middle of an HTP graph (a graph input QNN must wait for, or a
node QNN will not claim) and they split one QNN graph in two.

Rule, per binding of the entry function in order:
- *computable*: an op call whose operands are constants, literals (shapes, dtypes, prim values) or
  computable bindings; and ``shape_of`` of any static-shaped tensor (its shape is known). Function
  parameters are never constant: ``set_params`` may replace them.
- The *frontier* is the computable bindings read by a binding that is not computable (or returned).
  A frontier binding is replaced by its value as a constant when it is not a dequantize and its
  value is no larger than the constants it reads together, or than ``SMALL_BYTES`` (folding never
  grows the model by more than that per value: a row broadcast from a small table may be folded,
  a large tensor made from a scalar is not). A dequantize of constants stays, and so does a float
  value made from one (a bias reshaped for its add): they are weights, which a QDQ unit needs to
  see as such (and folding would quadruple their bytes); their computable operands become the
  frontier. A value re-quantized from one (a constant embedding row, quantized) is an integer
  constant and folds.
  A frontier binding too large to fold stays too, with the same consequence.
- Bindings no longer read are removed.

Guarantee: the function computes the same values (each folded value is what its ops compute on the
host's LLVM target, evaluated once by Relax's VM); nothing that depends on an input or a parameter
is folded, and neither is a weight's dequantize nor a float value made from one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..compiler.constant_values import constant_bytes, is_literal, is_tensor_constant
from ..compiler.relax_helpers import entry_pass, readers, replace_body, same_kind_block, with_operands
from .qdq import DEQUANTIZE

#: A folded value may be this large whatever it reads (a position embedding's rows, an index table).
SMALL_BYTES = 64 * 1024


def FoldConstantChains(entry: str = "main") -> tvm.transform.Pass:
    return entry_pass(entry, fold_constant_chains, "FoldConstantChains")


def fold_constant_chains(func: relax.Function) -> relax.Function:
    """``func`` with its foldable constant chains replaced by constants (module rule); ``func``
    itself when there are none."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    value_of = {b.var: b.value for b in bindings if isinstance(b, relax.VarBinding)}
    constants: dict[Any, int] = {}  # a constant -> its bytes
    leaves: dict[relax.Var, set] = {}  # computable var -> the constants it reads
    for var, value in value_of.items():
        found = _constant_leaves(value, leaves, constants)
        if found is not None:
            leaves[var] = found
    computable = {var: sum(constants[c] for c in read) for var, read in leaves.items()}  # var -> bytes read
    weight_values = _weight_values(value_of, computable)
    if not computable:
        return func
    read_by = readers(func)
    frontier = [v for v in computable if any(r is None or r not in computable for r in read_by.get(v, []))]
    fold: list[relax.Var] = []
    seen: set[relax.Var] = set()
    while frontier:
        var = frontier.pop()
        if var in seen:
            continue
        seen.add(var)
        value = value_of[var]
        is_dequantize = isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == DEQUANTIZE
        weight = var in weight_values and not _integer(var)  # a float weight as its QDQ unit reads it
        if not is_dequantize and not weight and _static(var.ty) and _bytes_of(var) <= max(computable[var], SMALL_BYTES):
            fold.append(var)
        else:
            frontier += [u for u in relax.analysis.free_vars(value) if u in computable]
    if not fold:
        return func
    try:
        values = _evaluate(bindings, value_of, computable, fold)
    except Exception:  # noqa: BLE001 (an op TVM cannot evaluate on the host: left to run, never an error)
        return func
    folded = {var: relax.const(value, str(var.ty.dtype)) for var, value in values.items()}
    new_blocks = []
    for block in func.body.blocks:
        kept = []
        for binding in block.bindings:
            value = binding.value
            if binding.var in folded:
                value = folded[binding.var]  # still bound: the function's output may name it
            elif isinstance(value, relax.Call) and any(u in folded for u in relax.analysis.free_vars(value)):
                value = with_operands(value, folded)  # readers see the constant itself
            kept.append(relax.VarBinding(binding.var, value))
        new_blocks.append(same_kind_block(block, kept))
    return replace_body(func, new_blocks)


def _constant_leaves(value: Any, leaves: dict, constants: dict) -> set | None:
    """The constants a computable value reads (recorded in ``constants`` with their bytes), or None
    when it is not computable."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    if value.op.name == "relax.shape_of":
        return set() if _static(value.args[0].ty) else None
    found: set = set()
    for arg in _operands(value):
        if is_tensor_constant(arg):
            constants[arg] = constant_bytes(arg)
            found.add(arg)
        elif is_literal(arg):
            continue  # a prim value, a string, a data type, a static shape: part of the op
        elif isinstance(arg, relax.ShapeExpr):
            return None  # a symbolic shape: known only at run time
        elif isinstance(arg, relax.Var):
            if arg not in leaves:
                return None
            found |= leaves[arg]
        elif isinstance(arg, relax.Expr) and relax.analysis.free_vars(arg):
            return None
    return found


def _operands(call: relax.Call) -> list[Any]:
    out = []
    for arg in call.args:
        out += list(arg.fields) if isinstance(arg, relax.Tuple) else [arg]
    return out


def _weight_values(value_of: dict, computable: dict) -> set:
    """The computable values made from a dequantize's values (not only its shape): a weight, or a
    bias reshaped for its add, as a QDQ unit reads it."""
    out: set = set()
    for var, value in value_of.items():
        if var not in computable or not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            continue
        if value.op.name == DEQUANTIZE or (value.op.name != "relax.shape_of" and any(
                u in out for u in relax.analysis.free_vars(value))):
            out.add(var)
    return out


def _integer(var: relax.Var) -> bool:
    return str(var.ty.dtype).startswith(("int", "uint", "bool"))


def _static(ty: Any) -> bool:
    """A tensor type of known shape."""
    return isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr) and all(
        isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values)


def _bytes_of(var: relax.Var) -> int:
    shape = [int(d) for d in var.ty.shape.values]
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(str(var.ty.dtype)).itemsize


def _evaluate(bindings: list, value_of: dict, computable: dict, fold: list[relax.Var]) -> dict:
    """The values of ``fold``, computed by one Relax function of the computable bindings they need,
    built for the host and run once."""
    needed: set[relax.Var] = set()
    stack = list(fold)
    while stack:
        var = stack.pop()
        if var in needed:
            continue
        needed.add(var)
        stack += [u for u in relax.analysis.free_vars(value_of[var]) if u in computable]
    body = [b for b in bindings if b.var in needed]
    results = [relax.Var(f"fold{i}", var.ty) for i, var in enumerate(fold)]  # a dataflow block's outputs
    body += [relax.VarBinding(result, var) for result, var in zip(results, fold)]
    out = relax.Tuple(results)
    program = relax.Function([], relax.SeqExpr([relax.DataflowBlock(body)], out), out.ty, True)
    mod = tvm.IRModule({"fold": program.with_attr("global_symbol", "fold")})
    executable = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    result = vm["fold"]()
    return {var: result[i].numpy() for i, var in enumerate(fold)}
