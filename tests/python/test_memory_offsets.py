"""Offset memory plans (compiler/arena.py, memory.py) and the plan verifier (compiler/verify_memory.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_memory import chain, device_items, entry_table, slot_plan
from test_reorder import random_dag
from tvm_hetero.compiler.arena import ALIGNMENT, aligned, arena_size, compact, plan_arena
from tvm_hetero.compiler.copies import insert_copies
from tvm_hetero.compiler.memory import MemoryPlan, _bounds, _Item, plan_memory
from tvm_hetero.compiler.reorder import reorder_for_devices
from tvm_hetero.compiler.verify_memory import MemoryPlanError, verify_memory_plan
from tvm_hetero.graph import Graph


def simulate_bytes(graph: Graph, plan: MemoryPlan) -> None:
    """Run the graph on the planned bytes: every byte remembers the last entry that wrote it.

    Each node must find all bytes of its inputs still its inputs' own; at the end, so must the outputs.
    """
    table = entry_table(graph)
    owner = {s: [-1] * size for s, size in enumerate(plan.storage_bytes)}

    def write(eid: int) -> None:
        size = table[eid][2].output_bytes(table[eid][1])
        off = plan.offset(eid)
        owner[plan.storage_ids[eid]][off : off + size] = [eid] * size

    def intact(eid: int) -> bool:
        size = table[eid][2].output_bytes(table[eid][1])
        off = plan.offset(eid)
        return all(o == eid for o in owner[plan.storage_ids[eid]][off : off + size])

    row_ptr = graph.entry_ids()
    for eid, (_, _, node) in enumerate(table):
        if node.is_input:
            write(eid)
    for nid, node in enumerate(graph.nodes):
        if node.is_input:
            continue
        for e in node.inputs:
            assert intact(row_ptr[e.node] + e.index), f"node {nid} reads a clobbered input"
        outs = [row_ptr[nid] + j for j in range(node.num_outputs)]
        for eid in outs:
            write(eid)
        for e in node.inputs:  # an output written over an input the kernel still reads
            assert intact(row_ptr[e.node] + e.index), f"node {nid} writes over its own input"
        for eid in outs:
            assert intact(eid), f"outputs of node {nid} overlap"
    for e in graph.heads:
        assert intact(row_ptr[e.node] + e.index), "a graph output was overwritten"


def check_offset_plan(graph: Graph, plan: MemoryPlan) -> None:
    simulate_bytes(graph, plan)
    slots = slot_plan(graph)
    for dev, planned in enumerate(plan.planned_bytes):
        assert plan.lower_bound_bytes[dev] <= planned
        assert planned <= slots.planned_bytes[dev]  # never worse than the storage-id plan
        sids = {s for s, d in enumerate(plan.storage_device) if d == dev}
        kernel_sids = {
            plan.storage_ids[e] for e, (_, _, n) in enumerate(entry_table(graph)) if not n.is_input
        }
        assert planned == sum(plan.storage_bytes[s] for s in sids & kernel_sids)
    assert all(o % ALIGNMENT == 0 for o in plan.storage_offsets)


def test_random_graphs_get_safe_offset_plans() -> None:
    for seed in range(150):
        graph = random_dag(6000 + seed, 1 + seed % 30, 1 + seed % 3, num_inputs=1 + seed % 3, max_outputs=3)
        check_offset_plan(graph, plan_memory(graph))
    for seed in range(40):
        graph = insert_copies(reorder_for_devices(random_dag(7000 + seed, 10 + seed % 30, 2 + seed % 2)))
        check_offset_plan(graph, plan_memory(graph))


def best_arena(spans: list[tuple[int, int, int]]) -> int:
    """Smallest arena over all placements, by exhaustive search.

    Complete: gravity (compaction) turns any placement into one no larger where each item sits at 0
    or right on top of a time-overlapping item with a lower offset, so trying, in every order, every
    such position finds an optimum.
    """
    best = [sum(s[0] for s in spans)]

    def overlap(i: int, j: int) -> bool:
        return spans[i][1] <= spans[j][2] and spans[j][1] <= spans[i][2]

    def go(left: list[int], offsets: dict[int, int], top: int) -> None:
        if top >= best[0]:
            return
        if not left:
            best[0] = top
            return
        for i in left:
            size = spans[i][0]
            near = [j for j in offsets if overlap(i, j)]
            for at in {0, *(offsets[j] + spans[j][0] for j in near)}:
                if all(at + size <= offsets[j] or offsets[j] + spans[j][0] <= at for j in near):
                    offsets[i] = at
                    go([k for k in left if k != i], offsets, max(top, at + size))
                    del offsets[i]

    go(list(range(len(spans))), {}, 0)
    return best[0]


def test_arena_against_brute_force_on_small_graphs() -> None:
    cases = optimal = 0
    worst = 1.0
    for seed in range(200):
        graph = random_dag(11000 + seed, 3 + seed % 5, 1, num_inputs=1 + seed % 2, max_outputs=1 + seed % 2)
        items, n = device_items(graph)
        if not 2 <= len(items) <= 7:
            continue
        spans = [(aligned(item.size), item.start, item.end) for item in items]
        peak = _bounds([_Item(0, *span) for span in spans], n)[0]
        offsets = plan_arena(spans, n, peak, _end_to_end(spans))
        got, optimum = arena_size(spans, offsets), best_arena(spans)
        assert peak <= optimum <= got
        cases += 1
        optimal += got == optimum
        worst = max(worst, got / optimum)
    print(f"offset plan optimal on {optimal}/{cases} small graphs, worst {worst:.3f}x the optimum")
    assert cases >= 100
    # Measured: optimal on 142 of 144, at most 1.078x the optimum (the problem is NP-hard and the
    # planner greedy); a regression of the heuristics shows here.
    assert optimal >= 0.97 * cases
    assert worst <= 1.10


def _end_to_end(spans: list[tuple[int, int, int]]) -> list[int]:
    """Every item in its own place: the trivially safe placement."""
    out, top = [], 0
    for size, _, _ in spans:
        out.append(top)
        top += size
    return out


def test_compaction_never_grows_the_arena() -> None:
    for seed in range(60):
        graph = random_dag(12000 + seed, 5 + seed % 20, 1, max_outputs=2)
        items, _ = device_items(graph)
        spans = [(aligned(item.size), item.start, item.end) for item in items]
        start = _end_to_end(spans)
        assert arena_size(spans, compact(spans, start)) <= arena_size(spans, start)


def test_offsets_beat_the_slot_bound() -> None:
    # A big early tensor (1000 floats) dies before two smaller ones (500 each) that live together:
    # a storage-id plan needs 1000 + 500 (one slot cannot hold both), offsets fit both in 1000.
    graph = chain([1000, 10, 500, 500])
    plan = plan_memory(graph)
    check_offset_plan(graph, plan)
    assert slot_plan(graph).planned_bytes[0] == 4 * (1000 + 500)
    # The peak-live bound is 4 * (1000 + 10); offsets rounded up to 64 bytes cost the 32 over it.
    assert plan.lower_bound_bytes[0] == 4 * 1010
    assert plan.planned_bytes[0] == 4 * 1010 + 32


def test_plan_without_offsets_writes_the_classic_format() -> None:
    graph = chain([16, 16, 16])
    plan = plan_memory(graph, offsets=False)
    doc = json.loads(graph.to_json(plan.storage_ids, plan.storage_offsets))
    assert "storage_offset" not in doc["attrs"]


def test_verifier_catches_a_corrupted_plan() -> None:
    graph = chain([1000, 500, 500])
    plan = plan_memory(graph)
    verify_memory_plan(graph, plan)
    # k0 (entry 1) and k1 (entry 2) are live together at k1: put k1 on top of k0's bytes.
    bad = dataclasses.replace(
        plan, storage_ids=list(plan.storage_ids), storage_offsets=list(plan.storage_offsets)
    )
    bad.storage_ids[2] = bad.storage_ids[1]
    bad.storage_offsets[2] = bad.storage_offsets[1]
    with pytest.raises(MemoryPlanError, match=r"entry 2 .*'k1'.* and entry 1 .*'k0'.* are live at once"):
        verify_memory_plan(graph, bad)
    # A storage id used on two devices.
    bad = dataclasses.replace(
        plan, storage_ids=list(plan.storage_ids), storage_offsets=list(plan.storage_offsets)
    )
    bad.storage_ids[3], bad.storage_offsets[3] = bad.storage_ids[1], bad.storage_offsets[1]  # k0 died at k1
    verify_memory_plan(graph, bad)
    graph.nodes[3].device = 1
    with pytest.raises(MemoryPlanError, match="crosses devices"):
        verify_memory_plan(graph, bad)
    graph.nodes[3].device = 0
    # Misaligned, or out of its storage.
    bad = dataclasses.replace(plan, storage_offsets=[0, 8, 0, 0])
    with pytest.raises(MemoryPlanError, match="not a non-negative multiple of 64"):
        verify_memory_plan(graph, bad)
    bad = dataclasses.replace(plan, storage_offsets=[0, 0, 0, 1 << 20])
    with pytest.raises(MemoryPlanError, match="exceed storage id"):
        verify_memory_plan(graph, bad)


def test_verifier_accepts_every_slot_plan() -> None:
    for seed in range(30):
        graph = random_dag(13000 + seed, 5 + seed, 2, max_outputs=2)
        verify_memory_plan(graph, slot_plan(graph))


def _kernels_and_graph():
    """x -> a = 2x (1000) -> b = sum(a) (1), c = a[:400] -> d = c + b -> e = c + d -> f = e + b.

    ``a`` dies at ``c`` while ``b`` lives on to the end: ``c``, ``d`` and ``e`` fit in ``a``'s bytes
    at offsets, which a storage-id plan cannot do (``c`` and ``d`` are live together).
    """
    import tvm
    from tvm import te

    def prim(name, ins, out):
        return te.create_prim_func([*ins, out]).with_attr("global_symbol", name)

    x = te.placeholder((1000,), "float32", "x")
    c4 = te.placeholder((400,), "float32", "c")
    d4 = te.placeholder((400,), "float32", "d")
    b1 = te.placeholder((1,), "float32", "b")
    k = te.reduce_axis((0, 1000), "k")
    funcs = {
        "scale": prim("scale", [x], te.compute((1000,), lambda i: x[i] * 2)),
        "total": prim("total", [x], te.compute((1,), lambda i: te.sum(x[k], axis=k))),
        "head": prim("head", [x], te.compute((400,), lambda i: x[i])),
        "addb": prim("addb", [c4, b1], te.compute((400,), lambda i: c4[i] + b1[0])),
        "add2": prim("add2", [c4, d4], te.compute((400,), lambda i: c4[i] + d4[i])),
    }
    lib = tvm.compile(tvm.IRModule({tvm.ir.GlobalVar(n): f for n, f in funcs.items()}), "llvm").mod
    from tvm_hetero.graph import Entry, Node

    def kernel(name, func, inputs, n):
        return Node(
            name, inputs=[Entry(i) for i in inputs], func_name=func, shapes=[(n,)], dtypes=["float32"]
        )

    nodes = [
        Node("x", op="null", shapes=[(1000,)], dtypes=["float32"]),
        kernel("a", "scale", [0], 1000),
        kernel("b", "total", [1], 1),
        kernel("c", "head", [1], 400),
        kernel("d", "addb", [3, 2], 400),
        kernel("e", "add2", [3, 4], 400),
        kernel("f", "addb", [5, 2], 400),
    ]
    return lib, Graph(nodes, [Entry(6)])


def test_runtime_allocates_what_the_offset_plan_says_and_computes_the_same() -> None:
    """The C++ runtime on an offset plan: the right outputs, and storage = planned + inputs."""
    import numpy as np
    import tvm
    import tvm_hetero

    lib, graph = _kernels_and_graph()
    x = np.random.default_rng(3).standard_normal(1000).astype("float32")
    a = 2 * x
    b = a.sum()
    c = a[:400]
    want = c + (c + b) + b
    for offsets in (True, False):
        plan = plan_memory(graph, offsets=offsets)
        assert any(plan.storage_offsets) == offsets
        module = tvm_hetero.graph_runtime.create(
            graph.to_json(plan.storage_ids, plan.storage_offsets), lib, [tvm.cpu(0)]
        )
        module.run(x=x)
        np.testing.assert_allclose(module.get_output(0).numpy(), want, rtol=1e-5)
        assert module.stats()["storage_bytes"] == [plan.planned_bytes[0] + plan.input_bytes[0]]
    assert plan_memory(graph).planned_bytes[0] < plan_memory(graph, offsets=False).planned_bytes[0]


def test_graphs_without_offsets_load_and_run_as_before() -> None:
    """The classic format (no storage_offset column): every entry at the start of its storage id."""
    import numpy as np
    import tvm
    import tvm_hetero
    from test_fold_constants import Dense, expected
    from tvm_hetero.graph import Graph as _Graph

    art = tvm_hetero.build(Dense, [(tvm.cpu(0), "llvm")])
    doc = json.loads(art.graph_json)
    nodes = doc["nodes"]
    assert nodes  # rebuild the slot plan for the same graph and write it in the classic format
    graph = _graph_from_json(doc, _Graph)
    plan = plan_memory(graph, offsets=False)
    classic = graph.to_json(plan.storage_ids, plan.storage_offsets)
    assert "storage_offset" not in json.loads(classic)["attrs"]
    module = tvm_hetero.graph_runtime.create(classic, art.lib, [tvm.cpu(0)])
    module.set_params(art.params)
    x = np.random.default_rng(4).standard_normal((64, 8)).astype("float32")
    module.run(x=x)
    np.testing.assert_allclose(module.get_output(0).numpy(), expected(x), rtol=1e-5, atol=1e-5)
    assert module.stats()["storage_bytes"] == [sum(plan.storage_bytes)]


def _graph_from_json(doc: dict, graph_type):
    """The compiler's Graph back from its JSON (only what planning needs)."""
    from tvm_hetero.graph import Entry, Node

    shapes, dtypes = doc["attrs"]["shape"][1], doc["attrs"]["dltype"][1]
    row = doc["node_row_ptr"]
    nodes = []
    for nid, n in enumerate(doc["nodes"]):
        outs = range(row[nid], row[nid + 1])
        nodes.append(
            Node(
                n["name"],
                op=n["op"],
                inputs=[Entry(e[0], e[1]) for e in n["inputs"]],
                func_name=n.get("attrs", {}).get("func_name", ""),
                device=doc["attrs"]["device_index"][1][nid],
                shapes=[tuple(shapes[e]) for e in outs],
                dtypes=[dtypes[e] for e in outs],
            )
        )
    return graph_type(nodes, [Entry(h[0], h[1]) for h in doc["heads"]])
