"""Pipelines from a Relax module: cut its graph into stages, build them, run them (docs/pipeline.md).

    plan = pipeline.split(mod, [30], params=params)             # manual: stage 1 starts at kernel 30
    plan = pipeline.auto_split(mod, 2, "llvm", options=opts)     # measured and balanced
    art = pipeline.build(mod, ["cpu:0", "cpu:1"], plan, params=params, options=opts)
    with art.create() as pipe:
        outputs = pipe.run_batch(batch)

**Where cuts live.** A module is lowered once, exactly as ``tvm_hetero.build`` lowers it for ONE
device (same passes, same node order). Its kernel nodes, in that topological order, are the
*kernel order*; ``split(...).describe()`` lists it (position, node name = the Relax var bound to
the kernel call, kernel symbol, output bytes). A split point is a kernel position (an int) or a
kernel node name (a str): the kernel where the next stage begins. Stage ``s`` runs the kernels
between split point ``s - 1`` and split point ``s``. A cut in a topological order sends every
tensor forward, so stage inputs come from the pipeline inputs, parameters, or earlier stages.

**auto_split.** The kernels are compiled once per distinct stage target and the one-device graph
is profiled on each distinct stage device, under that stage's ``cores``/``num_threads`` (the
graph runtime's ``profile()``, per-node times, the median of ``rounds`` runs). A stage covering
kernel positions ``[a, b)`` then costs::

    T_s(a, b) = sum of the kernel times measured on stage s's device
                + (bytes it receives from earlier stages + bytes it sends to later stages) / copy_bytes_per_us

Dynamic programming over the kernel order (``choose_split_points``) first finds the smallest
possible bottleneck ``B* = min over cuts of max_s T_s``, then, among the cuts whose every stage
costs at most ``B* * (1 + tolerance)``, picks the one that moves the fewest bytes across stage
boundaries (each tensor counted once per stage that receives it), ties going to the smaller
bottleneck. Guarantee: both steps are exact for this cost model over cuts of the given kernel
order (tests check them against brute force); other topological orders are not searched.

**Same bits as the unsplit graph.** Every stage runs the kernels of the one-device graph, in the
same order, from one library compiled once (when all stages share a target), so each inference
is bit-identical to the unsplit graph (:meth:`PipelineArtifact.unsplit`, or ``tvm_hetero.build``
of the same module on one device).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from . import pipeline_runtime
from .compiler import artifact_files
from .compiler.build import LIB_FILE, PARAMS_FILE, Artifact, _size, device_name, parse_device
from .compiler.copies import insert_copies
from .compiler.graph import Entry, Graph, Node
from .compiler.lower import LoweredGraph, compile_kernels, lower_to_graph
from .compiler.memory import planned_json
from .compiler.reorder import reorder_for_devices
from .pipeline_runtime import PipelineModule

__all__ = [
    "PipelineArtifact",
    "PipelineSplit",
    "auto_split",
    "build",
    "choose_split_points",
    "configure_thread",
    "load",
    "measure_kernels",
    "run_in_thread",
    "split",
    "stage_graphs",
]

#: ``(device, target)`` pair, a device (``tvm.cpu(1)``, ``"cpu:1"``) or a target (``"llvm"``).
StageSpec = Any
#: One tensor for :func:`choose_split_points`: (producer position, consumer positions, bytes).
Tensor = tuple[int, Sequence[int], int]

MANIFEST_FILE, UNSPLIT_GRAPH_FILE = "pipeline.json", "graph.json"
FORMAT = "tvm-hetero-pipeline/1"
DEFAULT_COPY_BYTES_PER_US = 4000.0  # 4 GB/s, a conservative host memcpy
_SHARE_ALL_CORES = -3  # runtime.config_threadpool mode: every pool thread shares the listed cores


# ---- stage specs ------------------------------------------------------------------------------
def _stage_spec(spec: StageSpec) -> tuple[tvm.runtime.Device, tvm.target.Target]:
    """``(device, target)`` from any :data:`StageSpec`."""
    if isinstance(spec, tuple) and len(spec) == 2:
        dev = parse_device(spec[0])
        target = spec[1] if isinstance(spec[1], tvm.target.Target) else tvm.target.Target(spec[1])
        return dev, target
    if isinstance(spec, (tvm.target.Target, Mapping)):
        target = spec if isinstance(spec, tvm.target.Target) else tvm.target.Target(dict(spec))
        return _device_of(target), target
    if isinstance(spec, str):
        try:
            dev = parse_device(spec)
        except ValueError:
            target = tvm.target.Target(spec)
            return _device_of(target), target
        return dev, _default_target(dev)
    if isinstance(spec, tvm.runtime.Device):
        return spec, _default_target(spec)
    raise TypeError(f"a stage is (device, target), a device or a target; got {spec!r}")


def _default_target(dev: tvm.runtime.Device) -> tvm.target.Target:
    kind = device_name(dev).split(":")[0]
    return tvm.target.Target("llvm" if kind == "cpu" else kind)


def _target_label(target: str) -> str:
    """``llvm``, ``cuda``: the kind of a target string (``str(Target)`` is JSON in TVM 0.27)."""
    try:
        return tvm.target.Target(target).kind.name
    except Exception:  # noqa: BLE001  (a label only)
        return target


def _device_of(target: tvm.target.Target) -> tvm.runtime.Device:
    kind = target.kind.name
    return tvm.cpu(0) if kind in ("llvm", "c") else tvm.runtime.device(kind, 0)


def _stage_specs(stages: StageSpec | Sequence[StageSpec], num_stages: int | None) -> list[tuple[Any, Any]]:
    """One ``(device, target)`` per stage: a list gives one per stage, anything else is repeated."""
    if isinstance(stages, list):
        if num_stages is not None and len(stages) != num_stages:
            raise ValueError(f"{len(stages)} stage devices/targets for {num_stages} stages")
        if not stages:
            raise ValueError("stages: at least one stage is needed")
        return [_stage_spec(s) for s in stages]
    if num_stages is None:
        raise ValueError("give a list of stages, or the number of stages (split_points=int)")
    return [_stage_spec(stages)] * num_stages


def _stage_options(options: Mapping[str, Any] | None, num_stages: int) -> list[dict]:
    """Per-stage ``{"cores", "num_threads"}`` from pipeline options (docs/pipeline.md)."""
    stages = list((options or {}).get("stages", []))
    if len(stages) > num_stages:
        raise ValueError(f"options give {len(stages)} stage entries for {num_stages} stages")
    return [dict(s) for s in stages] + [{} for _ in range(num_stages - len(stages))]


# ---- the kernel order and a split of it -------------------------------------------------------
@dataclass
class Kernel:
    """One kernel node of the one-device graph, at ``position`` in the kernel order."""

    position: int
    node_id: int
    name: str
    func_name: str
    output_bytes: int


@dataclass
class PipelineSplit:
    """Where the kernel order is cut into stages, and what each stage costs.

    Made by :func:`split` or :func:`auto_split`; :func:`build` takes it (and reuses the lowering
    and, for auto_split, the compiled kernels).
    """

    #: Kernel positions where stages 1, 2, ... begin.
    split_points: list[int]
    #: The kernel order.
    kernels: list[Kernel]
    #: Per stage: bytes it receives from earlier stages per inference.
    boundary_bytes: list[int]
    #: Per stage: modelled time in µs (measured kernels + copies); None for a manual split.
    stage_costs_us: list[float] | None = None
    #: Per stage device: measured µs of each kernel position (auto_split); None for a manual split.
    costs_us: list[list[float]] | None = None
    lowered: LoweredGraph | None = field(default=None, repr=False)
    #: The one-device graph (what ``tvm_hetero.build`` makes for one device).
    graph: Graph | None = field(default=None, repr=False)
    #: Compiled kernel libraries by target string (from measuring), reused by :func:`build`.
    libs: dict[str, tvm.runtime.Module] = field(default_factory=dict, repr=False)

    @property
    def num_stages(self) -> int:
        return len(self.split_points) + 1

    def ranges(self) -> list[tuple[int, int]]:
        """``[begin, end)`` kernel positions of each stage."""
        bounds = [0, *self.split_points, len(self.kernels)]
        return list(itertools.pairwise(bounds))

    def with_split_points(self, split_points: Sequence[int | str]) -> PipelineSplit:
        """The same lowered graph (and compiled kernels) cut elsewhere: cheap manual trials."""
        return _make_split(self.lowered, self.graph, split_points, libs=self.libs)

    def tensors(self) -> list[Tensor]:
        """Tensors kernels pass each other: ``(producer position, consumer positions, bytes)``."""
        return _tensors(self.graph, self.kernels)

    def crossing(self, position: int) -> list[tuple[int, int]]:
        """Tensors a cut before kernel ``position`` sends forward: ``(producer position, bytes)``."""
        return [(p, nbytes) for p, users, nbytes in self.tensors() if p < position <= max(users)]

    def ideal_speedup(self) -> float | None:
        """Sum over max of the stage costs: the pipeline's best throughput gain (auto_split only)."""
        if not self.stage_costs_us:
            return None
        return sum(self.stage_costs_us) / max(self.stage_costs_us)

    def to_dict(self) -> dict:
        return {
            "split_points": self.split_points,
            "stage_kernels": [list(r) for r in self.ranges()],
            "boundary_bytes": self.boundary_bytes,
            "stage_costs_us": self.stage_costs_us,
            "num_kernels": len(self.kernels),
        }

    def describe(self, kernels: bool = False) -> str:
        """One line per stage; with ``kernels``, the kernel order with positions (to pick cuts)."""
        lines = [f"pipeline split into {self.num_stages} stages at kernel positions {self.split_points}"]
        for s, (a, b) in enumerate(self.ranges()):
            cost = f", {self.stage_costs_us[s] / 1e3:.2f} ms" if self.stage_costs_us else ""
            lines.append(
                f"  stage {s}: kernels {a}..{b - 1} ({self.kernels[a].name} .. {self.kernels[b - 1].name}), "
                f"receives {_size(self.boundary_bytes[s])}{cost}"
            )
        if self.stage_costs_us:
            lines.append(f"  ideal speedup (sum / max of stage costs): {self.ideal_speedup():.2f}x")
        if kernels:
            starts = set(self.split_points)
            for k in self.kernels:
                cost = "" if not self.costs_us else f"  {self.costs_us[0][k.position] / 1e3:8.3f} ms"
                mark = "|" if k.position in starts else " "
                lines.append(
                    f"  {mark}{k.position:4d} {k.name:<20} {k.func_name:<40} out {_size(k.output_bytes):>10}{cost}"
                )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _on_device_zero(_info: Any) -> int:
    return 0


