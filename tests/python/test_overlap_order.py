"""Tests of compiler/overlap_order.py: same switches as the switch-minimal order, never a worse
predicted latency, and critical-path work first where it pays."""

from __future__ import annotations

import random

from test_reorder import random_dag
from tvm_hetero.compiler.overlap_order import KernelDag, predicted_latency, reorder_for_overlap
from tvm_hetero.compiler.reorder import reorder_for_devices
from tvm_hetero.graph import Entry, Graph, Node


def _kernel_costs(graph: Graph, rng: random.Random) -> list[float]:
    return [rng.uniform(0.1, 5.0) for node in graph.nodes if not node.is_input]


def _latency(graph: Graph, cost_by_name: dict[str, float]) -> float:
    dag = KernelDag.of(graph)
    cost = [cost_by_name[graph.nodes[nid].name] for nid in dag.kernels]
    return predicted_latency(dag, list(range(dag.size)), cost)


def test_feeding_another_device_first_overlaps_the_two_devices():
    # Device 0 has a long local kernel L and a short kernel S that feeds device 1's long chain.
    # Switch-minimal order runs L first (graph order); critical path first runs S first.
    x = Node("x", op="null", shapes=[(4,)], dtypes=["float32"])
    nodes = [
        x,
        Node("L", inputs=[Entry(0)], func_name="l", device=0, shapes=[(4,)], dtypes=["float32"]),
        Node("S", inputs=[Entry(0)], func_name="s", device=0, shapes=[(4,)], dtypes=["float32"]),
        Node("C1", inputs=[Entry(2)], func_name="c1", device=1, shapes=[(4,)], dtypes=["float32"]),
        Node("C2", inputs=[Entry(3)], func_name="c2", device=1, shapes=[(4,)], dtypes=["float32"]),
        Node("J", inputs=[Entry(1), Entry(4)], func_name="j", device=0, shapes=[(4,)], dtypes=["float32"]),
    ]
    graph = Graph(nodes, [Entry(5)])
    cost = {"L": 10.0, "S": 1.0, "C1": 5.0, "C2": 5.0, "J": 1.0}
    ordered = reorder_for_overlap(graph, [cost[n.name] for n in graph.nodes if not n.is_input])
    names = [n.name for n in ordered.nodes if not n.is_input]
    assert names.index("S") < names.index("L")
    assert _latency(ordered, cost) == 12.0  # S, then L overlaps C1 + C2, then J
    assert _latency(reorder_for_devices(graph), cost) == 22.0
    assert ordered.device_switches() == reorder_for_devices(graph).device_switches()


def test_random_graphs_keep_switches_and_never_predict_slower():
    rng = random.Random(11)
    improved = 0
    for seed in range(150):
        graph = random_dag(seed, rng.randint(2, 40), rng.choice((2, 3)))
        cost = _kernel_costs(graph, rng)
        cost_by_name = dict(zip((n.name for n in graph.nodes if not n.is_input), cost))
        base = reorder_for_devices(graph)
        ordered = reorder_for_overlap(graph, cost)
        ordered.validate()
        assert ordered.device_switches() <= base.device_switches()
        assert _latency(ordered, cost_by_name) <= _latency(base, cost_by_name) + 1e-9
        improved += _latency(ordered, cost_by_name) < _latency(base, cost_by_name) - 1e-9
    assert improved > 0  # the heuristic does something on random graphs
