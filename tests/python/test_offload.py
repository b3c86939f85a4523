"""Local and remote devices in one runtime: one RPC call per remote group, faults, timeouts."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tvm
from conftest import copy, duplex_graph, inp, op, simplex_graph
from tvm import te
from tvm_hetero import graph_runtime
from tvm_hetero.graph import COPY_FUNC, Entry, Graph, Node
from tvm_hetero.runtime.rpc import start_local_server

rng = np.random.default_rng(3)


def expected(graph_fn, v):
    if graph_fn is simplex_graph:
        return (v["A"] + v["B"]) - v["C"]
    return (v["A"] + v["B"]) - v["C"] + v["D"]


@pytest.mark.parametrize("graph_fn", [simplex_graph, duplex_graph])
@pytest.mark.parametrize("offload", ["group", "per_op"])
def test_local_and_remote_devices_in_one_graph(rpc_server, kernels, graph_fn, offload):
    session = rpc_server.connect()
    graph = graph_fn()
    m = graph_runtime.create(graph.to_json(), kernels, [tvm.cpu(0), session.cpu(0)], offload=offload)
    values = {n.name: rng.standard_normal(4).astype("float32") for n in graph.nodes if n.is_input}
    m.run(**values)
    np.testing.assert_allclose(m.get_output(0).numpy(), expected(graph_fn, values), rtol=1e-6)
    stats = m.stats()
    remote_groups = stats["group_devices"].count(1)
    assert stats["remote_compute_calls"] == remote_groups  # one kernel per remote group here
    if offload == "group":  # the copies travel inside the groups' calls
        assert stats["copies_in_remote_calls"] == stats["num_copies"] > 0
        assert stats["remote_copies"] == 0
        assert stats["round_trips"] == remote_groups
    else:
        assert stats["remote_copies"] == stats["num_copies"]
    assert m.get_input("A").device.dlpack_device_type() >= 128  # A lives in the remote process


def chain_graph(num_local: int, num_remote: int) -> Graph:
    """x -> [add one] * num_remote on device 1 -> copy -> [add one] * num_local on device 0."""
    nodes = [Node("x", op="null", device=1, shapes=[(4,)], dtypes=["float32"]),
             Node("one", op="null", device=1, shapes=[(4,)], dtypes=["float32"]),
             Node("one_local", op="null", device=0, shapes=[(4,)], dtypes=["float32"])]
    prev = 0
    for i in range(num_remote):
        nodes.append(Node(f"r{i}", inputs=[Entry(prev), Entry(1)], func_name="add", device=1,
                          shapes=[(4,)], dtypes=["float32"]))
        prev = len(nodes) - 1
    nodes.append(Node("to_host", inputs=[Entry(prev)], func_name=COPY_FUNC, device=0, shapes=[(4,)],
                      dtypes=["float32"]))
    prev = len(nodes) - 1
    for i in range(num_local):
        nodes.append(Node(f"l{i}", inputs=[Entry(prev), Entry(2)], func_name="add", device=0,
                          shapes=[(4,)], dtypes=["float32"]))
        prev = len(nodes) - 1
    return Graph(nodes, [Entry(prev)])


def test_a_remote_group_is_one_call_however_many_kernels(rpc_server, kernels):
    session = rpc_server.connect()
    graph = chain_graph(num_local=3, num_remote=20)
    grouped = graph_runtime.create(graph.to_json(), kernels, [tvm.cpu(0), session.cpu(0)])
    per_op = graph_runtime.create(graph.to_json(), kernels, [tvm.cpu(0), session.cpu(0)], offload="per_op")
    x, one = rng.standard_normal(4).astype("float32"), np.ones(4, "float32")
    for m in (grouped, per_op):
        m.run(x=x, one=one, one_local=one)
        np.testing.assert_allclose(m.get_output(0).numpy(), x + 23, rtol=1e-6)
    assert grouped.stats()["remote_compute_calls"] == 1
    assert per_op.stats()["remote_compute_calls"] == 20
    assert per_op.stats()["remote_copies"] == 1
    assert grouped.stats()["remote_copies"] == 0  # the result comes back with the group's call
    assert grouped.stats()["round_trips"] == 1


def test_compiled_model_with_a_remote_device_matches_local(rpc_server):
    import tvm_hetero
    from test_build import MLP, PARAMS, TWO_CPUS, X

    art = tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 1, "add": 1, "relu": 1}, params=PARAMS)
    local = art.create()
    local.run(x=X)
    session = rpc_server.connect()
    remote = art.create([tvm.cpu(0), session.cpu(0)])
    remote.run(x=X)
    np.testing.assert_allclose(remote.get_output(0).numpy(), local.get_output(0).numpy(), rtol=1e-6)
    stats = remote.stats()
    assert stats["remote_compute_calls"] == stats["group_devices"].count(1) == 1


def slow_remote_graph(n: int = 512):
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n))
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    lib = tvm.compile(tvm.IRModule({"mm": te.create_prim_func([a, b, c]).with_attr("global_symbol", "mm")}),
                      "llvm").mod
    shape = [(n, n)]
    nodes = [Node("a", op="null", device=1, shapes=shape, dtypes=["float32"]),
             Node("b", op="null", device=1, shapes=shape, dtypes=["float32"]),
             Node("mm1", inputs=[Entry(0), Entry(1)], func_name="mm", device=1, shapes=shape, dtypes=["float32"]),
             Node("mm2", inputs=[Entry(2), Entry(1)], func_name="mm", device=1, shapes=shape, dtypes=["float32"]),
             Node("out", inputs=[Entry(3)], func_name=COPY_FUNC, device=0, shapes=shape, dtypes=["float32"])]
    return Graph(nodes, [Entry(4)]), lib


def test_server_killed_during_run_raises_promptly_and_a_new_runtime_works():
    graph, lib = slow_remote_graph()
    x = rng.standard_normal((512, 512)).astype("float32") / 16
    server = start_local_server()
    try:
        m = graph_runtime.create(graph.to_json(), lib, [tvm.cpu(0), server.connect().cpu(0)])
        m.set_input(a=x, b=x)
        start = time.perf_counter()
        m.run()
        one_run = time.perf_counter() - start
        threading.Timer(one_run / 4, server.kill).start()
        start = time.perf_counter()
        named = rf"device 1 \(remote:cpu:0\) at 127\.0\.0\.1:{server.port}: the connection was lost during run"
        with pytest.raises(ConnectionError, match=named + r".*offloaded group starting at node 2 'mm1'"):
            m.run()
        assert time.perf_counter() - start < one_run + 5
        with pytest.raises(ConnectionError, match=named):
            m.run()  # still a clean error, not a crash
        assert m.stats()["num_nodes"] == len(graph.nodes)  # the runtime still answers
        m.close()
        assert m.closed
    finally:
        server.stop()
    with start_local_server() as again:
        m = graph_runtime.create(graph.to_json(), lib, [tvm.cpu(0), again.connect().cpu(0)])
        m.run(a=x, b=x)
        np.testing.assert_allclose(m.get_output(0).numpy(), (x @ x) @ x, rtol=1e-3, atol=1e-3)


def test_hung_remote_device_times_out():
    import os
    import signal

    graph, lib = slow_remote_graph()
    x = rng.standard_normal((512, 512)).astype("float32")
    with start_local_server() as server:
        m = graph_runtime.create(graph.to_json(), lib, [tvm.cpu(0), server.connect().cpu(0)], remote_timeout=2.0)
        m.run(a=x, b=x)  # within the limit
        os.killpg(server.process.pid, signal.SIGSTOP)  # the device hangs: alive, never answers
        try:
            start = time.perf_counter()
            with pytest.raises(TimeoutError, match=rf"device 1 \(remote:cpu:0\) at 127\.0\.0\.1:{server.port} "
                                                   "did not answer within 2.0 s"):
                m.run()
            assert time.perf_counter() - start < 6
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)


def reuse_graph() -> Graph:
    """On the remote device: t0 = a + 1; t1 = t0 + 1; t2 = copy of host y; t3 = t2 + 1; then
    out = t1 + t3 on the host. With the storage ids of ``SHARED_SLOT``, t2 reuses t0's bytes once
    t1 has read them, so the copy of y must not be moved before that read."""
    return Graph(
        [inp("a", 1), inp("one", 1), inp("y", 0),
         op("k0", "add", [0, 1], 1), op("k1", "add", [3, 1], 1), copy("c", 2, 1), op("k2", "add", [5, 1], 1),
         copy("back1", 4, 0), copy("back2", 6, 0), op("out", "add", [7, 8], 0)],
        [Entry(9)],
    )


SHARED_SLOT = [0, 1, 2, 3, 4, 3, 6, 7, 8, 9]  # t2 (entry 5) in t0's (entry 3) storage


@pytest.mark.parametrize("storage_ids, calls", [(None, 1), (SHARED_SLOT, 2)])
@pytest.mark.parametrize("execution", ["serial", "concurrent"])
def test_copies_travel_with_the_group_call_unless_that_would_overwrite_a_live_tensor(
        kernels, storage_ids, calls, execution):
    with start_local_server() as server, graph_runtime.create(
            reuse_graph().to_json(storage_ids), kernels, [tvm.cpu(0), server.connect().cpu(0)],
            execution=execution) as m:
        a, one = rng.standard_normal(4).astype("float32"), np.ones(4, "float32")
        for _ in range(3):  # new host data each run travels with the call
            y = rng.standard_normal(4).astype("float32")
            m.run(a=a, one=one, y=y)
            # Moving the copy of y before t1's read would give (y + 2) + (y + 1).
            np.testing.assert_allclose(m.get_output(0).numpy(), (a + 2) + (y + 1), rtol=1e-6)
        stats = m.stats()
    assert stats["group_devices"].count(1) == 1
    assert stats["remote_compute_calls"] == stats["round_trips"] == calls
    assert stats["copies_in_remote_calls"] == stats["num_copies"] == 3