def _lower(mod: tvm.IRModule, params: Mapping[str, Any] | None, entry: str, backends: Sequence[Any]):
    """The lowering and the one-device graph, as ``tvm_hetero.build`` makes them for one device."""
    lowered = lower_to_graph(mod, _on_device_zero, 1, dict(params or {}), entry, backends)
    return lowered, insert_copies(reorder_for_devices(lowered.graph), 0)


def _kernel_order(graph: Graph) -> list[Kernel]:
    kernels: list[Kernel] = []
    for nid, node in enumerate(graph.nodes):
        if not node.is_input:
            nbytes = sum(node.output_bytes(i) for i in range(node.num_outputs))
            kernels.append(Kernel(len(kernels), nid, node.name, node.func_name, nbytes))
    return kernels


def _tensors(graph: Graph, kernels: list[Kernel]) -> list[Tensor]:
    """Every kernel output read by another kernel, as (producer position, consumer positions, bytes)."""
    position = {k.node_id: k.position for k in kernels}
    readers: dict[Entry, list[int]] = {}
    for k in kernels:
        for e in graph.nodes[k.node_id].inputs:
            if e.node in position:
                readers.setdefault(e, []).append(k.position)
    return [
        (position[e.node], sorted(set(users)), graph.nodes[e.node].output_bytes(e.index))
        for e, users in readers.items()
    ]


