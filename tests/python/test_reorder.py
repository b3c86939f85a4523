"""Tests of compiler/reorder.py: device-switch minimisation checked against brute force.

Also home of ``random_dag``, the random-graph helper shared by test_copies.py and test_memory.py.
"""

from __future__ import annotations

import random

from tvm_hetero.compiler.reorder import kahn_wave_order, reorder_for_devices
from tvm_hetero.graph import Entry, Graph, Node
from tvm_hetero.testing.oracles import optimal_switches

SIZES = (1, 4, 16, 64, 100, 256, 1000)


def random_dag(
    seed: int,
    num_kernels: int,
    num_devices: int,
    num_inputs: int = 2,
    max_inputs: int = 3,
    max_outputs: int = 1,
    extra_heads: int = 0,
) -> Graph:
    """A random valid graph: null inputs, then kernels reading 1..max_inputs earlier entries.

    Shapes are ``(n,)`` float32 with varied ``n``; kernels sit on random devices; heads are the
    first outputs nobody reads, plus ``extra_heads`` random kernel outputs; other unread outputs
    (of multi-output kernels) are left unused.
    """
    rng = random.Random(seed)
    nodes = [
        Node(f"in{i}", op="null", shapes=[(rng.choice(SIZES),)], dtypes=["float32"])
        for i in range(num_inputs)
    ]
    window = rng.choice((2, 4, 8, 1000))  # small windows give chains, large ones wide DAGs
    for k in range(num_kernels):
        low = max(0, len(nodes) - window)
        srcs = sorted({rng.randrange(low, len(nodes)) for _ in range(rng.randint(1, max_inputs))})
        num_out = rng.randint(1, max_outputs)
        nodes.append(
            Node(
                f"k{k}",
                inputs=[Entry(s, rng.randrange(nodes[s].num_outputs)) for s in srcs],
                func_name=f"f{k}",
                device=rng.randrange(num_devices),
                shapes=[(rng.choice(SIZES),) for _ in range(num_out)],
                dtypes=["float32"] * num_out,
            )
        )
    read = {e for node in nodes for e in node.inputs}
    outputs = [
        Entry(i, j) for i, node in enumerate(nodes) if not node.is_input for j in range(node.num_outputs)
    ]
    heads = [e for e in outputs if e not in read and e.index == 0]  # other unread outputs stay unused
    heads += [e for e in rng.sample(outputs, min(extra_heads, len(outputs))) if e not in heads]
    graph = Graph(nodes, heads)
    graph.validate()
    return graph


def edges_by_name(graph: Graph) -> set[tuple[str, int, str, int]]:
    """The graph's data edges as (producer, output, consumer, input slot), independent of order."""
    return {
        (graph.nodes[e.node].name, e.index, node.name, slot)
        for node in graph.nodes
        for slot, e in enumerate(node.inputs)
    }


def assert_same_graph(before: Graph, after: Graph) -> None:
    after.validate()
    assert sorted(n.name for n in before.nodes) == sorted(n.name for n in after.nodes)
    assert edges_by_name(before) == edges_by_name(after)
    assert [(before.nodes[e.node].name, e.index) for e in before.heads] == [
        (after.nodes[e.node].name, e.index) for e in after.heads
    ]


def chain_graph(devices: list[int]) -> Graph:
    nodes = [Node("x", op="null", shapes=[(4,)], dtypes=["float32"])]
    for k, dev in enumerate(devices):
        nodes.append(
            Node(f"k{k}", inputs=[Entry(k)], func_name="f", device=dev, shapes=[(4,)], dtypes=["float32"])
        )
    return Graph(nodes, [Entry(len(devices))])


def parallel_graph(devices: list[int]) -> Graph:
    """Independent kernels, each reading the one input."""
    nodes = [Node("x", op="null", shapes=[(4,)], dtypes=["float32"])]
    for k, dev in enumerate(devices):
        nodes.append(
            Node(f"k{k}", inputs=[Entry(0)], func_name="f", device=dev, shapes=[(4,)], dtypes=["float32"])
        )
    return Graph(nodes, [Entry(k + 1) for k in range(len(devices))])


def test_two_devices_greedy_drain_is_optimal_on_random_dags() -> None:
    for seed in range(240):
        graph = random_dag(seed, 1 + seed % 12, 2, num_inputs=1 + seed % 3)
        best = optimal_switches(graph)
        for beam_width in (1, 8):  # width 1: plain greedy drain tried from both devices
            result = reorder_for_devices(graph, exact_limit=0, beam_width=beam_width)
            assert_same_graph(graph, result)
            assert result.device_switches() == best, (seed, beam_width)


