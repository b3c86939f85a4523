"""``auto_split``: split points that balance measured kernel times (cost model in cost_model.py).

The kernels are compiled once per distinct stage target and the one-device graph is measured on
each distinct stage device (unless the cost cache shared with automatic placement holds every
kernel's time there) by the ``measure`` callable the caller passes (the runtime's
``measure_kernels``: per-node times, the median of ``rounds`` profiled runs, in a thread set up as
that stage's worker). The compiler itself never runs a graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tvm

from ..autoplace.cost_cache import node_key, open_cache, settings_key
from ..build import CompiledGraph, device_name
from ..compile_kernels import compile_kernels
from ..memory import planned_json
from .cost_model import DEFAULT_COPY_BYTES_PER_US, SegmentModel, choose
from .kernel_order import PipelineSplit, kernel_order, lower_one_device, make_split, tensors_between
from .stages import StageSpec, stage_backends, stage_options, stage_specs

#: ``measure(compiled, device, cores, num_threads, rounds) -> {node id: µs}``.
MeasureKernels = Callable[[CompiledGraph, tvm.runtime.Device, Sequence[int], int, int], Mapping[int, float]]


def auto_split(
    mod: tvm.IRModule,
    num_stages: int,
    targets: StageSpec | list[StageSpec] = "llvm",
    params: Mapping[str, Any] | None = None,
    *,
    measure: MeasureKernels,
    options: Mapping[str, Any] | None = None,
    rounds: int = 5,
    tolerance: float = 0.02,
    copy_bytes_per_us: float | None = DEFAULT_COPY_BYTES_PER_US,
    entry: str = "main",
    backends: Sequence[Any] | None = None,
    progress: Callable[[str], None] | None = None,
    cost_cache: Any = False,
) -> PipelineSplit:
    """Split points for ``num_stages`` stages balancing measured kernel times (cost_model.py).

    Parameters
    ----------
    targets : one stage spec for every stage, or a list of one per stage: ``(device, target)``,
        a device (``tvm.cpu(0)``, ``"cuda:0"``) or a target (``"llvm"``).
    measure : times the kernels of a compiled one-device graph (see :data:`MeasureKernels`).
    options : pipeline options (``{"stages": [{"cores": [0], "num_threads": 1}, ...]}``); each
        stage's kernels are measured in a thread configured as that stage's worker will be.
    rounds : profile runs per distinct stage device; each kernel's time is the median.
    tolerance : relative slack on the bottleneck traded for fewer boundary bytes.
    copy_bytes_per_us : speed of a boundary copy in the model (None: copies are free).
    backends : as in ``tvm_hetero.build``; None (default) is its default, oneDNN when every stage
        is a host CPU (``stages.stage_backends``), so kernels are measured as they will run.
    cost_cache : the measurements of automatic placement (``build(placement="auto")``), shared:
        False (default: none kept), None (``~/.cache/tvm-hetero/costs.sqlite``) or a path. Kernels
        are keyed as there (structural hash or region, target, device and its stage settings), so
        a stage device whose kernels are all in the cache is not measured, and what is measured
        is kept for both.
    """
    say = progress or (lambda _msg: None)
    specs = stage_specs(targets, int(num_stages))
    per_stage = stage_options(options, len(specs))
    say("lowering")
    lowered, graph = lower_one_device(mod, params, entry, stage_backends(backends, specs))
    kernels = kernel_order(graph)
    model = SegmentModel(len(kernels), tensors_between(graph, kernels))
    graph_json = planned_json(graph)
    libs: dict[str, tvm.runtime.Module] = {}
    measured: dict[tuple, list[float]] = {}
    stage_costs = []
    cache = open_cache(cost_cache)
    keys = [node_key(lowered, k.node_id, graph) for k in kernels]
    for s, (dev, target) in enumerate(specs):
        cores, threads = per_stage[s].get("cores", []), int(per_stage[s].get("num_threads", 0))
        key = (device_name(dev), str(target), tuple(cores), threads)
        settings = settings_key(device_name(dev), dict(per_stage[s]) or None)
        if key not in measured:
            cached = [cache.get("kernel", k, str(target), settings) if k else 0.0 for k in keys]
            if all(c is not None for c in cached):
                say(f"{len(kernels)} kernel times on {device_name(dev)} from the cost cache")
                measured[key] = [c * 1e6 for c in cached]
        if key not in measured:
            if str(target) not in libs:
                say(f"compiling {len(lowered.kernel_devices)} kernels for {target.kind.name}")
                libs[str(target)] = compile_kernels(lowered, [target])
            # External backends keep state by address (oneDNN caches reordered weights by the
            # weight's address): measure on a library of its own, so that the freed measuring
            # runtime leaves nothing behind for the pipeline's runtimes to stumble on.
            lib = compile_kernels(lowered, [target]) if lowered.regions else libs[str(target)]
            compiled = CompiledGraph(graph_json, lib, lowered.params, [dev], list(lowered.input_names))
            say(f"measuring {len(kernels)} kernels on {device_name(dev)} cores {cores} threads {threads}")
            by_node = measure(compiled, dev, cores, threads, rounds)
            measured[key] = [by_node[k.node_id] for k in kernels]
            cache.put_many("kernel", [(k, str(target), settings, us * 1e-6)
                                      for k, us in zip(keys, measured[key]) if k])
        stage_costs.append(measured[key])
    cache.close()
    times = [model.stage_times(c, copy_bytes_per_us) for c in stage_costs]
    points = choose(model, times, tolerance)
    result = make_split(lowered, graph, points, stage_costs, model)
    bounds = [0, *points, len(kernels)]
    result.stage_costs_us = [float(times[s][a, b]) for s, (a, b) in enumerate(itertools.pairwise(bounds))]
    result.libs = libs
    return result
