"""External backends as a measured choice: which ops each region holds, and a backend that forms
only the regions the solver chose.

A backend (:class:`~tvm_hetero.backends.Backend`, e.g. oneDNN) is used as it is: its ``prepare``,
its patterns and their checks decide what a region is; this module never forms a region itself.
It treats a region as an opaque unit with an *anchor* op and a set of ops, and needs two things:

- **What a region holds** (:func:`partition_with_ops`): the module is partitioned by the backend's
  own :func:`~tvm_hetero.backends.partition.partition_for_backends` with every op on one device,
  through a :class:`ChosenRegions` wrapper that records every match its patterns' checks accept
  (the pattern, the names of the anchor and of the bindings matched, what it reads). Each region
  call of the partitioned function is then tied to one recorded match (see the function); a
  region that cannot be tied to exactly one is reported unidentified and its ops are left to TVM
  kernels, never attributed wrongly.
- **Forming only the chosen regions** (:class:`ChosenRegions` with ``anchors``): the backend's
  patterns with a check that also wants the match's anchor among the chosen anchors. Every other
  check is the backend's own, so a chosen region is formed as the backend forms it.

The wrapper's ``prepare`` does nothing: automatic placement prepares the module once
(:func:`prepare`) and lowers the prepared module, so every lowering sees the same bindings and the
op names agree between them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax
from tvm.relax.transform import FusionPattern

from ...backends import Backend, Region
from ...backends.partition import ANCHOR, COMPOSITE_ATTR, partition_for_backends


@dataclass
class Match:
    """One match a pattern's check accepted: its pattern, the names of its anchor and op bindings,
    and what it reads (variables and constants, by identity: partitioning renames the variables
    of the region calls it makes, but keeps the objects)."""

    pattern: str
    anchor: str
    ops: frozenset[str]
    reads: frozenset[Any]


class ChosenRegions(Backend):
    """``inner``'s regions, each on the device the placement gives its anchor, and (with
    ``anchors``) only those whose anchor binding is named in ``anchors``."""

    def __init__(self, inner: Backend, devices: Collection[int], anchors: Collection[str] | None = None) -> None:
        super().__init__(device=None, min_flops=inner.min_flops, devices=devices)
        self.inner = inner
        self.name = inner.name
        self.anchors = None if anchors is None else frozenset(anchors)
        #: Every match a check accepted, in the order the checks ran.
        self.matches: list[Match] = []

    def available(self) -> bool:
        return self.inner.available()

    def merges_regions(self) -> bool:
        # Measured and chosen one region at a time; the build then joins the chosen regions of a
        # device into blocks as the backend would (never while measuring: a block would hide its
        # members' choices).
        return self.anchors is not None and self.inner.merges_regions()

    def prepare(self, mod: tvm.IRModule, entry: str) -> tvm.IRModule:
        return mod  # prepared once by automatic placement (see the module docstring)

    def patterns(self, is_weight: Any) -> list[FusionPattern]:
        return [self._chosen(p) for p in self.inner.patterns(is_weight)]

    def describe(self, composite: Any, pattern: str) -> dict:
        return self.inner.describe(composite, pattern)

    def codegen(self, regions: list[Region]) -> tvm.runtime.Module:
        return self.inner.codegen(regions)

    def _chosen(self, pattern: FusionPattern) -> FusionPattern:
        inner_check = pattern.check

        def check(ctx: Any) -> bool:
            anchor = ctx.value_to_bound_var.get(ctx.annotated_expr.get(ANCHOR))
            if anchor is None or (self.anchors is not None and anchor.name not in self.anchors):
                return False
            if inner_check is not None and not inner_check(ctx):
                return False
            bound = list(ctx.matched_bindings.keys())
            reads = frozenset(x for value in ctx.matched_bindings.values() for x in _reads(value))
            reads -= frozenset(bound)
            self.matches.append(Match(pattern.name, anchor.name, frozenset(v.name for v in bound), reads))
            return True

        return FusionPattern(pattern.name, pattern.pattern, pattern.annotation_patterns, check, pattern.attrs_getter)


def prepare(mod: tvm.IRModule, backends: Sequence[Backend], entry: str) -> tvm.IRModule:
    """Every backend's ``prepare``, in order (what a partitioning would do first)."""
    for backend in backends:
        mod = backend.prepare(mod, entry)
    return mod


