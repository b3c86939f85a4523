"""Stage graphs: one graph per pipeline stage, and the wiring (docs/pipeline.md) that joins them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ...graph import Entry, Graph, Node
from .kernel_order import Kernel


def _entry_name(graph: Graph, e: Entry) -> str:
    return graph.nodes[e.node].name + (f".{e.index}" if e.index else "")


def stage_graphs(
    graph: Graph,
    kernels: list[Kernel],
    ranges: list[tuple[int, int]],
    input_names: Sequence[str],
    param_names: set[str],
) -> tuple[list[Graph], dict]:
    """One graph per stage (all on device 0) and the wiring (docs/pipeline.md) that joins them.

    A stage graph holds the stage's kernels in their original order, one input node per
    pipeline input or parameter they read, and one per tensor they read from an earlier stage
    (named after its producer, ``name.i`` for output ``i > 0``). Its outputs are what later
    stages read and the pipeline outputs it produces.
    """
    stage_of = {k.node_id: s for s, (a, b) in enumerate(ranges) for k in kernels[a:b]}
    num_stages = len(ranges)
    last = num_stages - 1
    # Stage outputs: entries read by a later stage, then graph heads, in entry order per stage.
    exported: list[list[Entry]] = [[] for _ in ranges]
    for nid, s in sorted(stage_of.items()):
        for e in graph.nodes[nid].inputs:
            if e.node in stage_of and stage_of[e.node] < s and e not in exported[stage_of[e.node]]:
                exported[stage_of[e.node]].append(e)
    for e in graph.heads:
        s = stage_of.get(e.node, last)
        if e not in exported[s]:
            exported[s].append(e)
    for outs in exported:
        outs.sort()
    used_inputs = {e.node for nid in stage_of for e in graph.nodes[nid].inputs}
    graphs, wired = [], []
    for s, (a, b) in enumerate(ranges):
        members = {k.node_id for k in kernels[a:b]}
        reads = [e for nid in sorted(members) for e in graph.nodes[nid].inputs]
        nulls = {e.node for e in [*reads, *exported[s]] if graph.nodes[e.node].is_input}
        if s == 0:  # pipeline inputs that no kernel reads still need a stage
            nulls |= {i for i, n in enumerate(graph.nodes) if n.name in input_names and i not in used_inputs}
        nodes: list[Node] = []
        where: dict[Entry, Entry] = {}  # original entry -> entry in the stage graph
        inputs: dict[str, Any] = {}
        params: list[str] = []
        for e in sorted({e for e in reads if e.node in stage_of and e.node not in members}):
            producer, p = graph.nodes[e.node], stage_of[e.node]
            nodes.append(
                Node(
                    _entry_name(graph, e),
                    op="null",
                    shapes=[producer.shapes[e.index]],
                    dtypes=[producer.dtypes[e.index]],
                )
            )
            where[e] = Entry(len(nodes) - 1, 0)
            inputs[nodes[-1].name] = {"stage": p, "output": exported[p].index(e)}
        for nid, node in enumerate(graph.nodes):
            if nid not in nulls and nid not in members:
                continue
            nodes.append(dataclasses.replace(node, device=0, inputs=[where[e] for e in node.inputs]))
            where.update({Entry(nid, j): Entry(len(nodes) - 1, j) for j in range(node.num_outputs)})
            if node.is_input and node.name in param_names:
                params.append(node.name)
            elif node.is_input:
                inputs[node.name] = node.name
        stage_graph = Graph(nodes, [where[e] for e in exported[s]])
        stage_graph.validate()
        graphs.append(stage_graph)
        wired.append({"name": f"stage{s}", "inputs": inputs, "params": params})
    outputs = []
    for e in graph.heads:
        s = stage_of.get(e.node, last)
        outputs.append({"stage": s, "output": exported[s].index(e)})
    return graphs, {"inputs": list(input_names), "stages": wired, "outputs": outputs}

