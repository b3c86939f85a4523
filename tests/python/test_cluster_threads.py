"""A CPU cluster given by its cores alone (``{"cores": [0]}``, the CLI's ``--cluster 0=0``) runs with
one thread per core: TVM's pool and the OpenMP team oneDNN uses, wherever a thread is configured
(device executors, pipeline measuring and workers)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from conftest import inp, op
from tvm.script import tirx as T
from tvm_hetero import cli, graph_runtime
from tvm_hetero.backends import dnnl
from tvm_hetero.graph import Entry, Graph
from tvm_hetero.runtime.measure import run_in_thread

TWO_CORES = len(os.sched_getaffinity(0)) >= 2
needs_openmp = pytest.mark.skipif(not dnnl.DnnlBackend().available(), reason="libtvm_hetero built without oneDNN")


@T.prim_func
def thread_config(a: T.Buffer((2,), "int32"), out: T.Buffer((2,), "int32")):
    T.func_attr({"global_symbol": "thread_config"})
    T.evaluate(T.call_packed("tvm_hetero.support.record_thread_config", out))


@needs_openmp
@pytest.mark.skipif(not TWO_CORES, reason="two clusters of one core need two cores")
@pytest.mark.parametrize("execution", ["serial", "concurrent"])
def test_cores_without_a_thread_count_give_one_thread_per_core(execution):
    # Each kernel records the OpenMP team (what oneDNN gets) and the TVM pool of the thread running it.
    lib = tvm.compile(tvm.IRModule({"thread_config": thread_config}), "llvm").mod
    graph = Graph([inp("A", 0, (2,), "int32"), op("on0", "thread_config", [0], 0, (2,), "int32"),
                   op("on1", "thread_config", [1], 1, (2,), "int32")], [Entry(1), Entry(2)])
    options = cli.parse_clusters(["0=0", "1=1"], 2)
    assert options == [{"cores": [0]}, {"cores": [1]}]  # as the CLI writes them: no thread count
    rt = graph_runtime.create(graph.to_json(), lib, [tvm.cpu(0), tvm.cpu(1)], execution=execution,
                              device_options=options)
    rt.run(A=np.zeros(2, "int32"))
    assert [rt.get_output(i).numpy().tolist() for i in range(2)] == [[1, 1], [1, 1]]


@needs_openmp
def test_a_measuring_thread_given_cores_alone_gets_one_openmp_thread_per_core():
    # Pipeline stages ({"cores": [0]}) are timed in such a thread, and their workers are set up alike.
    assert run_in_thread(lambda: dnnl.info()["threads"], cores=[0]) == 1
