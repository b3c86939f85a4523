"""Give each reader its own copy of the cheap values it reads, so that one graph can hold them.

A region has one output, and a value read by two regions belongs to neither: it becomes a region
of its own (one more vendor graph execution per inference) or stays on the host. Two kinds of values
are cheap enough to compute once per reader instead:

- a **dequantize**: ONNX Runtime gives every reader its own DequantizeLinear before its execution
  providers partition the graph (its ``EnsureUniqueDQForNodeUnit`` rule), so that each QDQ unit is
  whole. A dequantize shared by a matmul and a residual add two graphs apart otherwise ends one
  graph with a float output, which an EP may refuse;
- a **small element-wise chain of the inputs**: a value made from function inputs and constants
  alone by element-wise and layout ops (``ELEMENTWISE``), each value at most ``SMALL_ELEMENTS``
  elements. BERT's extended attention mask is the case: sixteen elements, read by every layer's
  attention; recomputed inside each layer's graph, it costs a few element-wise ops and needs no
  graph of its own (a vendor graph call has a fixed cost, 0.16 ms on a phone's NPU).

Rule: a binding is *copyable* when it is one of those. The other bindings form *consumers*: each
island of float ops joined by values one makes and another reads (one QDQ unit's float ops, such
as a decomposed LRN reading its input twice) is one consumer, any other binding a consumer of its
own. Walking the bindings in order, each consumer's copyable ancestors (reached through copyable
bindings only) go to it: the first consumer to reach one keeps it, a later one gets fresh copies
of those already taken (with their copyable operands, so that the copy is self-contained). Only
one dataflow block's bindings are copied into it. The function's output keeps the originals.

Guarantee: the function computes the same values (the copies are pure ops on the same operands);
after it, every copyable binding has readers among one consumer's copyable ancestors and that
consumer only, so a partitioner can keep each chain with its reader.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..backends.qdq import DEQUANTIZE
from ..ir.constant_values import is_tensor_constant
from ..ir.relax_helpers import entry_pass, replace_body, same_kind_block, with_operands

#: A value of an input-derived chain is copied per reader when it has at most this many elements.
SMALL_ELEMENTS = 4096
#: Ops that compute each element from its operands' elements (or only move them).
ELEMENTWISE = frozenset({
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.negative", "relax.maximum",
    "relax.minimum", "relax.clip", "relax.astype", "relax.less", "relax.greater", "relax.equal",
    "relax.where", "relax.quantize", "relax.dequantize", "relax.expand_dims", "relax.reshape",
    "relax.squeeze", "relax.broadcast_to", "relax.permute_dims",
})


def CopyPerReader(entry: str = "main") -> tvm.transform.Pass:
    return entry_pass(entry, copy_per_reader, "CopyPerReader")


def copy_per_reader(func: relax.Function) -> relax.Function:
    """``func`` with its copyable bindings copied per consumer (module rule); ``func`` itself when
    nothing is shared."""
    params = set(func.params)
    changed = False
    blocks = []
    for block in func.body.blocks:
        new_block, block_changed = _copy_in_block(block, params)
        blocks.append(new_block)
        changed = changed or block_changed
    return replace_body(func, blocks) if changed else func


def _copy_in_block(block: relax.BindingBlock, params: set) -> tuple[relax.BindingBlock, bool]:
    value_of = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
    copyable: set[relax.Var] = set()
    small_chain: set[relax.Var] = set()
    for var, value in value_of.items():
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            continue
        if value.op.name in ELEMENTWISE and _elements(var) is not None and _elements(var) <= SMALL_ELEMENTS and all(
                a in params or a in small_chain or is_tensor_constant(a) for a in _tensor_operands(value)):
            small_chain.add(var)
        if var in small_chain or value.op.name == DEQUANTIZE:
            copyable.add(var)
    if not copyable:
        return block, False
    island_of = _islands(value_of, copyable)
    state = _Copies(value_of, copyable)
    out: list[relax.Binding] = []
    for binding in block.bindings:
        value = binding.value
        if binding.var in copyable or not isinstance(value, relax.Call):
            out.append(binding)  # an original stays in place; a consumer takes it or copies it
            continue
        island = island_of.get(binding.var, binding.var)
        mapping = {a: state.own(a, island) for a in relax.analysis.free_vars(value) if a in copyable}
        out += state.take_emitted()
        if any(not new.same_as(old) for old, new in mapping.items()):
            out.append(relax.VarBinding(binding.var, with_operands(value, mapping)))
        else:
            out.append(binding)
    changed = state.copied
    return same_kind_block(block, out), changed


class _Copies:
    """Which consumer took each copyable binding, and each consumer's copies."""

    def __init__(self, value_of: dict, copyable: set) -> None:
        self.value_of, self.copyable = value_of, copyable
        self.taken: set[relax.Var] = set()
        self.copies_of: dict[relax.Var, dict[relax.Var, relax.Var]] = {}  # consumer island -> its copies
        self.emitted: list[relax.Binding] = []
        self.copied = False
        self.names = {v.name for v in value_of}
        self.count = 0

    def own(self, var: relax.Var, island: relax.Var) -> relax.Var:
        """``var`` for the consumer ``island``: the original if no consumer took it yet, else a copy."""
        if var not in self.copyable:
            return var
        copies = self.copies_of.setdefault(island, {})
        if var in copies:
            return copies[var]
        value = self.value_of[var]
        operands = {a: self.own(a, island) for a in relax.analysis.free_vars(value) if a in self.copyable}
        if var not in self.taken and all(new.same_as(old) for old, new in operands.items()):
            self.taken.add(var)
            copies[var] = var
            return var
        fresh = self._fresh_var(var)
        self.emitted.append(relax.VarBinding(fresh, with_operands(value, operands)))
        self.copied = True
        copies[var] = fresh
        return fresh

    def _fresh_var(self, var: relax.Var) -> relax.Var:
        """A new variable of ``var``'s kind and type, named apart from every other (exporters and
        reports name values by their variables)."""
        self.count += 1
        kind = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
        name = f"{var.name}_copy{self.count}"
        while name in self.names:
            self.count += 1
            name = f"{var.name}_copy{self.count}"
        self.names.add(name)
        return kind(name, var.ty)

    def take_emitted(self) -> list[relax.Binding]:
        """The copies made since the last call, in the order they must be bound."""
        emitted, self.emitted = self.emitted, []
        return emitted


