"""Write each ``split`` read only through its items as one slice per item.

A region has one output, a tensor, so a ``split`` (a tuple of tensors) can be no region's last op
and no ONNX step of ours: a fused projection split into q, k and v, or gate and up, would keep the
split and everything around it on the host. ONNX Runtime's EPs see such a split as one ``Split``
node with several outputs; here each item becomes ``strided_slice`` of the split's input (ONNX
``Slice``), a single-output op that a region can hold.

Rule: a ``split`` binding whose every reader is a ``TupleGetItem`` binding of it, its input of static
shape; each item binding becomes ``strided_slice(input, [axis], [begin], [end])`` of that item's
bounds, and the split itself is then dead.

Guarantee: every item keeps its value (the same elements of the same input); a split read whole
(returned, or passed as a tuple) is left as it is.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import tvm
from tvm import relax

from ..ir.relax_helpers import entry_pass, map_bindings, static_shape


def SplitAsSlices(entry: str = "main") -> tvm.transform.Pass:
    return entry_pass(entry, split_as_slices, "SplitAsSlices")


def split_as_slices(func: relax.Function) -> relax.Function:
    """``func`` with its item-read splits written as slices (module rule); ``func`` itself when
    there are none."""
    splits = _item_read_splits(func)
    if not splits:
        return func

    def as_slice(binding: Any) -> Any:
        value = binding.value
        if not (isinstance(value, relax.TupleGetItem) and value.tuple_value in splits):
            return binding
        data, axis, bounds = splits[value.tuple_value]
        begin, end = bounds[int(value.index)]
        return relax.VarBinding(binding.var, relax.op.strided_slice(data, axes=[axis], begin=[begin], end=[end]))

    return map_bindings(func, as_slice)


def _item_read_splits(func: relax.Function) -> dict[relax.Var, tuple[Any, int, list[tuple[int, int]]]]:
    """Per split variable read only through items: its input, axis and each item's bounds."""
    found: dict[relax.Var, tuple[Any, int, list[tuple[int, int]]]] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.split"):
                continue
            ty = value.args[0].ty
            shape = static_shape(ty) if isinstance(ty, relax.TensorType) else None
            if shape is None:
                continue
            axis = int(value.attrs.axis) % len(shape)
            length = shape[axis]
            sections = value.attrs.indices_or_sections
            if isinstance(sections, (int, tvm.tirx.IntImm)):
                step = length // int(sections)
                cuts = [step * i for i in range(1, int(sections))]
            else:
                cuts = [int(c) for c in sections]
            edges = [0, *cuts, length]
            found[binding.var] = (value.args[0], axis, list(pairwise(edges)))
    if not found:
        return found
    # a split read in any other way than through an item stays as it is
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in found:
                continue
            for var in relax.analysis.free_vars(value):
                found.pop(var, None)
    for var in relax.analysis.free_vars(func.body.body):
        found.pop(var, None)
    return found
