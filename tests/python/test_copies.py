"""Tests of compiler/copies.py: one copy per (tensor, destination), no round trips, no new switches."""

from __future__ import annotations

import pytest
from conftest import inp, op
from test_reorder import random_dag
from tvm_hetero.compiler.copies import copy_stats, insert_copies
from tvm_hetero.compiler.reorder import reorder_for_devices
from tvm_hetero.graph import COPY_FUNC, Entry, Graph, Node


def names(graph: Graph) -> list[str]:
    return [n.name for n in graph.nodes]


def by_name(graph: Graph, name: str) -> Node:
    return next(n for n in graph.nodes if n.name == name)


def input_names(graph: Graph, name: str) -> list[str]:
    return [graph.nodes[e.node].name for e in by_name(graph, name).inputs]


def expected_input_device(before: Graph, nid: int, output_device: int | None) -> int:
    """The input-placement rule, written out again."""
    devices = [before.nodes[c].device for c in before.consumers()[nid]]
    if not devices:
        return before.nodes[nid].device if output_device is None else output_device
    if all(d == devices[0] for d in devices):
        return devices[0]
    return 0 if 0 in devices else devices[0]


def check_copies(before: Graph, after: Graph, output_device: int | None) -> None:
    """Brute-force check of every rule of insert_copies on one graph."""
    after.validate()
    originals = [n for n in after.nodes if not n.is_copy]
    assert [n.name for n in originals] == names(before)  # same nodes, same relative order
    placed = {
        n.name: expected_input_device(before, nid, output_device) if n.is_input else n.device
        for nid, n in enumerate(before.nodes)
    }
    for node in originals:
        assert node.device == placed[node.name]

    def resolve(e: Entry) -> tuple[str, int]:
        src = after.nodes[e.node]
        if src.is_copy:
            inner = src.inputs[0]
            assert not after.nodes[inner.node].is_copy, "copy of a copy"
            assert after.nodes[inner.node].device != src.device
            return after.nodes[inner.node].name, inner.index
        return src.name, e.index

    # Consumers read their original tensors, always from their own device.
    for old, new in zip(before.nodes, originals):
        assert [(before.nodes[e.node].name, e.index) for e in old.inputs] == [resolve(e) for e in new.inputs]
        for e in new.inputs:
            assert after.nodes[e.node].device == new.device

    # Exactly one copy per (tensor, other device that reads it or must hold it as an output).
    wanted = set()
    for node in before.nodes:
        for e in node.inputs:
            if placed[before.nodes[e.node].name] != node.device:
                wanted.add((before.nodes[e.node].name, e.index, node.device))
    for e in before.heads:
        if output_device is not None and placed[before.nodes[e.node].name] != output_device:
            wanted.add((before.nodes[e.node].name, e.index, output_device))
    copies = [(n, *resolve(n.inputs[0])) for n in after.nodes if n.is_copy]
    assert sorted((src, index, n.device) for n, src, index in copies) == sorted(wanted)
    for n, src, index in copies:
        producer = by_name(before, src)
        assert (n.op, n.func_name, n.shapes, n.dtypes) == (
            "tvm_op",
            COPY_FUNC,
            [producer.shapes[index]],
            [producer.dtypes[index]],
        )
        assert n.name.endswith(f".copy_to_dev{n.device}")

    # Heads: the same tensors, on the output device.
    assert [resolve(e) for e in after.heads] == [(before.nodes[e.node].name, e.index) for e in before.heads]
    if output_device is not None:
        assert all(after.nodes[e.node].device == output_device for e in after.heads)

    extra = 0 if output_device is None else 1  # one final output_device run at most
    assert after.device_switches() <= before.device_switches() + extra


def test_fan_out_to_two_consumers_on_another_device_gives_one_copy() -> None:
    graph = Graph(
        [inp("x"), op("a", "f", [0], 1), op("b", "f", [1], 0), op("c", "f", [1], 0)], [Entry(2), Entry(3)]
    )
    result = insert_copies(graph)
    check_copies(graph, result, 0)
    assert copy_stats(result) == (1, 16)
    assert input_names(result, "b") == input_names(result, "c") == ["a.copy_to_dev0"]
    assert names(result) == ["x", "a", "a.copy_to_dev0", "b", "c"]


def test_no_round_trip_back_to_the_producer_device() -> None:
    # a on 0 is read by b on 1 and again by c on 0: c reads a itself, never a copy of the copy.
    graph = Graph([inp("x"), op("a", "f", [0], 0), op("b", "f", [1], 1), op("c", "f", [1, 2], 0)], [Entry(3)])
    result = insert_copies(graph)
    check_copies(graph, result, 0)
    assert input_names(result, "c") == ["a", "b.copy_to_dev0"]
    assert input_names(result, "b") == ["a.copy_to_dev1"]
    assert copy_stats(result)[0] == 2