def _islands(value_of: dict, copyable: set) -> dict[relax.Var, relax.Var]:
    """Consumer -> its island's root: float ops joined by a value one makes and another reads (a
    decomposed LRN or GELU reading one dequantize twice is one consumer, as it is one QDQ unit)."""
    parent: dict[relax.Var, relax.Var] = {}

    def root(v: relax.Var) -> relax.Var:
        while not parent[v].same_as(v):
            v = parent[v]
        return v

    for var, value in value_of.items():
        if var in copyable or not _is_float_op(value):
            continue
        parent.setdefault(var, var)
        for used in relax.analysis.free_vars(value):
            if used in parent:
                a, b = root(var), root(used)
                if not a.same_as(b):
                    parent[a] = b
    return {v: root(v) for v in parent}


def _is_float_op(value: Any) -> bool:
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name not in ("relax.quantize", DEQUANTIZE)) or isinstance(value, relax.TupleGetItem)


def _tensor_operands(call: relax.Call) -> list[Any]:
    out = []
    for arg in call.args:
        for item in (arg.fields if isinstance(arg, relax.Tuple) else [arg]):
            if isinstance(item, relax.Var) or is_tensor_constant(item):
                out.append(item)  # prim values, shapes, strings and data types are part of the op
    return out


def _elements(var: relax.Var) -> int | None:
    ty = var.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    if not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
        return None
    return int(np.prod([int(d) for d in ty.shape.values], dtype=np.int64))