@dataclass
class RegionOps:
    """What :func:`partition_with_ops` found: the partitioned module and the ops of each region
    call (regions with equal content share one function, so a call site is what is identified)."""

    module: tvm.IRModule
    #: For the k-th region call of the entry function (binding order, as the graph lists region
    #: nodes): the match that made it, or None where no single recorded match explains it (its
    #: ops are then left to TVM kernels).
    matches: list[Match | None] = field(default_factory=list)
    #: Region symbol of each region call.
    symbols: list[str] = field(default_factory=list)


def partition_with_ops(
    prepared: tvm.IRModule, wrappers: Sequence[ChosenRegions], entry: str, weights: frozenset[str]
) -> RegionOps:
    """Partition ``prepared`` with every op on device 0 and say which ops each region call holds.

    Partitioning applies one pattern after the other and renames the variables it binds region
    calls to, so a region call is tied to an accepted match by what both keep: a region reading
    constants (weights) is the one match that read those very constants (by identity) and as many
    variables; a region reading none is, within its pattern, the k-th call for the k-th accepted
    match, used only when every call of that pattern agrees with its match that way and there are
    as many calls as matches (matching dropped or merged none). A region neither rule ties to one
    match is left unidentified."""

    def everything_on_device_0(func: relax.Function) -> dict[relax.Var, int]:
        return {b.var: 0 for block in func.body.blocks for b in block.bindings}

    module, regions = partition_for_backends(prepared, wrappers, entry, weights, everything_on_device_0,
                                             report_moves=False)
    recorded: dict[str, list[Match]] = {}
    for wrapper in wrappers:
        for match in wrapper.matches:
            recorded.setdefault(match.pattern, []).append(match)
    result = RegionOps(module)
    calls: dict[str, list[tuple[int, frozenset[Any]]]] = {}
    for block in module[entry].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)):
                continue
            if value.op.name_hint not in regions:
                continue
            pattern = _composite_pattern(module[value.op])
            calls.setdefault(pattern, []).append((len(result.matches), frozenset(x for a in value.args for x in _reads(a))))
            result.matches.append(None)
            result.symbols.append(value.op.name_hint)
    for pattern, sites in calls.items():
        matches = recorded.get(pattern, [])
        in_order = len(matches) == len(sites) and all(_same_reads(m.reads, r) for m, (_k, r) in zip(matches, sites))
        for position, (k, reads) in enumerate(sites):
            if _constants(reads):  # weights: the match that read these very constants
                fits = [m for m in matches if _same_reads(m.reads, reads)]
                result.matches[k] = fits[0] if len(fits) == 1 else None
            elif in_order:
                result.matches[k] = matches[position]
    return result


def _constants(reads: frozenset[Any]) -> frozenset[Any]:
    """What partitioning never renames: constants and the function's parameters (weights)."""
    return frozenset(
        v for v in reads
        if isinstance(v, tvm.ir.Constant) or (isinstance(v, relax.Var) and not isinstance(v, relax.DataflowVar))
    )


def _same_reads(a: frozenset[Any], b: frozenset[Any]) -> bool:
    """Equal constants (by identity) and as many variables (renamed by partitioning)."""
    return _constants(a) == _constants(b) and len(a) == len(b)


def _reads(expr: Any) -> list[Any]:
    """The variables and constants ``expr`` reads (objects, compared by identity)."""
    found: list[Any] = list(relax.analysis.free_vars(expr))
    if isinstance(expr, tvm.ir.Constant):
        found.append(expr)
    elif isinstance(expr, relax.Call):
        found.extend(a for a in expr.args if isinstance(a, tvm.ir.Constant))
    elif isinstance(expr, relax.Tuple):
        found.extend(a for a in expr.fields if isinstance(a, tvm.ir.Constant))
    return found


def _composite_pattern(func: relax.Function) -> str:
    """The pattern name of the composite inside a region function."""
    for block in func.body.blocks:
        for binding in block.bindings:
            inner = binding.value if isinstance(binding.value, relax.Function) else getattr(binding.value, "op", None)
            if isinstance(inner, relax.Function) and inner.attrs is not None and COMPOSITE_ATTR in inner.attrs:
                return str(inner.attrs[COMPOSITE_ATTR])
    raise ValueError(f"region function has no composite inside:\n{func}")
