"""Concurrent execution: devices run at the same time and give the serial result bit for bit;
slot reuse across devices is ordered; failures stop every executor; the trace shows each device."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from conftest import SHAPE, elementwise_kernel, inp, op
from tvm import te
from tvm.script import tirx as T
from tvm_hetero import build, graph_runtime
from tvm_hetero.graph import Entry, Graph
from tvm_hetero.testing import models

SLOW_STEPS = 1 << 18


def slow_kernel(name: str) -> tvm.tirx.PrimFunc:
    """c[i] = sum_k a[(i + k) % 4] * 1e-3 + b[i]: reads ``a`` throughout a long loop, so a write to
    ``a``'s memory while it runs changes the result."""
    a = te.placeholder(SHAPE, "float32", name="a")
    b = te.placeholder(SHAPE, "float32", name="b")
    k = te.reduce_axis((0, SLOW_STEPS), name="k")
    s = te.compute(SHAPE, lambda i: te.sum(a[(i + k) % 4] * 1e-3, axis=k), name="s")
    c = te.compute(SHAPE, lambda i: s[i] + b[i], name="c")
    return te.create_prim_func([a, b, c]).with_attr("global_symbol", name)


@T.prim_func
def checked_add(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32"), c: T.Buffer((4,), "float32")):
    T.func_attr({"global_symbol": "checked_add"})
    assert a[0] >= T.float32(0), "checked_add: a[0] must be non-negative"
    for i in range(4):
        c[i] = a[i] + b[i]


@pytest.fixture(scope="module")
def race_kernels() -> tvm.runtime.Module:
    mod = tvm.IRModule(
        {
            "add": elementwise_kernel("add", lambda x, y: x + y),
            "mul": elementwise_kernel("mul", lambda x, y: x * y),
            "slow": slow_kernel("slow"),
            "checked_add": checked_add,
        }
    )
    return tvm.compile(mod, "llvm").mod


def reuse_graph() -> Graph:
    """t1 = A + B on cpu:0; r = slow(t1, C) on cpu:1 reads t1 in place; t2 = A * B on cpu:0 REUSES
    t1's storage (serial liveness: t1 is dead after r); out = r + t2 on cpu:0. Concurrently,
    cpu:0 would overwrite t1 while cpu:1 still reads it unless t2 waits for r."""
    return Graph(
        [inp("A"), inp("B"), inp("C", 1), op("t1", "add", [0, 1], 0), op("r", "slow", [3, 2], 1),
         op("t2", "mul", [0, 1], 0), op("out", "add", [4, 5], 0)],
        [Entry(6)],
    )


def test_slot_reuse_waits_for_readers_on_other_devices(race_kernels):
    storage = [0, 1, 2, 3, 4, 3, 5]  # t2 takes t1's storage id
    graph_json = reuse_graph().to_json(storage)
    a, b, c = (np.arange(4, dtype="float32") + 1, np.full(4, 2.0, "float32"), np.ones(4, "float32"))
    serial = graph_runtime.create(graph_json, race_kernels, [tvm.cpu(0), tvm.cpu(1)], execution="serial")
    serial.run(A=a, B=b, C=c)
    expected = serial.get_output(0).numpy()
    concurrent = graph_runtime.create(graph_json, race_kernels, [tvm.cpu(0), tvm.cpu(1)])
    assert concurrent.stats()["shared_edges"] == 2 and concurrent.stats()["cross_device_waits"] >= 2
    for _ in range(20):
        concurrent.run(A=a, B=b, C=c)
        np.testing.assert_array_equal(concurrent.get_output(0).numpy(), expected)


@pytest.mark.parametrize("num_devices", [2, 3])
def test_thousand_inferences_bit_identical_to_serial(num_devices):
    mod, params = models.mlp()
    targets = [(tvm.cpu(d), "llvm") for d in range(num_devices)]
    art = build(mod, targets, params=params, placement=lambda info: info.index % num_devices)
    serial = art.create(execution="serial")
    concurrent = art.create(execution="concurrent")
    assert concurrent.stats()["execution"] == "concurrent" and concurrent.stats()["bytes_copied"] == 0
    rng = np.random.default_rng(num_devices)
    for _ in range(1000):
        x = rng.standard_normal((4, 16)).astype("float32")
        serial.run(x=x)
        concurrent.run(x=x)
        np.testing.assert_array_equal(concurrent.get_output(0).numpy(), serial.get_output(0).numpy())


def test_pinned_clusters_give_the_serial_result():
    mod, params = models.mlp()
    art = build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], params=params, placement={"matmul": 1})
    x = np.ones((4, 16), "float32")
    serial = art.create(execution="serial")
    serial.run(x=x)
    clusters = art.create(device_options=[{"cores": [0], "num_threads": 1}, {"cores": [1], "num_threads": 1}])
    for _ in range(50):
        clusters.run(x=x)
        np.testing.assert_array_equal(clusters.get_output(0).numpy(), serial.get_output(0).numpy())