def _resolve_split_points(points: Sequence[int | str], kernels: list[Kernel]) -> list[int]:
    by_name = {k.name: k.position for k in kernels}
    resolved = []
    for p in points:
        if isinstance(p, str):
            if p not in by_name:
                close = [n for n in by_name if p in n or n in p][:5]
                raise ValueError(
                    f"split point {p!r} names no kernel node"
                    + (f" (similar: {close})" if close else "")
                    + "; see split(mod, []).describe(kernels=True)"
                )
            resolved.append(by_name[p])
        elif isinstance(p, (int, np.integer)) and not isinstance(p, bool):
            resolved.append(int(p))
        else:
            raise TypeError(f"a split point is a kernel position (int) or a kernel node name; got {p!r}")
    for a, b in zip([0, *resolved], resolved):
        if b <= a:
            raise ValueError(
                f"split points {list(points)}: need strictly increasing kernel positions in "
                f"(0, {len(kernels)}), each stage non-empty; got {resolved}"
            )
    if resolved and resolved[-1] >= len(kernels):
        raise ValueError(f"split point {resolved[-1]} leaves the last stage empty: {len(kernels)} kernels")
    return resolved


def _make_split(lowered, graph, points, costs_us=None, model=None, libs=None) -> PipelineSplit:
    kernels = _kernel_order(graph)
    resolved = _resolve_split_points(points, kernels)
    tables = model or _SegmentModel(len(kernels), _tensors(graph, kernels))
    bounds = [0, *resolved, len(kernels)]
    received = [int(tables.received[a, b]) for a, b in itertools.pairwise(bounds)]
    return PipelineSplit(
        resolved, kernels, received, None, costs_us, lowered, graph, libs if libs is not None else {}
    )


def split(
    mod: tvm.IRModule,
    split_points: Sequence[int | str],
    params: Mapping[str, Any] | None = None,
    *,
    entry: str = "main",
    backends: Sequence[Any] = (),
) -> PipelineSplit:
    """Cut ``mod`` at ``split_points``: kernel positions or kernel node names where stages 1.. begin.

    ``split(mod, [])`` is one stage; its ``describe(kernels=True)`` lists the kernel order.
    ``params`` and ``backends`` are as in ``tvm_hetero.build`` (they shape the graph).
    """
    lowered, graph = _lower(mod, params, entry, backends)
    return _make_split(lowered, graph, split_points)


