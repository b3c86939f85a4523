"""Constant folding on the lowered graph: kernels that read only constants run once, at build time.

Which values are constant: the tensor constants bound in the IR (a frontend's weights with
``keep_params_in_input=False``) and, transitively, the outputs of folded kernels. Values given for
function parameters (``params=`` or the function's ``"params"`` attribute) are NOT constant: the
runtime's ``set_params`` may replace them, and a result computed from the old value at build time
would then be silently stale.

Rule, per kernel node in graph order: it is folded when
- it is a TVM kernel (not a copy, nor an external backend's region) with exactly one output,
- every input is constant, and
- its output is no larger than its inputs together (so folding never grows the parameters by more
  than the bytes it reads: a broadcast or a tile that makes a large tensor from a small one keeps
  running per inference instead).
A folded node becomes a parameter (a ``null`` node with its computed value, saved in params.bin)
of the same name, after the other null nodes (lowering puts them ahead of the kernels); its consumers and their devices do not change, so the
placement is kept (copy insertion later puts the new parameter with its consumers). Constants no
longer read by any node are dropped from the graph and from the parameters.

The folded kernels are compiled once for the host (``llvm``) and run on numpy values; legalized
TIR is target-independent, so the result is what the kernel computes on its device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm

from ..graph import Entry, Graph, Node


@dataclass
class FoldResult:
    graph: Graph
    params: dict[str, np.ndarray]
    #: Names of the nodes that became parameters, in graph order.
    folded: list[str]


def _foldable(graph: Graph, kernel_names: set[str], constant: set[int]) -> list[int]:
    """Ids of the nodes to fold (module rule), in graph order; ``constant`` grows with them."""
    chosen = []
    for nid, node in enumerate(graph.nodes):
        if node.is_input or node.func_name not in kernel_names or node.num_outputs != 1 or not node.inputs:
            continue
        if not all(e.node in constant for e in node.inputs):
            continue
        read = sum(graph.nodes[e.node].output_bytes(e.index) for e in node.inputs)
        if node.output_bytes(0) <= read:
            chosen.append(nid)
            constant.add(nid)
    return chosen


def fold_constants(
    graph: Graph, kernels: tvm.IRModule, params: dict[str, np.ndarray], constant_names: set[str]
) -> FoldResult:
    """Fold the constant kernels of ``graph`` (module docstring); ``constant_names`` names the null
    nodes holding IR-bound constants. The inputs are not modified."""
    kernel_names = {gv.name_hint for gv in kernels.functions}
    constant = {nid for nid, n in enumerate(graph.nodes) if n.is_input and n.name in constant_names}
    chosen = _foldable(graph, kernel_names, constant)
    if not chosen:
        return FoldResult(graph, dict(params), [])

    needed = {graph.nodes[nid].func_name for nid in chosen}
    host = tvm.compile(
        tvm.IRModule({gv: f for gv, f in kernels.functions.items() if gv.name_hint in needed}), "llvm"
    ).mod
    values: dict[int, np.ndarray] = {
        nid: params[n.name] for nid, n in enumerate(graph.nodes) if nid in constant and n.is_input
    }
    cpu = tvm.cpu(0)
    for nid in chosen:
        node = graph.nodes[nid]
        # np.asarray(order="C"), not np.ascontiguousarray: the latter makes a 0-d value 1-d, and a
        # kernel reading a scalar constant (an index, a shape element) rejects that rank.
        args = [tvm.runtime.tensor(np.asarray(values[e.node], order="C"), cpu) for e in node.inputs]
        out = tvm.runtime.empty(node.shapes[0], node.dtypes[0], cpu)
        host[node.func_name](*args, out)
        values[nid] = out.numpy()

    folded = set(chosen)
    nodes = [
        Node(n.name, op="null", shapes=list(n.shapes), dtypes=list(n.dtypes), device=n.device)
        if nid in folded
        else n
        for nid, n in enumerate(graph.nodes)
    ]
    # Drop the constants nobody reads any more (folded ones included), renumbering the entries.
    # Null nodes (the folded ones with them) stay ahead of every kernel, as lowering emits them.
    read = {e.node for n in nodes for e in n.inputs} | {e.node for e in graph.heads}
    keep = [nid for nid, n in enumerate(nodes) if not (nid in constant and nid not in read)]
    keep.sort(key=lambda nid: not nodes[nid].is_input)  # stable: kernels keep their order
    new_id = {old: new for new, old in enumerate(keep)}

    def remap(e: Entry) -> Entry:
        return Entry(new_id[e.node], e.index)

    out_nodes = []
    for old in keep:
        n = nodes[old]
        if n.inputs:
            n = Node(
                n.name,
                op=n.op,
                inputs=[remap(e) for e in n.inputs],
                func_name=n.func_name,
                device=n.device,
                shapes=list(n.shapes),
                dtypes=list(n.dtypes),
                relax_ops=list(n.relax_ops),
            )
        out_nodes.append(n)
    out_graph = Graph(out_nodes, [remap(e) for e in graph.heads])
    out_graph.validate()

    kept_names = {nodes[nid].name for nid in keep}
    out_params = {name: value for name, value in params.items() if name in kept_names}
    for nid in chosen:
        if nid in new_id:
            out_params[graph.nodes[nid].name] = values[nid]
    return FoldResult(out_graph, out_params, [graph.nodes[nid].name for nid in chosen])
