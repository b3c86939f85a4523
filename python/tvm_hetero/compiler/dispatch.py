"""Library dispatch: the ops TVM's default pipeline rewrites before legalization, per device target.

Some Relax ops have no ``LegalizeOps`` rule of their own (``cumsum``, ``sort``, ``topk``,
``multinomial_from_uniform``, ...): TVM's default pipeline for a target first runs
``tvm.relax.pipeline.library_dispatch_passes(target)`` (``DispatchSampling`` and
``DispatchSortScan`` in TVM 0.27, for CPU and GPU targets alike), which turn them into kernels
chosen for that target. Here each op already has a device, and devices may have different
targets, so:

1. the dispatch passes of each distinct target run over the whole module, only to find the op
   calls they change;
2. each such call is dispatched again alone, as the one call of a small function, under the
   target of the device it was placed on, and the result is spliced in its place: the helper
   bindings first, then the call's own variable bound to the dispatched value (the lowering
   traces kernels back to that variable).

Guarantee: a call is rewritten as TVM's dispatch passes rewrite it for its own device's target;
calls they leave alone, and region calls of external backends, are untouched. A target with no
dispatch passes in TVM (e.g. ``c``) dispatches nothing; an op that needed them then fails in
legalization with an error naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax
from tvm.relax.pipeline import library_dispatch_passes

_PURE_PACKED = "relax.call_pure_packed"
_VM_RESHAPE = "vm.builtin.reshape"


def dispatch_library_ops(
    mod: tvm.IRModule, entry: str, device_of: Mapping[relax.Var, int], targets: Sequence[Any] | None = None
) -> tvm.IRModule:
    """Run each op's device target's library dispatch passes on the op calls of ``entry``.

    ``device_of`` maps the bound variable of every op call to its device; ``targets[d]`` (a
    :class:`tvm.target.Target` or a string) is the target of device ``d``, ``llvm`` for every
    device when ``targets`` is None.
    """
    used = sorted(set(device_of.values()))
    resolved = {d: _target(targets, d) for d in used}
    distinct = {str(t): t for t in resolved.values()}
    changed: set[relax.Var] = set()
    for target in distinct.values():
        changed |= _calls_changed_by(mod, entry, target)
    changed &= set(device_of)
    if not changed:
        return mod
    func = mod[entry]
    builder = relax.BlockBuilder(mod)
    blocks = []
    for block in func.body.blocks:
        bindings: list[relax.Binding] = []
        for binding in block.bindings:
            if binding.var in changed:
                bindings.extend(_dispatch_one(builder, binding, resolved[device_of[binding.var]]))
            else:
                bindings.append(binding)
        kind = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        blocks.append(kind(bindings))
    body = relax.SeqExpr(blocks, func.body.body)
    new_func = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
    builder.update_func(mod.get_global_var(entry), builder.normalize(new_func))
    return builder.get()


def _target(targets: Sequence[Any] | None, device: int) -> tvm.target.Target:
    if targets is None:
        return tvm.target.Target("llvm")
    if not 0 <= device < len(targets):
        raise ValueError(f"an op is placed on device {device} but only {len(targets)} targets are given")
    target = targets[device]
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


def _run_passes(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    try:
        passes = library_dispatch_passes(target)
    except ValueError:  # a target TVM's pipelines do not know (e.g. "c"): nothing to dispatch
        return mod
    with target:
        return tvm.transform.Sequential(passes)(mod)


def _op_call_vars(func: relax.Function) -> dict[relax.Var, tvm.ir.Op]:
    return {
        b.var: b.value.op
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
    }


def _calls_changed_by(mod: tvm.IRModule, entry: str, target: tvm.target.Target) -> set[relax.Var]:
    """Variables of op calls of ``entry`` that no longer bind the same op after dispatch."""
    before = _op_call_vars(mod[entry])
    after = _op_call_vars(_run_passes(mod, target)[entry])
    return {var for var, op in before.items() if not (var in after and after[var].same_as(op))}


def _dispatch_one(
    builder: relax.BlockBuilder, binding: relax.VarBinding, target: tvm.target.Target
) -> list[relax.Binding]:
    """The bindings that replace ``binding`` once its call is dispatched for ``target``."""
    call = binding.value
    outer = list(relax.analysis.free_vars(call))
    params = [relax.Var(v.name, v.ty) for v in outer]
    inner = _substitute(call, dict(zip(outer, params)))
    small = relax.BlockBuilder()
    with small.function("main", params):
        with small.dataflow():
            out = small.emit_output(inner)
        small.emit_func_output(out)
    dispatched = _run_passes(small.get(), target)
    new_gvs = {
        gv: builder.add_func(f, gv.name_hint) for gv, f in dispatched.functions.items() if gv.name_hint != "main"
    }
    main = dispatched["main"].bind_params(dict(zip(dispatched["main"].params, outer)))
    result = main.body.body
    out: list[relax.Binding] = []
    for block in main.body.blocks:
        for b in block.bindings:
            value = _remap(b.value, new_gvs)
            var = binding.var if b.var.same_as(result) else b.var
            out.append(relax.VarBinding(var, value))
    if not any(b.var.same_as(binding.var) for b in out):
        raise ValueError(f"library dispatch of '{binding.var.name}' ({call.op.name}) lost its result")
    return out


def _substitute(expr: Any, mapping: dict[relax.Var, relax.Var]) -> Any:
    """``expr`` (a call and its arguments, tuples included) with variables replaced."""
    if isinstance(expr, relax.Var):
        return mapping.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_substitute(f, mapping) for f in expr.fields])
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [_substitute(a, mapping) for a in expr.args], expr.attrs, expr.ty_args)
    return expr


def _remap(value: Any, gvs: dict[tvm.ir.GlobalVar, tvm.ir.GlobalVar]) -> Any:
    """A dispatched value with its kernels renamed into the module; the VM's reshape builtin
    becomes ``relax.reshape`` (the graph has no VM to call it)."""
    if not isinstance(value, relax.Call):
        return value
    if (
        isinstance(value.op, tvm.ir.Op)
        and value.op.name == _PURE_PACKED
        and isinstance(value.args[0], relax.ExternFunc)
        and str(value.args[0].global_symbol) == _VM_RESHAPE
    ):
        return relax.op.reshape(value.args[1], value.args[2])
    args = [gvs.get(a, a) if isinstance(a, tvm.ir.GlobalVar) else a for a in value.args]
    return relax.Call(value.op, args, value.attrs, value.ty_args)