# ---- the cost model and the dynamic program ----------------------------------------------------
class _SegmentModel:
    """Bytes a stage covering kernel positions ``[a, b)`` receives / sends, for every a < b.

    ``received[a, b]``: tensors produced before ``a`` that some kernel in ``[a, b)`` reads.
    ``sent[a, b]``: tensors produced in ``[a, b)`` that some kernel at ``b`` or later reads.
    Both are sums of rectangles in (a, b), built with a 2-D difference array in O(n^2 + uses).
    """

    def __init__(self, n: int, tensors: Sequence[Tensor]):
        self.n = n
        received = np.zeros((n + 2, n + 2))
        sent = np.zeros((n + 2, n + 2))
        for producer, consumers, nbytes in tensors:
            later = sorted({c for c in consumers if c > producer})
            if not later:
                continue
            _add_rectangle(sent, (0, producer), (producer + 1, later[-1]), nbytes)
            previous = producer
            for c in later:  # a in (previous, c]: the first reader at or after a is c, so b > c
                _add_rectangle(received, (previous + 1, c), (c + 1, n), nbytes)
                previous = c
        self.received = received.cumsum(0).cumsum(1)[: n + 1, : n + 1]
        self.sent = sent.cumsum(0).cumsum(1)[: n + 1, : n + 1]

    def stage_times(self, costs: Sequence[float], copy_bytes_per_us: float | None) -> np.ndarray:
        """``T[a, b]`` (µs) of a stage with per-kernel ``costs``; inf where ``b <= a``."""
        prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
        times = prefix[None, :] - prefix[:, None]
        if copy_bytes_per_us:
            times = times + (self.received + self.sent) / copy_bytes_per_us
        times[np.tril_indices(self.n + 1)] = np.inf
        return times


def _add_rectangle(
    diff: np.ndarray, a_range: tuple[int, int], b_range: tuple[int, int], value: float
) -> None:
    (a0, a1), (b0, b1) = a_range, b_range
    if a0 > a1 or b0 > b1:
        return
    diff[a0, b0] += value
    diff[a0, b1 + 1] -= value
    diff[a1 + 1, b0] -= value
    diff[a1 + 1, b1 + 1] += value


def choose_split_points(
    stage_costs: Sequence[Sequence[float]],
    tensors: Sequence[Tensor],
    *,
    tolerance: float = 0.02,
    copy_bytes_per_us: float | None = DEFAULT_COPY_BYTES_PER_US,
) -> list[int]:
    """Split points for ``len(stage_costs)`` stages over ``n`` kernels (see the module docstring).

    ``stage_costs[s][i]``: time of kernel ``i`` on stage ``s``'s device. ``tensors``: (producer
    position, consumer positions, bytes) of the tensors kernels pass each other. Minimises the
    bottleneck stage time; among cuts within ``tolerance`` of it, the bytes stages receive.
    """
    model = _SegmentModel(len(stage_costs[0]), tensors)
    return _choose(model, [model.stage_times(c, copy_bytes_per_us) for c in stage_costs], tolerance)


def _choose(model: _SegmentModel, times: list[np.ndarray], tolerance: float) -> list[int]:
    num_stages, n = len(times), model.n
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot cut {n} kernels into {num_stages} non-empty stages")
    # Step 1: best[s][b] = smallest bottleneck of stages 0..s covering kernels [0, b).
    best = np.full((num_stages, n + 1), np.inf)
    best[0] = times[0][0]
    for s in range(1, num_stages):
        for b in range(s + 1, n + 1):
            best[s, b] = np.min(np.maximum(best[s - 1, :b], times[s][:b, b]))
    limit = best[-1, n] * (1 + tolerance) * (1 + 1e-12)
    # Step 2: fewest received bytes with every stage within the limit; ties to the smaller bottleneck.
    score: list[list[tuple[float, float] | None]] = [[None] * (n + 1) for _ in range(num_stages)]
    came_from = np.zeros((num_stages, n + 1), dtype=int)
    for b in range(1, n + 1):
        if times[0][0, b] <= limit:
            score[0][b] = (0.0, times[0][0, b])
    for s in range(1, num_stages):
        for b in range(s + 1, n + 1):
            for a in range(s, b):
                prev, t = score[s - 1][a], times[s][a, b]
                if prev is None or t > limit:
                    continue
                candidate = (prev[0] + model.received[a, b], max(prev[1], t))
                if score[s][b] is None or candidate < score[s][b]:
                    score[s][b], came_from[s, b] = candidate, a
    points, b = [], n
    for s in range(num_stages - 1, 0, -1):
        b = int(came_from[s, b])
        points.append(b)
    return points[::-1]


# ---- measuring ---------------------------------------------------------------------------------
def configure_thread(cores: Sequence[int] = (), num_threads: int = 0) -> None:
    """Pin the calling thread to ``cores`` and size its TVM thread pool, as a pipeline stage's worker.

    The same calls as the C++ worker (``runtime.config_threadpool`` with mode -3, then
    ``sched_setaffinity`` of the thread); use it in a thread of your own, never the main thread.
    """
    cores, num_threads = [int(c) for c in cores], int(num_threads)
    if not cores and not num_threads:
        return
    cpus = cores or sorted(os.sched_getaffinity(0))
    tvm_ffi.get_global_func("runtime.config_threadpool")(
        _SHARE_ALL_CORES, num_threads, [str(c) for c in cpus]
    )
    if cores:
        os.sched_setaffinity(0, cores)


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