@T.prim_func
def thread_config(a: T.Buffer((2,), "int32"), out: T.Buffer((2,), "int32")):
    T.func_attr({"global_symbol": "thread_config"})
    T.evaluate(T.call_packed("tvm_hetero.support.record_thread_config", out))


@pytest.mark.parametrize("execution", ["serial", "concurrent"])
def test_a_devices_num_threads_holds_for_its_kernels_in_both_modes(execution):
    # Each kernel writes the OpenMP team (what oneDNN gets) and the TVM pool size of the thread
    # running it. Serial execution runs one device at a time, but each with its own settings.
    lib = tvm.compile(tvm.IRModule({"thread_config": thread_config}), "llvm").mod
    graph = Graph([inp("A", 0, (2,), "int32"), op("on0", "thread_config", [0], 0, (2,), "int32"),
                   op("on1", "thread_config", [1], 1, (2,), "int32")], [Entry(1), Entry(2)])
    rt = graph_runtime.create(graph.to_json(), lib, [tvm.cpu(0), tvm.cpu(1)], execution=execution,
                              device_options=[{"num_threads": 2}, {"num_threads": 1}])
    rt.run(A=np.zeros(2, "int32"))
    (openmp0, pool0), (openmp1, pool1) = rt.get_output(0).numpy(), rt.get_output(1).numpy()
    if openmp0 == 0:
        pytest.skip("no OpenMP runtime in this process (libtvm_hetero built without oneDNN)")
    assert (openmp0, openmp1, pool1) == (2, 1, 1)
    assert 1 <= pool0 <= 2  # TVM caps its pool at the cores it counts (half the CPUs on x86)


def test_a_measuring_thread_gets_the_openmp_team_it_asks_for():
    # Pipeline stages are timed in such a thread (runtime/measure.py); oneDNN runs in its OpenMP team.
    from tvm_hetero.backends import dnnl
    from tvm_hetero.runtime.measure import run_in_thread

    if not dnnl.DnnlBackend().available():
        pytest.skip("libtvm_hetero built without oneDNN")
    assert [run_in_thread(lambda: dnnl.info()["threads"], num_threads=n) for n in (1, 2)] == [1, 2]


def failing_graph() -> Graph:
    """checked_add on cpu:1 fails when A[0] < 0; cpu:0 waits for its result."""
    return Graph(
        [inp("A"), inp("B"), op("x", "add", [0, 1], 0), op("y", "checked_add", [0, 1], 1),
         op("z", "mul", [2, 3], 0)],
        [Entry(4)],
    )


@pytest.mark.parametrize("execution", ["serial", "concurrent"])
def test_a_kernel_error_names_node_and_device_and_the_runtime_runs_again(race_kernels, execution):
    rt = graph_runtime.create(failing_graph().to_json(), race_kernels, [tvm.cpu(0), tvm.cpu(1)], execution=execution)
    good, bad = np.ones(4, "float32"), -np.ones(4, "float32")
    for _ in range(3):
        with pytest.raises(RuntimeError, match=r"while running node \d+ 'y' on device 1 \(cpu:1\).*a\[0\] must be non-negative"):
            rt.run(A=bad, B=good)
    rt.run(A=good, B=good)
    np.testing.assert_array_equal(rt.get_output(0).numpy(), (good + good) * (good + good))