def test_three_devices_exact_search_is_optimal_up_to_exact_limit() -> None:
    for seed in range(120):
        graph = random_dag(1000 + seed, 1 + seed % 10, 3)
        # beam_width=1 weakens the heuristic, so optimality here comes from the exact search
        result = reorder_for_devices(graph, exact_limit=10, beam_width=1)
        assert_same_graph(graph, result)
        assert result.device_switches() == optimal_switches(graph), seed


def test_three_devices_heuristic_never_worse_than_original_or_kahn() -> None:
    optimal = {1: 0, 8: 0}
    total = 0
    for seed in range(150):
        graph = random_dag(2000 + seed, 11 + seed % 3, 3)
        best = optimal_switches(graph)
        kahn = graph.permuted(kahn_wave_order(graph)).device_switches()
        total += 1
        for beam_width in optimal:
            switches = reorder_for_devices(graph, exact_limit=5, beam_width=beam_width).device_switches()
            assert best <= switches <= min(graph.device_switches(), kahn), seed
            optimal[beam_width] += switches == best
    for beam_width, hits in optimal.items():
        print(f"3 devices, 11-13 kernels, heuristic only (beam {beam_width}): optimal {hits}/{total}")
    assert optimal[8] >= 0.9 * total


def test_many_devices_large_graphs_never_worse_than_original_or_kahn() -> None:
    for seed in range(20):
        graph = random_dag(3000 + seed, 40 + seed, 3 + seed % 3)
        result = reorder_for_devices(graph)
        assert_same_graph(graph, result)
        kahn = graph.permuted(kahn_wave_order(graph)).device_switches()
        assert result.device_switches() <= min(graph.device_switches(), kahn)


def test_drain_beats_kahn_waves() -> None:
    # a(0) -> b(0), c(1) independent: Kahn runs a, c, b (2 switches); draining runs a, b, c (1).
    nodes = [
        Node("x", op="null", shapes=[(4,)], dtypes=["float32"]),
        Node("a", inputs=[Entry(0)], func_name="f", device=0, shapes=[(4,)], dtypes=["float32"]),
        Node("c", inputs=[Entry(0)], func_name="f", device=1, shapes=[(4,)], dtypes=["float32"]),
        Node("b", inputs=[Entry(1)], func_name="f", device=0, shapes=[(4,)], dtypes=["float32"]),
    ]
    graph = Graph(nodes, [Entry(2), Entry(3)])
    assert graph.permuted(kahn_wave_order(graph)).device_switches() == 2
    assert reorder_for_devices(graph).device_switches() == 1 == optimal_switches(graph)


def test_optimal_order_is_kept_unchanged() -> None:
    graph = chain_graph([0, 0, 1, 1, 0])
    result = reorder_for_devices(graph)
    assert [n.name for n in result.nodes] == [n.name for n in graph.nodes]


def test_same_device_nodes_keep_their_relative_order() -> None:
    result = reorder_for_devices(parallel_graph([1, 0, 1, 0, 1]))
    names = [n.name for n in result.nodes if not n.is_input]
    assert result.device_switches() == 1
    assert names == ["k0", "k2", "k4", "k1", "k3"]


def test_inputs_go_right_before_their_first_consumer() -> None:
    nodes = [
        Node("unused", op="null", shapes=[(4,)], dtypes=["float32"]),
        Node("x", op="null", shapes=[(4,)], dtypes=["float32"]),
        Node("w", op="null", shapes=[(4,)], dtypes=["float32"]),
        Node("a", inputs=[Entry(1)], func_name="f", device=1, shapes=[(4,)], dtypes=["float32"]),
        Node("b", inputs=[Entry(1)], func_name="f", device=0, shapes=[(4,)], dtypes=["float32"]),
        Node("c", inputs=[Entry(3), Entry(2)], func_name="f", device=1, shapes=[(4,)], dtypes=["float32"]),
    ]
    result = reorder_for_devices(Graph(nodes, [Entry(4), Entry(5)]))
    assert [n.name for n in result.nodes] == ["unused", "x", "a", "w", "c", "b"]


def test_deterministic() -> None:
    graph = random_dag(7, 30, 3)
    first = reorder_for_devices(graph)
    assert [n.name for n in reorder_for_devices(graph).nodes] == [n.name for n in first.nodes]


def test_no_kernels_and_single_device() -> None:
    only_input = Graph([Node("x", op="null", shapes=[(4,)], dtypes=["float32"])], [Entry(0)])
    assert [n.name for n in reorder_for_devices(only_input).nodes] == ["x"]
    assert optimal_switches(only_input) == 0
    assert reorder_for_devices(chain_graph([2, 2, 2])).device_switches() == 0


def test_optimal_switches_on_hand_made_graphs() -> None:
    assert optimal_switches(chain_graph([0, 1, 0, 1])) == 3
    assert optimal_switches(parallel_graph([0, 1, 2, 0, 1, 2])) == 2