def _sample_inputs(graph: Graph, names: Sequence[str], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {n.name: (n.shapes[0], n.dtypes[0]) for n in graph.nodes if n.is_input}
    values = {}
    for name in names:
        shape, dtype = shapes[name]
        if np.dtype(dtype).kind == "f":
            values[name] = rng.standard_normal(shape).astype(dtype)
        else:
            values[name] = np.zeros(shape, dtype)
    return values


def measure_kernels(
    artifact: Artifact,
    device: tvm.runtime.Device,
    cores: Sequence[int] = (),
    num_threads: int = 0,
    rounds: int = 5,
) -> dict[int, float]:
    """Median µs of each kernel node of ``artifact`` on ``device``, in a thread set up like a stage's."""
    inputs = _sample_inputs(_graph_of(artifact), artifact.input_names)

    def measure() -> dict[int, float]:
        runtime = artifact.create([device])
        runtime.set_input(**inputs)
        runtime.run()  # warm-up: first-call setup (oneDNN primitives, caches)
        samples: dict[int, list[float]] = {}
        for _ in range(max(int(rounds), 1)):
            for node in runtime.profile(repeat=1)["nodes"]:
                samples.setdefault(int(node["node_id"]), []).append(float(node["time_us"]))
        return {nid: statistics.median(times) for nid, times in samples.items()}

    return run_in_thread(measure, cores, num_threads)


def _graph_of(artifact: Artifact) -> Graph:
    """Input nodes (names, shapes, dtypes) of an artifact's graph JSON, enough for sample inputs."""
    data = artifact.graph
    shapes, dtypes = data["attrs"]["shape"][1], data["attrs"]["dltype"][1]
    row_ptr = data["node_row_ptr"]
    nodes = [
        Node(n["name"], op=n["op"], shapes=[tuple(shapes[row_ptr[i]])], dtypes=[dtypes[row_ptr[i]]])
        for i, n in enumerate(data["nodes"])
        if n["op"] == "null"
    ]
    return Graph(nodes, [])


def auto_split(
    mod: tvm.IRModule,
    num_stages: int,
    targets: StageSpec | list[StageSpec] = "llvm",
    params: Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    rounds: int = 5,
    tolerance: float = 0.02,
    copy_bytes_per_us: float | None = DEFAULT_COPY_BYTES_PER_US,
    entry: str = "main",
    backends: Sequence[Any] = (),
    progress: Callable[[str], None] | None = None,
) -> PipelineSplit:
    """Split points for ``num_stages`` stages balancing measured kernel times (module docstring).

    Parameters
    ----------
    targets : one stage spec for every stage, or a list of one per stage: ``(device, target)``,
        a device (``tvm.cpu(0)``, ``"cuda:0"``) or a target (``"llvm"``).
    options : pipeline options (``{"stages": [{"cores": [0], "num_threads": 1}, ...]}``); each
        stage's kernels are measured in a thread configured as that stage's worker will be.
    rounds : profile runs per distinct stage device; each kernel's time is the median.
    tolerance : relative slack on the bottleneck traded for fewer boundary bytes.
    copy_bytes_per_us : speed of a boundary copy in the model (None: copies are free).
    """
    say = progress or (lambda _msg: None)
    specs = _stage_specs(targets, int(num_stages))
    per_stage = _stage_options(options, len(specs))
    say("lowering")
    lowered, graph = _lower(mod, params, entry, backends)
    kernels = _kernel_order(graph)
    model = _SegmentModel(len(kernels), _tensors(graph, kernels))
    graph_json = planned_json(graph)
    libs: dict[str, tvm.runtime.Module] = {}
    measured: dict[tuple, list[float]] = {}
    stage_costs = []
    for s, (dev, target) in enumerate(specs):
        cores, threads = per_stage[s].get("cores", []), int(per_stage[s].get("num_threads", 0))
        key = (device_name(dev), str(target), tuple(cores), threads)
        if key not in measured:
            if str(target) not in libs:
                say(f"compiling {len(lowered.kernel_devices)} kernels for {target.kind.name}")
                libs[str(target)] = compile_kernels(lowered, [target])
            # External backends keep state by address (oneDNN caches reordered weights by the
            # weight's address): measure on a library of its own, so that the freed measuring
            # runtime leaves nothing behind for the pipeline's runtimes to stumble on.
            lib = compile_kernels(lowered, [target]) if lowered.regions else libs[str(target)]
            artifact = Artifact(graph_json, lib, lowered.params, [dev], list(lowered.input_names))
            say(f"measuring {len(kernels)} kernels on {device_name(dev)} cores {cores} threads {threads}")
            by_node = measure_kernels(artifact, dev, cores, threads, rounds)
            measured[key] = [by_node[k.node_id] for k in kernels]
        stage_costs.append(measured[key])
    times = [model.stage_times(c, copy_bytes_per_us) for c in stage_costs]
    points = _choose(model, times, tolerance)
    result = _make_split(lowered, graph, points, stage_costs, model)
    bounds = [0, *points, len(kernels)]
    result.stage_costs_us = [float(times[s][a, b]) for s, (a, b) in enumerate(itertools.pairwise(bounds))]
    result.libs = libs
    return result


# ---- stage graphs ------------------------------------------------------------------------------
def _entry_name(graph: Graph, e: Entry) -> str:
    return graph.nodes[e.node].name + (f".{e.index}" if e.index else "")


def stage_graphs(
    graph: Graph,
    kernels: list[Kernel],
    ranges: list[tuple[int, int]],
    input_names: Sequence[str],
    param_names: set[str],
) -> tuple[list[Graph], dict]:
    """One graph per stage (all on device 0) and the wiring (docs/pipeline.md) that joins them.

    A stage graph holds the stage's kernels in their original order, one input node per
    pipeline input or parameter they read, and one per tensor they read from an earlier stage
    (named after its producer, ``name.i`` for output ``i > 0``). Its outputs are what later
    stages read and the pipeline outputs it produces.
    """
    stage_of = {k.node_id: s for s, (a, b) in enumerate(ranges) for k in kernels[a:b]}
    num_stages = len(ranges)
    last = num_stages - 1
    # Stage outputs: entries read by a later stage, then graph heads, in entry order per stage.
    exported: list[list[Entry]] = [[] for _ in ranges]
    for nid, s in sorted(stage_of.items()):
        for e in graph.nodes[nid].inputs:
            if e.node in stage_of and stage_of[e.node] < s and e not in exported[stage_of[e.node]]:
                exported[stage_of[e.node]].append(e)
    for e in graph.heads:
        s = stage_of.get(e.node, last)
        if e not in exported[s]:
            exported[s].append(e)
    for outs in exported:
        outs.sort()
    used_inputs = {e.node for nid in stage_of for e in graph.nodes[nid].inputs}
    graphs, wired = [], []
    for s, (a, b) in enumerate(ranges):
        members = {k.node_id for k in kernels[a:b]}
        reads = [e for nid in sorted(members) for e in graph.nodes[nid].inputs]
        nulls = {e.node for e in [*reads, *exported[s]] if graph.nodes[e.node].is_input}
        if s == 0:  # pipeline inputs that no kernel reads still need a stage
            nulls |= {i for i, n in enumerate(graph.nodes) if n.name in input_names and i not in used_inputs}
        nodes: list[Node] = []
        where: dict[Entry, Entry] = {}  # original entry -> entry in the stage graph
        inputs: dict[str, Any] = {}
        params: list[str] = []
        for e in sorted({e for e in reads if e.node in stage_of and e.node not in members}):
            producer, p = graph.nodes[e.node], stage_of[e.node]
            nodes.append(
                Node(
                    _entry_name(graph, e),
                    op="null",
                    shapes=[producer.shapes[e.index]],
                    dtypes=[producer.dtypes[e.index]],
                )
            )
            where[e] = Entry(len(nodes) - 1, 0)
            inputs[nodes[-1].name] = {"stage": p, "output": exported[p].index(e)}
        for nid, node in enumerate(graph.nodes):
            if nid not in nulls and nid not in members:
                continue
            nodes.append(dataclasses.replace(node, device=0, inputs=[where[e] for e in node.inputs]))
            where.update({Entry(nid, j): Entry(len(nodes) - 1, j) for j in range(node.num_outputs)})
            if node.is_input and node.name in param_names:
                params.append(node.name)
            elif node.is_input:
                inputs[node.name] = node.name
        stage_graph = Graph(nodes, [where[e] for e in exported[s]])
        stage_graph.validate()
        graphs.append(stage_graph)
        wired.append({"name": f"stage{s}", "inputs": inputs, "params": params})
    outputs = []
    for e in graph.heads:
        s = stage_of.get(e.node, last)
        outputs.append({"stage": s, "output": exported[s].index(e)})
    return graphs, {"inputs": list(input_names), "stages": wired, "outputs": outputs}


# ---- build, artifact, load ---------------------------------------------------------------------
def _compile_for_stages(plan: PipelineSplit, targets: list[tvm.target.Target]) -> tuple[Any, list[dict]]:
    """One library for every stage, and per stage the kernel renames it needs.

    With one target (the usual case) this is the library the unsplit graph uses, compiled once
    (or taken from auto_split's measuring). With several, each target compiles the kernels of its
    stages; a kernel already compiled for an earlier target gets a suffixed copy (``name_t1``).
    """
    lowered = plan.lowered
    names = list(dict.fromkeys(str(t) for t in targets))
    if len(names) == 1:
        lib = plan.libs.get(names[0]) or compile_kernels(lowered, [targets[0]])
        plan.libs[names[0]] = lib
        return lib, [{} for _ in targets]
    group = [names.index(str(t)) for t in targets]
    used: list[set[str]] = [set() for _ in names]
    for s, (a, b) in enumerate(plan.ranges()):
        used[group[s]].update(k.func_name for k in plan.kernels[a:b] if k.func_name in lowered.kernel_devices)
    renames: list[dict[str, str]] = [{} for _ in names]
    funcs, devices, seen = {}, {}, set()
    for g, kernel_names in enumerate(used):
        for name in sorted(kernel_names):
            new = f"{name}_t{g}" if name in seen else name
            renames[g][name] = new
            funcs[tvm.ir.GlobalVar(new)] = lowered.kernels[name].with_attr("global_symbol", new)
            devices[new] = g
        seen |= kernel_names
    by_target = dataclasses.replace(
        lowered, kernels=tvm.IRModule(funcs), kernel_devices=devices, num_devices=len(names)
    )
    lib = compile_kernels(by_target, [targets[group.index(g)] for g in range(len(names))])
    return lib, [{k: v for k, v in renames[group[s]].items() if k != v} for s in range(len(targets))]


def build(
    mod: tvm.IRModule,
    stages: StageSpec | list[StageSpec],
    split_points: Sequence[int | str] | int | PipelineSplit | None = None,
    params: Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    entry: str = "main",
    backends: Sequence[Any] = (),
    rounds: int = 5,
    tolerance: float = 0.02,
    progress: Callable[[str], None] | None = None,
) -> PipelineArtifact:
    """Compile ``mod`` as a pipeline of stages: stage graphs, one library, params and wiring.

    Parameters
    ----------
    stages : a list with one stage spec per stage (``(device, target)``, a device such as
        ``"cpu:0"``, or a target such as ``"llvm"``), or one spec for every stage.
    split_points : kernel positions or names where stages 1.. begin (:func:`split`); an int, the
        number of stages, or None (one per entry of ``stages``) to choose them with
        :func:`auto_split`; or a :class:`PipelineSplit` of the same module and params.
    options : pipeline options kept as the default of :meth:`PipelineArtifact.create` and used to
        measure for auto_split: ``{"queue_capacity": 2, "stages": [{"cores": [0], "num_threads": 1}]}``.
    rounds, tolerance : for auto_split.
    """
    say = progress or (lambda _msg: None)
    if isinstance(split_points, PipelineSplit):
        plan = split_points
        specs = _stage_specs(stages, plan.num_stages)
    elif split_points is None or isinstance(split_points, int):
        specs = _stage_specs(stages, split_points)
        plan = auto_split(
            mod,
            len(specs),
            list(specs),
            params,
            options=options,
            rounds=rounds,
            tolerance=tolerance,
            entry=entry,
            backends=backends,
            progress=say,
        )
    else:
        specs = _stage_specs(stages, len(split_points) + 1)
        say("lowering")
        plan = split(mod, split_points, params, entry=entry, backends=backends)
    _stage_options(options, len(specs))  # checks the number of entries
    lowered, graph = plan.lowered, plan.graph
    if lowered is None or graph is None:
        raise ValueError("the PipelineSplit carries no lowered graph (it was loaded); split the module again")
    targets = [t for _, t in specs]
    say(f"compiling kernels for {len(set(map(str, targets)))} target(s)")
    lib, renames = _compile_for_stages(plan, targets)
    graphs, wiring = stage_graphs(
        graph, plan.kernels, plan.ranges(), lowered.input_names, set(lowered.params)
    )
    jsons = []
    for stage_graph, rename in zip(graphs, renames):
        for node in stage_graph.nodes:
            node.func_name = rename.get(node.func_name, node.func_name)
        jsons.append(planned_json(stage_graph))
    same_target = len({str(t) for t in targets}) == 1
    return PipelineArtifact(
        stage_graph_jsons=jsons,
        lib=lib,
        params=dict(lowered.params),
        wiring=wiring,
        stage_devices=[dev for dev, _ in specs],
        stage_targets=[str(t) for t in targets],
        input_names=list(lowered.input_names),
        options=json.loads(json.dumps(dict(options or {}))),
        unsplit_graph_json=planned_json(graph) if same_target else None,
        split=plan.to_dict(),
    )


@dataclass
class PipelineArtifact:
    """A compiled pipeline: run it with :meth:`create`, save it with :meth:`export`."""

    #: The graph of each stage (docs/graph-format.md), in pipeline order.
    stage_graph_jsons: list[str]
    #: Every stage's kernels.
    lib: tvm.runtime.Module
    #: Parameter and constant values by name; each stage gets those it declares in the wiring.
    params: dict[str, np.ndarray]
    #: How stages connect (docs/pipeline.md, wiring schema).
    wiring: dict
    stage_devices: list[tvm.runtime.Device]
    stage_targets: list[str]
    input_names: list[str]
    #: Default pipeline options of :meth:`create` (queue capacity, per-stage cores and threads).
    options: dict = field(default_factory=dict)
    #: The whole one-device graph over the same library (None when stage targets differ).
    unsplit_graph_json: str | None = None
    #: The split: points, kernels per stage, boundary bytes, modelled stage costs.
    split: dict | None = None

    @property
    def num_stages(self) -> int:
        return len(self.stage_graph_jsons)

    def create(
        self,
        stage_devices: Sequence[Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> PipelineModule:
        """A running :class:`~tvm_hetero.pipeline_runtime.PipelineModule` with the params set.

        ``stage_devices`` defaults to the build's; ``options`` (``{"queue_capacity": C, "stages":
        [{"cores": [0], "num_threads": 1}, ...]}``) to the build's options.
        """
        devices = (
            [parse_device(d) for d in stage_devices] if stage_devices is not None else self.stage_devices
        )
        if len(devices) != self.num_stages:
            raise ValueError(f"{len(devices)} stage devices for {self.num_stages} stages")
        pipe = pipeline_runtime.create(
            self.stage_graph_jsons,
            self.lib,
            devices,
            self.wiring,
            self.options if options is None else options,
        )
        try:
            for s, stage in enumerate(self.wiring["stages"]):
                if stage["params"]:
                    pipe.set_params(s, {name: self.params[name] for name in stage["params"]})
        except Exception:
            pipe.close()
            raise
        return pipe

    def unsplit(self, device: Any = None) -> Artifact:
        """The unsplit graph with the same kernels, as an :class:`~tvm_hetero.Artifact` (one device)."""
        if self.unsplit_graph_json is None:
            raise ValueError("stages have different targets: no single graph runs every kernel")
        dev = parse_device(device) if device is not None else self.stage_devices[0]
        return Artifact(self.unsplit_graph_json, self.lib, self.params, [dev], list(self.input_names))

    def report(self) -> str:
        """One line per stage: device, target, kernel range, bytes received, modelled cost."""
        info = self.split or {}
        costs = info.get("stage_costs_us")
        lines = [
            f"tvm-hetero pipeline: {self.num_stages} stages, split at kernels {info.get('split_points')}"
        ]
        for s, stage in enumerate(self.wiring["stages"]):
            a, b = info["stage_kernels"][s] if info else (0, 0)
            received = info["boundary_bytes"][s] if info else 0
            cost = f", modelled {costs[s] / 1e3:.2f} ms" if costs else ""
            lines.append(
                f"  stage {s} {stage['name']:<8} {device_name(self.stage_devices[s]):<8} "
                f"{_target_label(self.stage_targets[s]):<8} kernels {a}..{b - 1}, receives {_size(received)}, "
                f"params {len(stage['params'])}{cost}"
            )
        if costs:
            lines.append(f"  ideal speedup (sum / max of stage costs): {sum(costs) / max(costs):.2f}x")
        return "\n".join(lines)

    def export(self, path: str | os.PathLike) -> Path:
        """Write stage graphs, lib.so, params.bin, the unsplit graph and pipeline.json into ``path``."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        stage_files = [f"stage{s}.json" for s in range(self.num_stages)]
        for name, graph_json in zip(stage_files, self.stage_graph_jsons):
            (out / name).write_text(graph_json)
        if self.unsplit_graph_json is not None:
            (out / UNSPLIT_GRAPH_FILE).write_text(self.unsplit_graph_json)
        self.lib.export_library(str(out / LIB_FILE))
        tensors = {k: tvm.runtime.tensor(v) for k, v in self.params.items()}
        (out / PARAMS_FILE).write_bytes(bytes(tvm.runtime.save_param_dict(tensors)))
        manifest = {
            "format": FORMAT,
            "stage_graphs": stage_files,
            "stage_devices": [[d.dlpack_device_type(), d.index] for d in self.stage_devices],
            "stage_device_names": [device_name(d) for d in self.stage_devices],
            "stage_targets": self.stage_targets,
            "inputs": self.input_names,
            "wiring": self.wiring,
            "options": self.options,
            "unsplit_graph": UNSPLIT_GRAPH_FILE if self.unsplit_graph_json is not None else None,
            "split": self.split,
        }
        (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
        return out


def load(path: str | os.PathLike) -> PipelineArtifact:
    """Load a pipeline written by :meth:`PipelineArtifact.export`."""
    src = Path(path)
    if not (src / MANIFEST_FILE).is_file():
        raise FileNotFoundError(f"{src} is not a tvm-hetero pipeline: missing {MANIFEST_FILE}")
    manifest = artifact_files.read_json(src / MANIFEST_FILE)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ValueError(f"{src / MANIFEST_FILE}: format {found!r}, expected {FORMAT!r}")
    needed = [*manifest["stage_graphs"], LIB_FILE, PARAMS_FILE] + (
        [manifest["unsplit_graph"]] if manifest["unsplit_graph"] else []
    )
    missing = [f for f in needed if not (src / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{src} is not a complete tvm-hetero pipeline: missing {', '.join(missing)}")
    # Every size in params.bin checked against the bytes present; errors name the file.
    params = artifact_files.read_params((src / PARAMS_FILE).read_bytes(), str(src / PARAMS_FILE))
    unsplit = manifest["unsplit_graph"]
    return PipelineArtifact(
        stage_graph_jsons=[artifact_files.read_text(src / f) for f in manifest["stage_graphs"]],
        lib=tvm.runtime.load_module(str(src / LIB_FILE)),
        params=params,
        wiring=manifest["wiring"],
        stage_devices=[tvm.runtime.device(t, i) for t, i in manifest["stage_devices"]],
        stage_targets=list(manifest["stage_targets"]),
        input_names=list(manifest["inputs"]),
        options=manifest.get("options") or {},
        unsplit_graph_json=(src / unsplit).read_text() if unsplit else None,
        split=manifest.get("split"),
    )