def test_device_options_are_checked():
    mod, params = models.mlp()
    art = build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], params=params)
    with pytest.raises(ValueError, match=r"device_options\[1\]\['cores'\].*not a core"):
        art.create(device_options=[None, {"cores": [4096]}])
    with pytest.raises(ValueError, match=r"device_options\[0\]: unknown field 'threads'"):
        art.create(device_options=[{"threads": 2}])
    with pytest.raises(ValueError, match="3 entries for 2 devices"):
        art.create(device_options=[None, None, None])
    with pytest.raises(ValueError, match="execution must be one of"):
        art.create(execution="parallel")


def test_trace_has_a_track_per_device_with_kernels_and_waits(tmp_path, race_kernels):
    rt = graph_runtime.create(reuse_graph().to_json([0, 1, 2, 3, 4, 3, 5]), race_kernels, [tvm.cpu(0), tvm.cpu(1)])
    rt.set_input(A=np.ones(4, "float32"), B=np.ones(4, "float32"), C=np.ones(4, "float32"))
    path = tmp_path / "run.json"
    rt.trace(str(path), runs=2)
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    kernels = [e for e in spans if e["cat"] == "kernel"]
    assert sorted({e["tid"] for e in kernels}) == [0, 1]
    assert len(kernels) == 2 * 4  # four kernels per run
    assert {e["name"] for e in kernels} == {"t1", "r", "t2", "out"}
    assert any(e["cat"] == "wait" and e["tid"] == 0 for e in spans)  # cpu:0 waits for the slow r
    slow = next(e for e in kernels if e["name"] == "r")
    t2 = next(e for e in kernels if e["name"] == "t2" and e["args"]["run"] == slow["args"]["run"])
    assert t2["ts"] >= slow["ts"] + slow["dur"] - 1e-3  # the reuse waited for the reader
    summary = rt.timeline()
    assert [d["name"] for d in summary["devices"]] == ["cpu:0", "cpu:1"]
    assert summary["devices"][1]["busy_us"] > 0 and summary["total_us"] >= summary["devices"][1]["busy_us"]


def test_cli_runs_on_clusters_writes_a_trace_and_draws_a_timeline(tmp_path, capsys):
    from tvm_hetero import cli

    mod, params = models.mlp()
    # TVM kernels only: oneDNN would take the add and relu to the matmul's device, leaving cpu:0 idle
    art = build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], params=params, placement={"matmul": 1},
                backends=())
    art.export(tmp_path / "a")
    trace = tmp_path / "run.json"
    assert cli.main(["run", str(tmp_path / "a"), "--cluster", "0=0", "--cluster", "1=1:1", "--trace", str(trace)]) == 0
    tracks = {e["tid"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"}
    assert tracks == {0, 1}
    picture = tmp_path / "timeline.png"
    assert cli.main(["inspect", str(tmp_path / "a"), "--timeline", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["run", str(tmp_path / "a"), "--cluster", "7=0"]) == 1
    assert "device 7 is out of range" in capsys.readouterr().err


def test_overlap_order_keeps_switches_and_outputs():
    mod, params = models.mlp()
    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    placement = lambda info: info.index % 2
    switches = build(mod, targets, params=params, placement=placement, reorder="switches")
    overlap = build(mod, targets, params=params, placement=placement, reorder="overlap")
    assert overlap.build_report.switches_reordered <= switches.build_report.switches_reordered
    x = np.ones((4, 16), "float32")
    a, b = switches.create(), overlap.create()
    a.run(x=x)
    b.run(x=x)
    np.testing.assert_array_equal(a.get_output(0).numpy(), b.get_output(0).numpy())
    with pytest.raises(ValueError, match="reorder must be"):
        build(mod, targets, params=params, reorder="fastest")


def test_demo_runs_clusters_compares_and_draws(tmp_path, capsys):
    from tvm_hetero import cli

    picture = tmp_path / "demo.png"
    assert cli.main(["demo", "--model", "squeezenet", "--repeat", "1", "--timeline", str(picture),
                     "--cost-cache", str(tmp_path / "costs.sqlite")]) == 0
    printed = capsys.readouterr().out
    for expected in ("automatic placement (objective latency)", "with dnnl" if "backend dnnl" in printed else "",
                     "concurrent execution", "devices pinned to cores", "overlap", "compared with",
                     "best single device", "onnxruntime, 2 threads", "-> OK"):
        assert expected in printed, expected
    assert picture.read_bytes()[:4] == b"\x89PNG"
