"""Measuring kernels as a pipeline stage's worker runs them (thread pinning, per-node profiles), and the
one timing loop of repeated calls (:func:`wall_times`)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tvm
import tvm_ffi

from ..graph import Graph
from ..sample_inputs import sample_values
from . import graph_runtime


def configure_thread(cores: Sequence[int] = (), num_threads: int = 0) -> None:
    """Pin the calling thread to ``cores`` and size its TVM thread pool and OpenMP team (oneDNN),
    as a pipeline stage's worker: the C++ worker's own function (support/thread_pinning.cc, every
    pool thread sharing the cores). Use it in a thread of your own, never the main thread.
    """
    tvm_ffi.get_global_func("tvm_hetero.support.configure_current_thread")(
        [int(c) for c in cores], int(num_threads), True
    )


def run_in_thread(fn: Callable[[], Any], cores: Sequence[int] = (), num_threads: int = 0) -> Any:
    """``fn()`` in a new thread configured by :func:`configure_thread`; its result or its exception."""
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            configure_thread(cores, num_threads)
            result["value"] = fn()
        except BaseException as err:  # noqa: BLE001  (re-raised in the caller)
            result["error"] = err

    thread = threading.Thread(target=work, name="tvm_hetero.pipeline.measure")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]



def wall_times(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``fn`` (the caller warms up first)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def measure_kernels(
    compiled: Any,
    device: tvm.runtime.Device,
    cores: Sequence[int] = (),
    num_threads: int = 0,
    rounds: int = 5,
) -> Mapping[int, float]:
    """Median µs of each kernel node of a compiled graph (``graph_json``, ``lib``, ``params``,
    ``input_names``) on ``device``, in a thread set up like a pipeline stage's worker."""
    found = Graph.from_json(compiled.graph_json).inputs()
    inputs = sample_values({name: found[name] for name in compiled.input_names})

    def measure() -> dict[int, float]:
        with graph_runtime.create(compiled.graph_json, compiled.lib, [device]) as runtime:
            if compiled.params:
                runtime.set_params(compiled.params)
            runtime.set_input(**inputs)
            runtime.run()  # warm-up: first-call setup (oneDNN primitives, caches)
            samples: dict[int, list[float]] = {}
            for _ in range(max(int(rounds), 1)):
                for node in runtime.profile(repeat=1)["nodes"]:
                    samples.setdefault(int(node["node_id"]), []).append(float(node["time_us"]))
        return {nid: statistics.median(times) for nid, times in samples.items()}

    return run_in_thread(measure, cores, num_threads)
