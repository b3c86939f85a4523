"""The kernel DAG that automatic placement decides on, and the way back from kernels to ops.

Placement is asked per Relax op, but fusion makes kernels, and costs are measured per kernel. This
module lowers nothing itself: it takes the graph of one lowering (every op on one device, so fusion
is the finest it will be on any device) and

- numbers its kernel nodes in graph order (a topological order) with their predecessors and output
  sizes: the shape of :class:`~tvm_hetero.compiler.schedule_model.CostModel`;
- finds the kernel of every op, from the lowering's own record (``track_ops=True``: each op's
  kernels carry its index through legalization and fusion). Ops computed at build time (constant
  folding) belong to no kernel;
- says which devices may run each kernel: every op of it allowed there by the capability table.

Fusion never crosses devices, so giving every op of a kernel that kernel's device yields a lowering
whose kernels are these kernels, each on its chosen device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax

from ..lower import LoweredGraph
from ..placement import Capabilities, OpInfo


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
    #: ``op_follows[i]``: for an op with no kernel, the kernel of an op reading it (or None).
    op_follows: list[int | None]
    #: ``allowed[k][d]``: device ``d`` may run kernel ``k``.
    allowed: list[list[bool]]

    @property
    def num_kernels(self) -> int:
        return len(self.node_ids)


def kernel_graph(
    lowered: LoweredGraph,
    ops: Sequence[OpInfo],
    num_devices: int,
    capabilities: Capabilities | None = None,
) -> KernelGraph:
    """The kernel DAG of ``lowered`` (lowered with ``track_ops=True``; see the module docstring).
    ``ops`` are the OpInfos the lowering asked about, in order."""
    graph = lowered.graph
    node_ids = [nid for nid, node in enumerate(graph.nodes) if not node.is_input]
    kernel_of_node = {nid: k for k, nid in enumerate(node_ids)}
    preds, out_bytes = [], []
    for nid in node_ids:
        node = graph.nodes[nid]
        preds.append(sorted({kernel_of_node[e.node] for e in node.inputs if e.node in kernel_of_node}))
        out_bytes.append(sum(node.output_bytes(i) for i in range(node.num_outputs)))
    op_kernel: list[int | None] = [None] * len(ops)
    for k, nid in enumerate(node_ids):
        for index in lowered.node_op_indices.get(graph.nodes[nid].name, []):
            if op_kernel[index] is not None:
                raise ValueError(f"op {ops[index]} is in kernels #{op_kernel[index]} and #{k} (internal error)")
            op_kernel[index] = k
    op_follows: list[int | None] = [None] * len(ops)
    index_of_name = {info.name: i for i, info in enumerate(ops)}
    for info, kernel in reversed(list(zip(ops, op_kernel))):
        home = kernel if kernel is not None else op_follows[info.index]
        if home is None or info.call is None:
            continue
        for var in relax.analysis.free_vars(info.call):
            source = index_of_name.get(var.name)
            if source is not None and op_kernel[source] is None and op_follows[source] is None:
                op_follows[source] = home
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
        op_follows=op_follows,
        allowed=allowed,
    )


def op_allowed(capabilities: Capabilities, info: OpInfo, device: int) -> bool:
    """A device the table lists runs only the ops it supports; an unlisted device runs any op."""
    for listed, supports in capabilities.checks:
        if listed == device:
            return bool(supports(info))
    return True


def kernel_key(prim_func: tvm.tirx.PrimFunc) -> str:
    """The measurement key of a kernel: its structural hash, names left out (two fused kernels with
    the same computation share one measurement)."""
    if prim_func.attrs is not None and "global_symbol" in prim_func.attrs:
        prim_func = prim_func.without_attr("global_symbol")
    return f"{tvm_ffi.structural_hash(prim_func) & 0xFFFFFFFFFFFFFFFF:016x}"
