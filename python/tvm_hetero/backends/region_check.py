"""The check run after every partitioning: the entry function and its regions are consistent.

Pattern checks are meant to make every region a single-output function whose intermediate values
are used only inside it; this check does not trust them. It walks the partitioned entry function
once and raises :class:`PartitionError`, naming the region, if

- a binding reads a variable that is not defined before it (a region placed after a user of its
  result, or a value that moved into a region while still read outside);
- a region call's argument count differs from the region function's parameters or from the
  inputs its backend's description expects;
- a region returns anything but one tensor (an intermediate value that leaked out as a second
  output);
- a region has no anchor op (e.g. an add alone), so its backend would have nothing to run.

Cost: linear in the size of the entry function, so it is always on.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from .base import Region


class PartitionError(ValueError):
    """Partitioning produced a region or an entry function that cannot be run as written."""


def check_partitioned(mod: tvm.IRModule, entry: str, regions: dict[str, Region]) -> None:
    """Raise :class:`PartitionError` if ``entry`` or one of ``regions`` breaks the rules above."""
    func = mod[entry]
    defined: set[relax.Var] = set(func.params)
    for block in func.body.blocks:
        for binding in block.bindings:
            region = _region_called(binding.value, regions)
            _check_defined(binding.value, defined, f"'{binding.var.name}'", region)
            if region is not None:
                _check_region(mod, binding.value, region)
            defined.add(binding.var)
    _check_defined(func.body.body, defined, "the function's output", None)


def _region_called(value: Any, regions: dict[str, Region]) -> Region | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
        return regions.get(value.op.name_hint)
    return None


def _check_defined(expr: Any, defined: set[relax.Var], user: str, region: Region | None) -> None:
    for var in relax.analysis.free_vars(expr):
        if var not in defined:
            where = f"{region.backend} region '{region.name}' (bound to {user})" if region else user
            raise PartitionError(
                f"after partitioning, {where} reads '{var.name}' before it is defined: a region "
                "was placed after a user of its result or swallowed a value read outside it"
            )


def _check_region(mod: tvm.IRModule, call: relax.Call, region: Region) -> None:
    func = mod[call.op]
    label = f"{region.backend} region '{region.name}' ({region.pattern})"
    expected = region.spec.get("num_inputs", len(func.params))
    if not len(call.args) == len(func.params) == expected:
        raise PartitionError(
            f"{label} is called with {len(call.args)} arguments, its function takes "
            f"{len(func.params)} and its description expects {expected}"
        )
    ret = func.ret_ty
    if not isinstance(ret, relax.TensorType):
        what = f"{len(ret.fields)} values" if isinstance(ret, relax.TupleType) else str(ret)
        raise PartitionError(
            f"{label} returns {what}, not one tensor: a value computed inside it is also used outside"
        )
    if "op" not in region.spec:
        raise PartitionError(f"{label} holds no anchor op (ops: {', '.join(region.ops) or 'none'})")
