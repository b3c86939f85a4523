"""Fold every constant subgraph of a Relax function before partitioning: an op whose operands are
all constants runs once, at build time, and its result becomes a constant.

Frontends leave weights as computations: the ONNX wheel's light models make every weight with
``ConstantOfShape`` (a ``broadcast_to`` of a scalar), an exporter reshapes or transposes a weight,
a shape is computed from a static shape. A backend's patterns take a convolution or a matmul only
when its weight *is* a constant, so these must be folded before the backends look.

Rule, per binding of the function, in order:

- *computable*: a call to an op (no packed call, print or assert) whose operands are tensor
  constants, literals (static shapes, prim values, data types) or computable bindings; and
  ``shape_of`` of a tensor of static shape. A
  function parameter is never constant, even with a value given at build (``params=``): the
  runtime's ``set_params`` may replace it.
- The values kept are the computable bindings read by a binding that is not computable, or
  returned (the *frontier*; the values between are computed on the way, not kept). A frontier value
  is folded when its bytes are at most ``max(bytes of the constants it is computed from,
  limit_bytes)`` (default :data:`FOLD_LIMIT_BYTES`): a weight made from a scalar folds, a tensor
  beyond the limit made from a small one stays an op (its computable operands are then considered
  in its place).
- A ``dequantize`` stays, and so does a float value computed from one: they are how a quantized
  weight is written, and the int8 / QDQ patterns must see them (folding would also quadruple the
  bytes); their computable operands are considered in their place.
- An op the host cannot evaluate stays an op (never an error).

Guarantee: the function computes the same values (each folded value is what its ops compute on
the host's LLVM target, run once by Relax's VM); nothing that depends on an input or a parameter is
folded. :func:`computed_weight_notes` says which weights a backend still sees computed, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .relax_helpers import entry_pass, readers, replace_body, same_kind_block, static_shape, with_operands

#: A folded value may always be this large (otherwise at most the bytes it is computed from).
FOLD_LIMIT_BYTES = 64 * 2**20
DEQUANTIZE = "relax.dequantize"
SHAPE_OF = "relax.shape_of"
#: Ops that do more than compute a value from their operands: never run at build time.
EFFECT_OPS = frozenset({"relax.print", "relax.assert_op", "relax.call_packed", "relax.call_pure_packed",
                        "relax.call_builtin_with_ctx", "relax.call_dps_packed", "relax.call_inplace_packed"})


def FoldConstantOps(entry: str = "main", limit_bytes: int = FOLD_LIMIT_BYTES) -> tvm.transform.Pass:
    """The pass (module docstring) over the function ``entry``; other functions are left alone."""
    return entry_pass(entry, lambda func: fold_constant_ops(func, limit_bytes), "FoldConstantOps")


@dataclass
class ConstantAnalysis:
    """Which bindings of a function are computable from constants alone (module rule)."""

    #: Binding variable -> its value, for every variable binding.
    value_of: dict[relax.Var, Any]
    #: Computable variable -> the bytes of the tensor constants it is computed from.
    computable: dict[relax.Var, int]
    #: Computable variables whose value is (made from) a dequantize: quantized weights, kept.
    quantized: set[relax.Var]


def analyse_constants(func: relax.Function) -> ConstantAnalysis:
    """The computable bindings of ``func`` (module rule)."""
    value_of = {b.var: b.value for block in func.body.blocks for b in block.bindings
                if isinstance(b, relax.VarBinding)}
    leaves: dict[relax.Var, frozenset] = {}  # computable var -> the tensor constants it reads
    sizes: dict[Any, int] = {}
    quantized: set[relax.Var] = set()
    for var, value in value_of.items():
        found = _constant_leaves(value, leaves, sizes)
        if found is None:
            continue
        leaves[var] = found
        if _op_name(value) == DEQUANTIZE or (_op_name(value) != SHAPE_OF and not _integer(var) and any(
                u in quantized for u in relax.analysis.free_vars(value))):
            quantized.add(var)
    computable = {var: sum(sizes[c] for c in read) for var, read in leaves.items()}
    return ConstantAnalysis(value_of, computable, quantized)


def fold_constant_ops(func: relax.Function, limit_bytes: int = FOLD_LIMIT_BYTES) -> relax.Function:
    """``func`` with its constant subgraphs folded (module rule); ``func`` itself when none folds."""
    analysis = analyse_constants(func)
    if not analysis.computable:
        return func
    values = evaluate_on_host(analysis, _chosen(func, analysis, limit_bytes))
    return with_constants(func, values) if values else func


def with_constants(func: relax.Function, values: dict[relax.Var, np.ndarray]) -> relax.Function:
    """``func`` with each binding of ``values`` bound to its value as a constant, its readers reading
    that constant, and the bindings nobody reads any more removed."""
    folded = {var: relax.const(value, str(var.ty.dtype)) for var, value in values.items()}
    blocks = []
    for block in func.body.blocks:
        kept = []
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                kept.append(binding)  # a match_cast reads the folded variable, still bound to its constant
                continue
            value = binding.value
            if binding.var in folded:
                value = folded[binding.var]  # still bound: the function's output may name it
            elif isinstance(value, relax.Call) and any(u in folded for u in relax.analysis.free_vars(value)):
                value = with_operands(value, folded)  # readers see the constant itself
            kept.append(relax.VarBinding(binding.var, value))
        blocks.append(same_kind_block(block, kept))
    # The values between a fold and its constants are read by nobody now: drop them.
    return relax.analysis.remove_all_unused(replace_body(func, blocks))


#: Ops whose second operand is a weight a backend needs constant.
WEIGHTED_OPS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv2d_transpose",
                "relax.matmul")


def computed_weight_notes(func: relax.Function, backends: list[str],
                          limit_bytes: int = FOLD_LIMIT_BYTES) -> list[str]:
    """One line per convolution or matmul of ``func`` left to TVM whose weight is computed from
    constants rather than a constant (no backend takes such an op), saying why it was not folded.
    Quantized weights (a dequantize) are not listed: the int8 patterns take them as they are."""
    analysis = analyse_constants(func)
    notes = []
    count: dict[str, int] = {}
    for var, value in analysis.value_of.items():
        name = _op_name(value)
        if name not in WEIGHTED_OPS:
            continue
        count[name] = count.get(name, 0) + 1
        weight = value.args[1]
        if _op_name(analysis.value_of.get(weight)) == "relax.permute_dims":
            weight = analysis.value_of[weight].args[0]  # a matmul's transposed weight
        if (not isinstance(weight, relax.Var) or weight not in analysis.computable
                or weight in analysis.quantized):
            continue
        size, read = _bytes_of(weight), analysis.computable[weight]
        why = (f"folding it would make {_size(size)} from {_size(read)}, over the limit of "
               f"{_size(limit_bytes)}"
               if size > max(read, limit_bytes) else "constant folding did not run on it")
        notes.append(f"{'/'.join(backends)}: {name.removeprefix('relax.')} #{count[name]} '{var.name}' "
                     "not taken: "
                     f"weight '{weight.name}' is computed, not constant ({why})")
    return notes


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes} B"


def _chosen(func: relax.Function, analysis: ConstantAnalysis, limit_bytes: int) -> list[relax.Var]:
    """The computable values to fold: the frontier, walked back past values that may not fold."""
    computable = analysis.computable
    read_by = readers(func)
    frontier = [v for v in computable if any(r is None or r not in computable for r in read_by.get(v, []))]
    chosen: list[relax.Var] = []
    seen: set[relax.Var] = set()
    while frontier:
        var = frontier.pop()
        if var in seen:
            continue
        seen.add(var)
        small = _static(var) and _bytes_of(var) <= max(computable[var], limit_bytes)
        if var not in analysis.quantized and small:
            chosen.append(var)
        else:
            frontier += [u for u in relax.analysis.free_vars(analysis.value_of[var]) if u in computable]
    return chosen


def _constant_leaves(value: Any, leaves: dict, sizes: dict) -> frozenset | None:
    """The tensor constants a computable value reads (their bytes recorded in ``sizes``), or None
    when the value is not computable."""
    if _op_name(value) is None or value.op.name in EFFECT_OPS:
        return None
    if value.op.name == SHAPE_OF:
        return frozenset() if _static_type(value.args[0].ty) else None
    found: set = set()
    for arg in _operands(value):
        if isinstance(arg, relax.Var):
            if arg not in leaves:
                return None
            found |= leaves[arg]
        elif isinstance(arg, tvm.ir.Constant) and hasattr(getattr(arg, "value", None), "numpy"):
            sizes[arg] = int(arg.value.numpy().nbytes)
            found.add(arg)
        elif isinstance(arg, tvm.ir.GlobalVar | relax.ExternFunc):
            return None  # a call into a function of the module or outside it: not an op's value
        elif isinstance(arg, relax.Expr) and (relax.analysis.free_vars(arg) or _symbolic_shape(arg)):
            return None
    return frozenset(found)


def _operands(call: relax.Call) -> list[Any]:
    out = []
    for arg in call.args:
        out += list(arg.fields) if isinstance(arg, relax.Tuple) else [arg]
    return out


def _symbolic_shape(expr: Any) -> bool:
    return isinstance(expr, relax.ShapeExpr) and not all(isinstance(d, tvm.tirx.IntImm) for d in expr.values)


def _op_name(value: Any) -> str | None:
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else None


def _integer(var: relax.Var) -> bool:
    return isinstance(var.ty, relax.TensorType) and str(var.ty.dtype).startswith(("int", "uint", "bool"))


def _static_type(ty: Any) -> bool:
    return isinstance(ty, relax.TensorType) and static_shape(ty) is not None and bool(str(ty.dtype))


def _static(var: relax.Var) -> bool:
    return _static_type(var.ty)


def _bytes_of(var: relax.Var) -> int:
    return int(np.prod(static_shape(var.ty), dtype=np.int64)) * np.dtype(str(var.ty.dtype)).itemsize


def evaluate_on_host(analysis: ConstantAnalysis, fold: list[relax.Var]) -> dict[relax.Var, np.ndarray]:
    """The values of the computable bindings ``fold``: all in one host function, or (when one op
    cannot be built or run on the host) each alone, leaving out the ones that fail."""
    if not fold:
        return {}
    together = _try_on_host(analysis, fold)
    if together is not None:
        return together
    out: dict[relax.Var, np.ndarray] = {}
    for var in fold:  # some op TVM cannot evaluate on the host: find it, fold the rest
        out.update(_try_on_host(analysis, [var]) or {})
    return out


def _try_on_host(analysis: ConstantAnalysis, fold: list[relax.Var]) -> dict[relax.Var, np.ndarray] | None:
    try:
        return _run_on_host(analysis, fold)
    except Exception:  # noqa: BLE001 (TVM raises several kinds for an op it cannot build or run: it stays an op)
        return None


def _without_inputs(value: Any) -> Any:
    """A computable value as the host function computes it: ``shape_of`` of a static-shaped tensor is
    its shape (the tensor, an input's value, is not there)."""
    if _op_name(value) == SHAPE_OF:
        return relax.ShapeExpr(value.args[0].ty.shape.values)
    return value


def _run_on_host(analysis: ConstantAnalysis, fold: list[relax.Var]) -> dict[relax.Var, np.ndarray]:
    """One Relax function of the computable bindings ``fold`` needs, built for the host and run once."""
    needed: set[relax.Var] = set()
    stack = list(fold)
    while stack:
        var = stack.pop()
        if var in needed:
            continue
        needed.add(var)
        stack += [u for u in relax.analysis.free_vars(analysis.value_of[var]) if u in analysis.computable]
    body = [relax.VarBinding(var, _without_inputs(value)) for var, value in analysis.value_of.items()
            if var in needed]
    # Dataflow variables may not leave their block: each value leaves through a plain variable.
    results = [relax.Var(f"folded{i}", var.ty) for i, var in enumerate(fold)]
    body += [relax.VarBinding(result, var) for result, var in zip(results, fold)]
    out = relax.Tuple(results)
    program = relax.Function([], relax.SeqExpr([relax.DataflowBlock(body)], out), out.ty, True)
    module = tvm.IRModule({"fold": program.with_attr("global_symbol", "fold")})
    executable = tvm.compile(module, target="llvm")
    result = relax.VirtualMachine(executable, tvm.cpu())["fold"]()
    return {var: result[i].numpy() for i, var in enumerate(fold)}


__all__ = ["FOLD_LIMIT_BYTES", "ConstantAnalysis", "FoldConstantOps", "analyse_constants",
           "computed_weight_notes", "evaluate_on_host", "fold_constant_ops", "with_constants"]
