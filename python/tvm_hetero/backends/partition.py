"""Partitioning: the entry function's op calls that a backend runs become calls to regions.

For each backend in order (the first gets the first pick): ``backend.prepare`` rewrites the
module (e.g. folds batch norm), then ``FuseOpsByPattern(annotate_codegen=True,
bind_constants=False)`` turns every match of its patterns into a call to a function with the
``Codegen`` attribute; weights stay arguments of that call, so they become graph parameters. A
pattern's check applies the backend's legality rules and its cost gate (``min_flops``); what no
pattern takes stays a Relax op and is lowered to TVM kernels (the fallback). Each region is one
composite (an anchor op and its fused post-ops); a backend that ``merges_regions`` then has its
consecutive region calls joined into blocks (:mod:`.merge_regions`), one region each.

A backend with ``device=None`` follows the placement: after its ``prepare``, ``place`` gives
every op call of the entry function a device; a match is taken only if its anchor op's device
can run the backend, and its region runs there. A backend pinned to a device (``device=`` a
position) wins over the placement: its matches are taken wherever their ops were placed, and each
region records the ops it took from another device (:attr:`Region.moved`, from the composite's
``tvm_hetero.moved_ops`` attribute) for the build report.

Guarantee: every region has one output and its intermediate values are used only inside it (the
backends' pattern checks reject a match that would leak one; a block takes in a region call only
when every reader of its value is in the block, and never one on another device), and :func:`.region_check.
check_partitioned` verifies that, with every use after its definition, after each partitioning.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import tvm
from tvm import relax
from tvm.relax.transform import FusionPattern

from ..ir.relax_helpers import same_kind_block, with_entry_body
from .base import Backend, MovedOp, Region
from .merge_regions import merge_regions
from .region_check import check_partitioned

CODEGEN_ATTR = "Codegen"
COMPOSITE_ATTR = "Composite"
#: Attribute of a composite made for a backend that follows the placement: its device position.
DEVICE_ATTR = "tvm_hetero.device"
#: Attribute of a composite of a pinned backend: the ops it took from another device (JSON list of
#: ``[name, op, placed device]``).
MOVED_ATTR = "tvm_hetero.moved_ops"
#: The annotation every backend pattern gives its anchor op (the op the placement is asked about).
ANCHOR = "anchor"


#: ``place(entry_function) -> {bound variable: device}``: the placement's decision for every op call.
PlaceCalls = Callable[[relax.Function], dict[relax.Var, int]]


def partition_for_backends(
    mod: tvm.IRModule,
    backends: Sequence[Backend],
    entry: str = "main",
    weights: frozenset[str] = frozenset(),
    place: PlaceCalls | None = None,
    weight_values: dict[str, Any] | None = None,
    report_moves: bool = True,
) -> tuple[tvm.IRModule, dict[str, Region]]:
    """Partition ``entry`` for ``backends``; returns the module and its regions by symbol.

    ``weights`` names the function parameters whose values are given at build time; they and
    constants are what a backend may treat as weights. ``place`` is needed by backends that
    follow the placement (``device=None``); with ``report_moves`` (and ``place``) the regions of a
    pinned backend record the ops they take from the device ``place`` gives them.
    """
    regions: dict[str, Region] = {}
    for backend in backends:
        backend.require_available()
        mod = backend.prepare(mod, entry)
        patterns = backend.patterns(lambda expr: _is_weight(expr, weights))
        device_of = None
        if backend.follows_placement():
            if place is None:
                raise ValueError(
                    f"backend {backend.name!r} follows the placement, but no placement was given"
                )
            device_of = place(mod[entry])
            patterns = [_on_placed_device(p, backend, device_of) for p in patterns]
        elif place is not None and report_moves:
            patterns = [_recording_moves(p, backend, place(mod[entry])) for p in patterns]
        mod = relax.transform.FuseOpsByPattern(
            patterns, bind_constants=False, annotate_codegen=True, entry_functions=[entry]
        )(mod)
        if backend.unique_regions():
            mod = _unshare_region_calls(mod, entry, backend.name)
        found = _collect_regions(mod, backend, set(regions))
        backend.bind_call_sites(mod[entry], found, dict(weight_values or {}))
        if backend.merges_regions():
            if device_of is None and place is not None:
                # A pinned backend's blocks must still see which of their inputs another device makes
                # (the ops it left, where the placement puts them), or a block would wait for them.
                device_of = place(mod[entry])
            mod, found = merge_regions(mod, entry, found, backend.name, device_of,
                                       wait_budget=backend.block_wait_budget())
        regions.update(found)
    check_partitioned(mod, entry, regions)
    return mod, regions


def _unshare_region_calls(mod: tvm.IRModule, entry: str, backend: str) -> tvm.IRModule:
    """Every call site of ``backend``'s region functions calls a function of its own (matching
    shares one function between structurally equal matches), for backends that compile each call
    site's weights into its region. A copy differs from the original by a ``tvm_hetero.call_site``
    attribute, so the module keeps it apart."""
    func = mod[entry]
    seen: set[str] = set()
    builder = relax.BlockBuilder(mod)
    blocks, changed = [], False
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                callee = mod[value.op]
                name = value.op.name_hint
                if (isinstance(callee, relax.Function) and callee.attrs is not None and CODEGEN_ATTR in callee.attrs
                        and str(callee.attrs[CODEGEN_ATTR]) == backend):
                    if name in seen:
                        fresh = f"{name.removesuffix('_' + backend)}_site{len(seen)}_{backend}"
                        copy = callee.with_attr("tvm_hetero.call_site", fresh)
                        if "global_symbol" in callee.attrs:
                            copy = copy.with_attr("global_symbol", fresh)
                        gv = builder.add_func(copy, fresh)
                        binding = relax.VarBinding(binding.var, relax.Call(gv, value.args, value.attrs,
                                                                           value.ty_args))
                        name, changed = gv.name_hint, True
                    seen.add(name)
            bindings.append(binding)
        blocks.append(same_kind_block(block, bindings))
    return with_entry_body(builder.get(), entry, func, blocks) if changed else mod


def region_calls(func: relax.Function, regions: dict[str, Region]) -> list[tuple[relax.Var, Region]]:
    """The bindings of ``func`` that call a region, in order."""
    out = []
    for block in func.body.blocks:
        for binding in block.bindings:
            region = region_of(binding.value, regions)
            if region is not None:
                out.append((binding.var, region))
    return out


def region_of(value: Any, regions: dict[str, Region]) -> Region | None:
    """The region a binding value calls, or None."""
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
        return regions.get(value.op.name_hint)
    return None


def _on_placed_device(pattern: FusionPattern, backend: Backend, device_of: dict[relax.Var, int]) -> FusionPattern:
    """``pattern`` whose check also wants the anchor op on a device the backend runs on, and
    whose composite function records that device (:data:`DEVICE_ATTR`): composites on different
    devices are different functions, so each region symbol has one device. The placement is keyed
    by binding variable: matching sees other call objects than the function it was given, but
    the same variables."""
    inner = pattern.check
    chosen: dict[Any, int] = {}  # anchor call (as matching sees it) -> device

    def check(ctx: Any) -> bool:
        if inner is not None and not inner(ctx):
            return False
        anchor = ctx.annotated_expr.get(ANCHOR)
        device = device_of.get(ctx.value_to_bound_var.get(anchor))
        if device is None or not backend.runs_on(device):
            return False
        # Every op the region would take must be placed where its anchor is: a region never moves
        # an op the placement put on another device (e.g. a bias add and relu sent to a board).
        if any(device_of.get(var, device) != device for var in ctx.matched_bindings):
            return False
        chosen[anchor] = device
        return True

    def attrs(annotated: Any) -> dict[str, str]:
        out = dict(pattern.attrs_getter(annotated)) if pattern.attrs_getter is not None else {}
        out[DEVICE_ATTR] = str(chosen[annotated[ANCHOR]])
        return out

    return FusionPattern(pattern.name, pattern.pattern, pattern.annotation_patterns, check, attrs)


def _recording_moves(pattern: FusionPattern, backend: Backend, device_of: dict[relax.Var, int]) -> FusionPattern:
    """``pattern`` of a backend pinned to ``backend.device`` whose composite function records the
    ops of its match that the placement put on another device (:data:`MOVED_ATTR`). The check
    notes them per anchor; the attributes are asked only for the matches taken."""
    inner = pattern.check
    order = {var: i for i, var in enumerate(device_of)}
    moved: dict[Any, list[list[Any]]] = {}  # anchor call (as matching sees it) -> [name, op, device]

    def check(ctx: Any) -> bool:
        if inner is not None and not inner(ctx):
            return False
        elsewhere = sorted(
            (var for var in ctx.matched_bindings if device_of.get(var, backend.device) != backend.device),
            key=lambda var: order[var],
        )
        moved[ctx.annotated_expr.get(ANCHOR)] = [
            [var.name, _op_name(ctx.matched_bindings[var]), device_of[var]] for var in elsewhere
        ]
        return True

    def attrs(annotated: Any) -> dict[str, str]:
        out = dict(pattern.attrs_getter(annotated)) if pattern.attrs_getter is not None else {}
        if moved.get(annotated[ANCHOR]):
            out[MOVED_ATTR] = json.dumps(moved[annotated[ANCHOR]])
        return out

    return FusionPattern(pattern.name, pattern.pattern, pattern.annotation_patterns, check, attrs)


def _op_name(value: Any) -> str:
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else type(value).__name__


def _collect_regions(mod: tvm.IRModule, backend: Backend, known: set[str]) -> dict[str, Region]:
    found: dict[str, Region] = {}
    for gv, func in mod.functions.items():
        name = gv.name_hint
        if name in known or not isinstance(func, relax.Function) or func.attrs is None:
            continue
        if CODEGEN_ATTR not in func.attrs or str(func.attrs[CODEGEN_ATTR]) != backend.name:
            continue
        composite, pattern = _composite_of(func)
        spec = backend.describe(composite, pattern)
        spec["name"] = name
        moved = json.loads(str(composite.attrs[MOVED_ATTR])) if MOVED_ATTR in composite.attrs else []
        found[name] = Region(
            name=name,
            backend=backend.name,
            device=backend.device if backend.device is not None else int(composite.attrs[DEVICE_ATTR]),
            pattern=pattern,
            ops=_ops_of(composite),
            spec=spec,
            moved=[MovedOp(str(n), str(op), int(d)) for n, op, d in moved],
        )
    return found


def _composite_of(func: relax.Function) -> tuple[relax.Function, str]:
    """The composite function a Codegen function wraps; its params are the region's inputs."""
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if (
                isinstance(value, relax.Function)
                and value.attrs is not None
                and COMPOSITE_ATTR in value.attrs
            ):
                return value, str(value.attrs[COMPOSITE_ATTR])
            if isinstance(value, relax.Call) and isinstance(value.op, relax.Function):
                inner = value.op
                if inner.attrs is not None and COMPOSITE_ATTR in inner.attrs:
                    return inner, str(inner.attrs[COMPOSITE_ATTR])
    raise ValueError(f"codegen function has no composite inside:\n{func}")


def _ops_of(func: relax.Function) -> list[str]:
    return [
        b.value.op.name
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
    ]


def _is_weight(expr: Any, weights: frozenset[str]) -> bool:
    if isinstance(expr, tvm.ir.Constant):
        return True
    # Function parameters are the only non-dataflow vars a match can see.
    return (
        isinstance(expr, relax.Var) and not isinstance(expr, relax.DataflowVar) and expr.name in weights
    )
