"""Timing for automatic placement, on the runtime itself (:class:`RuntimeMeasurer`).

Kernels are timed the way they will run: the kernels to time become one graph of independent
nodes (each reading inputs of its own, filled with seeded random values) on the device alone, run
by the graph runtime with that device's executor settings (``device_options``: a thread pinned to
its cores with its own TVM thread pool), and the runtime's step trace gives each kernel's time:
the median over several runs after a warm-up run. Copy costs between devices without shared
memory are fitted (fixed + bytes/s) from copies of two sizes.

The compiler hands this object to its placement step; the compiler itself never imports it.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import tvm

from . import graph_runtime
from .compiler.autoplace.measured import KernelCall
from .compiler.graph import Entry, Graph, Node
from .compiler.lower import _build as compile_for_target

#: Aim for this much traced time per device, within [MIN_RUNS, MAX_RUNS] runs.
TARGET_SECONDS, MIN_RUNS, MAX_RUNS = 0.3, 3, 25
COPY_SIZES = (4 << 10, 4 << 20)


def random_value(shape: Sequence[int], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Seeded values that keep kernels on their ordinary path (no NaN, no out-of-range index)."""
    if dtype.startswith(("float", "bfloat")):
        return rng.uniform(-1.0, 1.0, size=tuple(shape)).astype(dtype)
    return np.zeros(tuple(shape), dtype=dtype)


class RuntimeMeasurer:
    """Times kernels and copies on this machine's devices (see the module docstring)."""

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        self.say = progress or (lambda _msg: None)
        self.rng = np.random.default_rng(0)

    def kernel_seconds(self, kernels: tvm.IRModule, calls: Sequence[KernelCall], device: tvm.runtime.Device,
                       target: tvm.target.Target, options: dict | None) -> list[float]:
        lib = compile_for_target(kernels, target)
        nodes: list[Node] = []
        kernel_ids: list[int] = []
        for i, call in enumerate(calls):
            inputs = []
            for j, (shape, dtype) in enumerate(call.input_types):
                nodes.append(Node(name=f"k{i}_in{j}", op="null", shapes=[tuple(shape)], dtypes=[dtype]))
                inputs.append(Entry(len(nodes) - 1, 0))
            nodes.append(Node(name=f"k{i}", inputs=inputs, func_name=call.func_name, device=0,
                              shapes=[tuple(s) for s, _ in call.output_types],
                              dtypes=[t for _, t in call.output_types]))
            kernel_ids.append(len(nodes) - 1)
        heads = [Entry(nid, o) for nid in kernel_ids for o in range(nodes[nid].num_outputs)]
        graph = Graph(nodes, heads)
        module = graph_runtime.create(graph.to_json(), lib, [device], execution="concurrent",
                                      device_options=[options] if options else None)
        for node in nodes:
            if node.is_input:
                module.set_input(node.name, random_value(node.shapes[0], node.dtypes[0], self.rng))
        trace = module.module["trace"]
        first = json.loads(trace(1))["runs"][-1]
        total = sum(s["end_us"] - s["start_us"] for s in first) * 1e-6
        runs = max(MIN_RUNS, min(MAX_RUNS, int(TARGET_SECONDS / max(total, 1e-9))))
        durations: dict[int, list[float]] = {nid: [] for nid in kernel_ids}
        for spans in json.loads(trace(runs))["runs"]:
            for span in spans:
                if span["node"] in durations and span["kind"] == "kernel":
                    durations[span["node"]].append((span["end_us"] - span["start_us"]) * 1e-6)
        missing = [calls[i].func_name for i, nid in enumerate(kernel_ids) if not durations[nid]]
        if missing:
            raise RuntimeError(f"measuring on {device}: the trace has no time for kernels {', '.join(missing)}")
        return [statistics.median(durations[nid]) for nid in kernel_ids]

    def copy_cost(self, src: tvm.runtime.Device, dst: tvm.runtime.Device) -> tuple[float, float]:
        """(fixed seconds, seconds per byte) of one copy from ``src`` to ``dst``."""
        times = []
        for nbytes in COPY_SIZES:
            a = tvm.runtime.empty((nbytes // 4,), "float32", src)
            b = tvm.runtime.empty((nbytes // 4,), "float32", dst)
            samples = []
            for _ in range(7):
                start = time.perf_counter()
                a.copyto(b)
                if dst.dlpack_device_type() != 1:
                    dst.sync()
                samples.append(time.perf_counter() - start)
            times.append(statistics.median(samples))
        slope = max(0.0, (times[1] - times[0]) / (COPY_SIZES[1] - COPY_SIZES[0]))
        return max(0.0, times[0] - slope * COPY_SIZES[0]), slope

    def latency_seconds(self, artifact, device_options: Sequence[dict | None] | None = None) -> float:
        """The built graph's measured latency, for the report's predicted-vs-measured line."""
        return measure_latency(artifact, device_options)


def measure_latency(artifact, device_options: Sequence[dict | None] | None = None, runs: int = 10) -> float:
    """Median seconds of one inference of ``artifact`` (concurrent execution, random inputs)."""
    module = artifact.create(execution="concurrent", device_options=device_options)
    rng = np.random.default_rng(0)
    for name in artifact.input_names:
        current = module.get_input(name)
        module.set_input(name, random_value(current.shape, str(current.dtype), rng))
    module.run()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        module.run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)

