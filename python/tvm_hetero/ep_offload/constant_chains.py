"""Fold the constant chains a frontend leaves in front of an accelerator's graph.

TVM's ONNX frontend computes some values from constants alone at run time: a Gather's index
normalisation reads ``shape_of`` of a static-shaped table (``where(less(i, 0), i + shape[0], i)``), a
quantizer's scalar arrives as ``quantize(constant)``, a position-embedding lookup takes constant rows
of a constant table. ONNX Runtime folds these before its execution providers see the graph; left as
ops here they are host work in the middle of an accelerator's graph (a graph input the device must
wait for, or a node its EP will not claim) and they split one vendor graph in two.

The rule is the build's own constant folding (``ir/fold_constant_ops.py``: computable
bindings, the frontier, dequantized weights and float values made from them kept as they are, ops
the host cannot evaluate left to run), with a small limit: a folded value may be at most the bytes
of the constants it reads, or ``SMALL_BYTES`` (a row broadcast from a small table folds, a large
tensor made from a scalar does not), so that preparing a graph for the accelerator never grows the
model by more than that per value.

Guarantee: the function computes the same values; nothing that depends on an input or a parameter
is folded, and neither is a weight's dequantize nor a float value made from one.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..ir.fold_constant_ops import fold_constant_ops
from ..ir.relax_helpers import entry_pass

#: A folded value may be this large whatever it reads (a position embedding's rows, an index table).
SMALL_BYTES = 64 * 1024


def FoldConstantChains(entry: str = "main") -> tvm.transform.Pass:
    return entry_pass(entry, fold_constant_chains, "FoldConstantChains")


def fold_constant_chains(func: relax.Function) -> relax.Function:
    """``func`` with its foldable constant chains replaced by constants (module rule); ``func``
    itself when there are none."""
    return fold_constant_ops(func, limit_bytes=SMALL_BYTES)