def test_inputs_are_placed_by_their_consumers() -> None:
    nodes = [
        inp("only1"),  # read on 1 only -> 1
        inp("mixed0"),  # read on 1 and 0 -> 0
        inp("mixed21"),  # read on 2 then 1 -> first consumer's device, 2
        inp("unread"),  # read by nobody -> the output device
        op("a", "f", [1, 2], 2),
        op("b", "f", [0, 1, 2], 1),
        op("c", "f", [1], 0),
    ]
    graph = Graph(nodes, [Entry(4), Entry(5), Entry(6)])
    result = insert_copies(graph, output_device=1)
    check_copies(graph, result, 1)
    assert [by_name(result, n).device for n in ("only1", "mixed0", "mixed21", "unread")] == [1, 0, 2, 1]


def test_heads_are_moved_to_the_output_device() -> None:
    graph = Graph([inp("x"), op("a", "f", [0], 0), op("b", "f", [1], 1)], [Entry(2), Entry(1)])
    result = insert_copies(graph)
    check_copies(graph, result, 0)
    assert [result.nodes[e.node].name for e in result.heads] == ["b.copy_to_dev0", "a"]
    assert result.device_switches() == 2  # the output copy needs a final device-0 run

    left = insert_copies(graph, output_device=None)
    check_copies(graph, left, None)
    assert copy_stats(left)[0] == 1 and [left.nodes[e.node].name for e in left.heads] == ["b", "a"]


def test_output_copy_joins_a_later_run_of_the_output_device() -> None:
    graph = Graph(
        [inp("x"), op("a", "f", [0], 1), op("b", "f", [1], 1), op("c", "f", [2], 0), op("d", "f", [3], 1)],
        [Entry(1), Entry(4)],
    )
    result = insert_copies(graph)
    check_copies(graph, result, 0)
    assert names(result)[:6] == ["x", "a", "b", "b.copy_to_dev0", "c", "a.copy_to_dev0"]
    assert result.device_switches() == graph.device_switches() + 1  # d's output needs a final run


def test_copy_goes_to_the_start_of_its_first_consumers_run() -> None:
    # Runs: [a] on 1, [b, c] on 0; c reads a, so the copy goes before b, not right before c.
    graph = Graph([inp("x"), op("a", "f", [0], 1), op("b", "f", [0], 0), op("c", "f", [1, 2], 0)], [Entry(3)])
    result = insert_copies(graph)
    check_copies(graph, result, 0)
    assert names(result) == ["x", "x.copy_to_dev1", "a", "a.copy_to_dev0", "b", "c"]
    assert result.device_switches() == graph.device_switches()


def test_copy_of_an_input_inside_its_consumers_run_follows_the_input() -> None:
    # w sits inside the device-1 run [a, b] and is read on 0 (first) and 1: it lives on 0.
    graph = Graph(
        [
            inp("x"),
            op("c", "f", [0], 0),
            op("a", "f", [0], 1),
            inp("w"),
            op("b", "f", [2, 3], 1),
            op("d", "f", [3], 0),
        ],
        [Entry(1), Entry(4), Entry(5)],
    )
    result = insert_copies(graph, output_device=None)
    check_copies(graph, result, None)
    assert names(result) == ["x", "c", "x.copy_to_dev1", "a", "w", "w.copy_to_dev1", "b", "d"]


def test_multi_output_entries_are_copied_separately() -> None:
    two = Node(
        "t", inputs=[Entry(0)], func_name="f", device=1, shapes=[(4,), (8,)], dtypes=["float32", "int64"]
    )
    graph = Graph(
        [
            inp("x"),
            two,
            Node(
                "u",
                inputs=[Entry(1, 1), Entry(1, 0)],
                func_name="f",
                device=0,
                shapes=[(4,)],
                dtypes=["float32"],
            ),
        ],
        [Entry(2)],
    )
    result = insert_copies(graph)
    check_copies(graph, result, 0)
    assert input_names(result, "u") == ["t.1.copy_to_dev0", "t.copy_to_dev0"]
    assert copy_stats(result) == (2, 8 * 8 + 4 * 4)


def test_graph_with_copies_is_rejected() -> None:
    result = insert_copies(Graph([inp("x"), op("a", "f", [0], 1)], [Entry(1)]))
    with pytest.raises(ValueError):
        insert_copies(result)


def test_random_graphs_after_reorder() -> None:
    for seed in range(150):
        graph = random_dag(4000 + seed, 2 + seed % 25, 1 + seed % 3, num_inputs=1 + seed % 4, max_outputs=2,
                           extra_heads=seed % 3)
        ordered = reorder_for_devices(graph)
        for output_device in (0, None):
            check_copies(ordered, insert_copies(ordered, output_device), output_device)
