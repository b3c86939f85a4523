"""Merging a backend's regions into blocks: consecutive region calls become one region call.

After matching, every region is one composite (an anchor op and its post-ops), so its output
leaves the backend at every region. :func:`merge_regions` joins region calls of one backend on
one device into a *block*: a region whose members run in order inside the backend, which keeps
the values passed between them in its own layouts (oneDNN's blocked layouts) and converts only
at the block's edges.

Algorithm (tree fusion from the sinks): walk the entry function's region calls from the last to
the first; an unassigned call starts a group as its sink; a region call is absorbed into the group
when every use of its value is a member of the group (repeated until nothing changes). A value
read by the function's output or by any op outside the group is never absorbed.

A block starts when all its inputs are ready, so a member *fed across devices* (an argument made
on another device) must not hold back members that need not wait for it: a group holds such a
member only as a source, every other member depending on it (through members). A backend whose
calls cost more than a short wait (a vendor graph execution) gives a ``wait_budget``: a member may then
join when no member would wait for more than that much of the other devices' work (elements their
ops make, in binding order) beyond its own inputs; a branch the host computes beside the block's
own work is never waited for. A chain that
continues on this device after a value from another device is still one block; a concat fed by
both devices' branches on a split placement is not joined with its own device's branch.

Guarantee: every group has one output (its sink's value; every other member's value is read only
inside the group) and is convex: each member reaches the sink through members, so a path that
leaves the group can only start at the sink, and no outside value depends on a member but through
the sink. Placing the block call where its sink was therefore keeps every use after its
definition; :func:`.region_check.check_partitioned` verifies that after partitioning.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..ir.relax_helpers import readers, replace_body, same_kind_block
from .base import Region

#: Attribute of a block function: how many regions it joined (for readers of the module).
BLOCK_SIZE_ATTR = "tvm_hetero.block_size"


def merge_regions(
    mod: tvm.IRModule, entry: str, regions: dict[str, Region], backend: str,
    device_of: dict[relax.Var, int] | None = None, wait_budget: int = 0,
) -> tuple[tvm.IRModule, dict[str, Region]]:
    """Join ``backend``'s region calls in ``entry`` into blocks; returns the module and every
    region still called (the blocks and the calls left alone), by symbol. ``device_of``: the
    placement's device of the entry's other bindings, where known (to see values fed across
    devices by ops that are no region). ``wait_budget``: how much work of the other devices (elements
    their ops make, in binding order) a block may make any member wait for beyond what it waits for
    anyway (0: a member fed across devices is held only as a source)."""
    func = mod[entry]
    calls: dict[relax.Var, tuple[Region, relax.Call]] = {}
    order: list[relax.Var] = []
    kept: dict[str, Region] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                region = regions.get(value.op.name_hint)
                if region is not None and region.backend == backend and _is_static_tensor(binding.var):
                    calls[binding.var] = (region, value)
                    order.append(binding.var)
                elif region is not None:
                    kept[region.name] = region  # not a tensor: left alone
    users = {var: set(read) for var, read in readers(func).items()}
    placed = device_of or {}
    constants = _computed_from_constants(func)

    def made_on(value: Any) -> int | None:  # None: no device makes it at run time (a folded constant)
        if value in constants:
            return None
        return calls[value][0].device if value in calls else placed.get(value)

    fed_across = {var for var in order
                  if any((d := made_on(arg)) is not None and d != calls[var][0].device for arg in calls[var][1].args)}
    order_of = {var: k for k, var in enumerate(order)}
    ready = _ready_after(func, calls, made_on) if wait_budget > 0 else {}
    group_of: dict[relax.Var, relax.Var] = {}  # member -> its group's sink
    groups: dict[relax.Var, list[relax.Var]] = {}
    for sink in reversed(order):
        if sink in group_of:
            continue
        members = {sink}
        group_of[sink] = sink
        changed = True
        while changed:
            changed = False
            for var in members.copy():  # members grows inside the loop
                for arg in calls[var][1].args:
                    if arg in members or arg not in calls or arg in group_of:
                        continue
                    if calls[arg][0].device != calls[sink][0].device:
                        continue
                    if users.get(arg) and users[arg] <= members and (
                            _waits_for_nothing_new(arg, members, fed_across, calls, order_of)
                            or (wait_budget > 0 and _waits_within(arg, members, calls, order_of, ready, wait_budget))):
                        members.add(arg)
                        group_of[arg] = sink
                        changed = True
        groups[sink] = [v for v in order if v in members]

    new_value: dict[relax.Var, relax.Call] = {}
    builder = relax.BlockBuilder(mod)
    for sink, members in groups.items():
        if len(members) == 1:
            region = calls[sink][0]
            kept[region.name] = region
            continue
        region, inputs, function = _block(sink, members, calls, len(new_value))
        gv = builder.add_func(function, region.name)
        new_value[sink] = relax.Call(gv, inputs)
        kept[region.name] = region
    if not new_value:
        return mod, kept
    mod = builder.get()
    dropped = {v for v, sink in group_of.items() if v is not sink and sink in new_value}
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            if binding.var in dropped:
                continue
            if binding.var in new_value:
                binding = relax.VarBinding(binding.var, new_value[binding.var])
            bindings.append(binding)
        blocks.append(same_kind_block(block, bindings))
    mod[entry] = replace_body(func, blocks)
    return mod, kept


def _waits_for_nothing_new(candidate: relax.Var, members: set[relax.Var], fed_across: set[relax.Var],
                           calls: dict[relax.Var, tuple[Region, relax.Call]], order_of: dict[relax.Var, int]) -> bool:
    """Whether adding ``candidate`` keeps every member fed across devices a source of the group:
    each such member (``candidate`` included) has every other member depend on it."""
    group = members | {candidate}

    def depends_on(member: relax.Var, source: relax.Var) -> bool:
        stack, seen = [member], set()
        while stack:
            var = stack.pop()
            if var.same_as(source):
                return True
            if var in seen:
                continue
            seen.add(var)
            stack.extend(a for a in calls[var][1].args if a in group)
        return False

    free = _free_members(group, calls, order_of)

    return all(depends_on(other, source) for source in group & fed_across for other in group
               if not other.same_as(source) and other not in free)


def _free_members(group: set[relax.Var], calls: dict[relax.Var, tuple[Region, relax.Call]],
                  order_of: dict[relax.Var, int]) -> set[relax.Var]:
    """Members computed from constants alone (a weight's dequantize, its bias reshaped after the
    bias's dequantize): they wait for nothing and cost nothing worth starting early."""
    free: set[relax.Var] = set()
    for var in sorted(group, key=lambda v: order_of[v]):
        if all(isinstance(a, tvm.ir.Constant) or a in free for a in calls[var][1].args):
            free.add(var)
    return free


def _ready_after(func: relax.Function, calls: dict[relax.Var, tuple[Region, relax.Call]],
                 made_on: Any) -> dict[relax.Var, int]:
    """Per region call, how much work of other devices comes before its latest input from them:
    the elements the ops outside this backend's regions make, summed in binding order up to the
    binding of that input (the order the other devices run them; an input of the function is 0)."""
    done, upto = 0, {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if binding.var not in calls:
                ty = binding.var.ty
                if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
                    done += int(np.prod([int(d) for d in ty.shape.values], dtype=np.int64))
            upto[binding.var] = done
    ready = {}
    for var, (region, call) in calls.items():
        ready[var] = max((upto.get(a, 0) for a in call.args
                          if (d := made_on(a)) is not None and d != region.device), default=0)
    return ready


def _waits_within(candidate: relax.Var, members: set[relax.Var], calls: dict[relax.Var, tuple[Region, relax.Call]],
                  order_of: dict[relax.Var, int], ready: dict[relax.Var, int], budget: int) -> bool:
    """Whether adding ``candidate`` makes no member wait for more than ``budget`` work of other
    devices beyond its own inputs' (through members): a block starts when its latest input is
    ready, so a member needing only earlier ones waits for the difference."""
    group = members | {candidate}
    free = _free_members(group, calls, order_of)
    own: dict[relax.Var, int] = {}
    for var in sorted(group, key=lambda v: order_of[v]):  # inputs before users
        own[var] = max([ready[var]] + [own[a] for a in calls[var][1].args if a in group and a in own])
    start = max(own.values())
    return all(start - own[var] <= budget for var in group if var not in free)


def _block(
    sink: relax.Var,
    members: list[relax.Var],
    calls: dict[relax.Var, tuple[Region, relax.Call]],
    index: int,
) -> tuple[Region, list[Any], relax.Function]:
    """The block of ``members`` (in order, ``sink`` last): its region, call arguments and function
    (one parameter per outside value read, each member's function called in order); its symbol is
    the sink region's with ``_block<index>`` before the backend's name."""
    inputs: list[Any] = []  # outside values read, in order of first use

    def input_index(expr: Any) -> int:
        for i, seen in enumerate(inputs):
            if seen.same_as(expr):
                return i
        inputs.append(expr)
        return len(inputs) - 1

    step_of = {var: k for k, var in enumerate(members)}
    step_args = []
    for var in members:
        args = calls[var][1].args
        step_args.append([("step", step_of[a]) if a in step_of else ("input", input_index(a)) for a in args])
    n = len(inputs)
    params = [relax.Var(f"in{i}", _type_of(x)) for i, x in enumerate(inputs)]
    bindings, outs, steps, ops = [], [], [], []
    for k, var in enumerate(members):
        region, call = calls[var]
        args = [params[i] if kind == "input" else outs[i] for kind, i in step_args[k]]
        out = relax.Var(f"step{k}", var.ty)
        bindings.append(relax.VarBinding(out, relax.Call(call.op, args)))
        outs.append(out)
        spec = {key: v for key, v in region.spec.items() if key not in ("name", "num_inputs")}
        spec["args"] = [i if kind == "input" else n + i for kind, i in step_args[k]]
        spec["shape"] = [int(d) for d in var.ty.shape.values]
        steps.append(spec)
        ops.extend(region.ops)
    sink_region = calls[sink][0]
    stem = sink_region.name.removesuffix(f"_{sink_region.backend}")
    name = f"{stem}_block{index}_{sink_region.backend}"
    body = relax.SeqExpr([relax.BindingBlock(bindings)], outs[-1])
    function = relax.Function(params, body, sink.ty, True)
    for key, value in {"Codegen": sink_region.backend, BLOCK_SIZE_ATTR: len(members)}.items():
        function = function.with_attr(key, value)
    region = Region(
        name=name,
        backend=sink_region.backend,
        device=sink_region.device,
        pattern="block",
        ops=ops,
        spec={"name": name, "op": "block", "num_inputs": n, "steps": steps},
        moved=[moved for var in members for moved in calls[var][0].moved],
    )
    return region, inputs, function


def _computed_from_constants(func: relax.Function) -> set[relax.Var]:
    """Bindings computed from constants alone (a bias reshaped, a weight dequantized): the build
    folds them, so they are ready before any run and hold no block back."""
    out: set[relax.Var] = set()
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and all(
                    isinstance(a, tvm.ir.Constant) or a in out or not isinstance(a, relax.Var | relax.Tuple)
                    for a in value.args):
                out.add(binding.var)
    return out


def _is_static_tensor(var: relax.Var) -> bool:
    """A tensor of known shape: what a block's step describes (a region returning anything else is
    left alone, for :func:`.region_check.check_partitioned` to name)."""
    ty = var.ty
    return isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)


def _type_of(expr: Any) -> Any:
    ty = getattr(expr, "ty", None)
    if ty is None:
        raise ValueError(f"region block: an input ({expr}) has no type")
    return ty
