"""The kernel DAG that automatic placement decides on, and the way back from kernels to ops.

Placement is asked per Relax op, but fusion makes kernels, and costs are measured per kernel. This
module lowers nothing itself: it takes the graph of one lowering (every op on one device, so fusion
is the finest it will be on any device) and

- numbers its kernel nodes in graph order (a topological order) with their predecessors and output
  sizes: the shape of :class:`~tvm_hetero.compiler.schedule_model.CostModel`;
- finds the kernel of every op: the node named after the op's binding is the kernel whose output
  the op makes; an op fused into a kernel (not its output) belongs to the kernel of its consumers,
  found by walking the entry function's bindings backwards. Ops computed at build time (constant
  folding) belong to no kernel;
- says which devices may run each kernel: every op of it allowed there by the capability table.

Fusion never crosses devices, so giving every op of a kernel that kernel's device yields a lowering
whose kernels are these kernels, each on its chosen device.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax

from ..lower import LoweredGraph
from ..placement import Capabilities, OpInfo

_UNIQUE_SUFFIX = re.compile(r"_\d+$")


@dataclass
class KernelGraph:
    """Kernel nodes of one lowering, in graph order, with what placement needs to know of them."""

    #: Graph node id of each kernel.
    node_ids: list[int]
    #: Kernel (PrimFunc / region) name each kernel node calls.
    func_names: list[str]
    #: Relax ops fused into each kernel (names, for reports).
    relax_ops: list[list[str]]
    #: ``preds[k]``: kernels whose outputs kernel ``k`` reads (each ``< k``).
    preds: list[list[int]]
    #: Bytes of each kernel's outputs.
    out_bytes: list[int]
    #: ``op_kernel[i]``: kernel of op ``i`` (``OpInfo.index``), or None for ops folded at build time.
    op_kernel: list[int | None]
    #: ``allowed[k][d]``: device ``d`` may run kernel ``k``.
    allowed: list[list[bool]]

    @property
    def num_kernels(self) -> int:
        return len(self.node_ids)


def kernel_graph(
    lowered: LoweredGraph,
    ops: Sequence[OpInfo],
    entry_function: relax.Function,
    num_devices: int,
    capabilities: Capabilities | None = None,
) -> KernelGraph:
    """The kernel DAG of ``lowered`` (see the module docstring). ``ops`` are the OpInfos the
    lowering asked about, in order; ``entry_function`` the Relax function it lowered."""
    graph = lowered.graph
    node_ids = [nid for nid, node in enumerate(graph.nodes) if not node.is_input]
    kernel_of_node = {nid: k for k, nid in enumerate(node_ids)}
    preds, out_bytes = [], []
    for nid in node_ids:
        node = graph.nodes[nid]
        preds.append(sorted({kernel_of_node[e.node] for e in node.inputs if e.node in kernel_of_node}))
        out_bytes.append(sum(node.output_bytes(i) for i in range(node.num_outputs)))
    op_kernel = _op_kernels(entry_function, ops, {graph.nodes[nid].name: k for k, nid in enumerate(node_ids)})
    allowed = [[True] * num_devices for _ in node_ids]
    if capabilities is not None:
        for info, kernel in zip(ops, op_kernel):
            if kernel is None:
                continue
            for device in range(num_devices):
                allowed[kernel][device] &= op_allowed(capabilities, info, device)
        for row in allowed:
            if not any(row):  # no device supports every op of it: the table's fallback runs it
                row[capabilities.fallback] = True
    return KernelGraph(
        node_ids=node_ids,
        func_names=[graph.nodes[nid].func_name for nid in node_ids],
        relax_ops=[list(graph.nodes[nid].relax_ops) for nid in node_ids],
        preds=preds,
        out_bytes=out_bytes,
        op_kernel=op_kernel,
        allowed=allowed,
    )


def op_allowed(capabilities: Capabilities, info: OpInfo, device: int) -> bool:
    """A device the table lists runs only the ops it supports; an unlisted device runs any op."""
    for listed, supports in capabilities.checks:
        if listed == device:
            return bool(supports(info))
    return True


def _op_kernels(func: relax.Function, ops: Sequence[OpInfo], kernel_by_node_name: dict[str, int]) -> list[int | None]:
    """Kernel of every op: its own node, else (fused inside) the kernel of its first consumer."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    consumers: dict[str, list[str]] = {}
    for binding in bindings:
        for var in relax.analysis.free_vars(binding.value):
            consumers.setdefault(var.name, []).append(binding.var.name)
    kernel_of_var: dict[str, int] = {}
    for binding in reversed(bindings):
        name = binding.var.name
        kernel = _node_kernel(name, kernel_by_node_name)
        if kernel is None:
            kernel = next((kernel_of_var[c] for c in consumers.get(name, []) if c in kernel_of_var), None)
        if kernel is not None:
            kernel_of_var[name] = kernel
    return [kernel_of_var.get(info.name) for info in ops]


def _node_kernel(var_name: str, kernel_by_node_name: dict[str, int]) -> int | None:
    """The kernel whose node is named for ``var_name`` (the graph may have made it unique: ``_1``)."""
    if var_name in kernel_by_node_name:
        return kernel_by_node_name[var_name]
    matches = [k for name, k in kernel_by_node_name.items() if _UNIQUE_SUFFIX.sub("", name) == var_name]
    return matches[0] if len(matches) == 1 else None


def kernel_key(prim_func: tvm.tirx.PrimFunc) -> str:
    """The measurement key of a kernel: its structural hash, names left out (two fused kernels with
    the same computation share one measurement)."""
    if prim_func.attrs is not None and "global_symbol" in prim_func.attrs:
        prim_func = prim_func.without_attr("global_symbol")
    return f"{tvm_ffi.structural_hash(prim_func) & 0xFFFFFFFFFFFFFFFF:016x}"
