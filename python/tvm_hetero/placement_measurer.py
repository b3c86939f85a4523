"""Timing for automatic placement, on the runtime itself (:class:`RuntimeMeasurer`).

Kernels (and backend regions, through their backend's codegen) are timed the way they will run:
the kernels to time on the local devices (of one target) become one graph of independent nodes
(each reading inputs of its own, filled with seeded random values), each node on its device, run
by the graph runtime with every device's executor settings (``device_options``: a thread pinned
to its cores with its own TVM thread pool) and concurrent execution, so the devices compute at the
same time and contend for the machine (shared caches, memory bandwidth, and other processes'
load, which cannot move to an idle core) as they will when the placed graph runs; the runtime's
step trace gives each kernel's time. Timed one device after the other, a machine with one busy
foreign process showed each core idle in turn and predicted splits 2x faster than they ran.

:meth:`RuntimeMeasurer.kernel_seconds_alone` times each device's kernels with no other device
computing: the cost model uses those for a placement on one device (on a machine that other
processes load, the difference is large: one busy foreign process makes a core of ours share).

1. A first pass runs every kernel once after a warm-up run. A kernel taking ``LONG_SECONDS`` or
   more keeps that time once a second sample, taken after the timed runs below, agrees with it:
   those are the variants that lose by far (an untuned TVM convolution next to its oneDNN region),
   and timing them many times would be most of the measuring time.
2. The others are timed warm: each is called ``WARM_REPEATS`` times right before the call timed
   (in a graph a kernel reads what its producer just wrote, and weights stay in cache between
   inferences), the median over several runs.

The rule for what enters the cost cache: **a time is kept only when its re-measurement agrees with
it** -- two estimates taken apart in time within ``AGREE_RATIO`` of each other (plus a few microseconds): the two samples of a
long kernel, or the medians of the first and of the second half of a kernel's timed runs. A time
that disagrees (a burst of load, another process or runtime spinning on the cores, a descheduled
thread of a team) is measured again, up to ``CONFIRM_ROUNDS`` rounds of timed runs; one that never
agrees is used for this build only (the lowest estimate seen: load only ever adds time) and
:meth:`RuntimeMeasurer.unconfirmed` names it, so that it never enters the cache. Kept unchecked, one
sample inflated 80x by a descheduled thread made a rebuild choose TVM kernels over oneDNN blocks
2.5x faster, and kept choosing them from the cache.

A remote device (behind a TVM RPC session) has its kernels timed in its own process
(``time_evaluator`` through the session) and the latency of one call into it measured apart
(:meth:`RuntimeMeasurer.call_latency`). Copy costs between devices without shared memory (a remote
one included) are fitted (fixed + bytes/s) from copies of two sizes; the hand-off between two CPU devices (:meth:`RuntimeMeasurer.sync_latency`) from a chain of
tiny kernels alternating between them.

The compiler hands this object to its placement step; the compiler itself never imports it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from .compiler.autoplace.kernel_times import MeasureJob, compile_for_target, compile_jobs
from .devices import is_remote, name_of, needs_completion_wait, shares_memory
from .graph import Entry, Graph, Node
from .runtime import graph_runtime
from .runtime.measure import wall_times
from .runtime.rpc import upload_library
from .sample_inputs import sample_value

#: Aim for this much traced time per device, within [MIN_RUNS, MAX_RUNS] runs (at least two per
#: half: the halves' medians confirm each other).
TARGET_SECONDS, MIN_RUNS, MAX_RUNS = 0.3, 4, 25
#: Two estimates of one time agree when the larger is at most this multiple of the smaller, plus
#: ``AGREE_SLACK`` seconds (a few microseconds of jitter on a tiny kernel change no placement).
AGREE_RATIO, AGREE_SLACK = 1.25, 10e-6
#: Rounds of timed runs a time gets to be confirmed; after them it is used unconfirmed (not cached).
CONFIRM_ROUNDS = 3
#: A kernel this long in the first pass keeps that time (one sample): such kernels are the losing
#: variants (an untuned TVM convolution next to its oneDNN region), and timing them again would
#: make most of the measuring time.
LONG_SECONDS = 2e-3
#: Calls of a kernel right before the one timed: in a graph a kernel reads what its producer just
#: wrote, and its weights stay in cache from one inference to the next; timed cold, after other
#: kernels swept the cache, small kernels measured up to twice their time in the graph.
WARM_REPEATS = 1
COPY_SIZES = (4 << 10, 4 << 20)
#: Float inputs of timed kernels: uniform in [-1, 1] (no NaN, no overflow; integer inputs are
#: zeros, an index in range of any axis).
FLOATS = "uniform"
#: Timing of a remote kernel: runs, each at least this long (the kernel looped remotely).
REMOTE_REPEATS, REMOTE_MIN_MS = 5, 10
#: Kernels in the chain that times a hand-off between two devices, and runs of it.
SYNC_CHAIN, SYNC_RUNS = 21, 15
#: Steps of the busy kernel the hand-off chain runs (a few hundred microseconds).
BUSY_STEPS = 100000


def _busy_kernel() -> tvm.IRModule:
    """``busy(x) -> y``, (1,) -> (1,), computing for a few hundred microseconds: long enough that an
    executor waiting for it goes to sleep, as it does in a graph."""
    x = tvm.te.placeholder((1,), "float32", name="x")
    k = tvm.te.reduce_axis((0, BUSY_STEPS), name="k")
    y = tvm.te.compute((1,), lambda i: tvm.te.sum(tvm.tirx.sin(x[i] + k.astype("float32")), axis=k), name="y")
    return tvm.IRModule({"busy": tvm.te.create_prim_func([x, y]).with_attr("global_symbol", "busy")})


def _tiny_kernel() -> tvm.IRModule:
    """``tiny(x) = x + 1`` on one float: a kernel whose run is all hand-off."""
    x = tvm.te.placeholder((1,), "float32", name="x")
    y = tvm.te.compute((1,), lambda i: x[i] + 1.0, name="y")
    return tvm.IRModule({"tiny": tvm.te.create_prim_func([x, y]).with_attr("global_symbol", "tiny")})


def _no_tick(_run: int, _runs: int) -> None:
    """A progress callback that draws nothing."""


def _agree(a: float, b: float) -> bool:
    """Two estimates of one time agree: the larger within ``AGREE_RATIO`` of the smaller (plus
    ``AGREE_SLACK``)."""
    return math.isfinite(a) and math.isfinite(b) and max(a, b) <= AGREE_RATIO * min(a, b) + AGREE_SLACK


class RuntimeMeasurer:
    """Times kernels and copies on this machine's devices (see the module docstring)."""

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        self.say = progress or (lambda _msg: None)
        #: Draws a bar while kernels are timed, where the progress object has one (tvm_hetero.progress).
        self._count = getattr(progress, "count", None)
        self.rng = np.random.default_rng(0)
        self._alive: list = []  # the measuring runtimes, kept while their trace functions are used
        self._alone: dict[int, list[float]] = {}  # jobs the last kernel_seconds measured alone
        self._unconfirmed: dict[int, set[int]] = {}  # per job (by id): calls whose time never agreed
        self._timed_with: dict[int, dict | None] = {}  # per device position: the options kernels ran with

    def kernel_seconds(self, jobs: Sequence[MeasureJob]) -> list[list[float]]:
        """Every job's kernels (see the module docstring): local devices together, remote ones
        through their sessions."""
        remote = [is_remote(job.device) for job in jobs]
        local_jobs = [job for job, far in zip(jobs, remote) if not far]
        self._timed_with.update({job.position: job.options for job in local_jobs})
        far_times = {id(job): self._remote_seconds(job) for job, far in zip(jobs, remote) if far}
        near_times = iter(self._local_seconds(local_jobs) if local_jobs else [])
        result = [far_times[id(job)] if far else next(near_times) for job, far in zip(jobs, remote)]
        self._alone = {id(job): times for job, times, far in zip(jobs, result, remote)
                       if far or len(local_jobs) == 1}
        return result

    def kernel_seconds_alone(self, jobs: Sequence[MeasureJob]) -> list[list[float]]:
        """Every job's kernels with no other device computing: each local device on its own (a
        device measured alone already by :meth:`kernel_seconds` keeps those times; remote devices
        too, their kernels run in their own process)."""
        result = []
        for job in jobs:
            kept = self._alone.get(id(job))
            result.append(kept if kept is not None else self._local_seconds([job])[0])
        return result

    def unconfirmed(self, job: MeasureJob) -> set[int]:
        """Indices of ``job``'s calls whose last time was never confirmed by a re-measurement (see
        the module docstring): the caller uses them for this build and keeps them out of the cache."""
        return set(self._unconfirmed.get(id(job), ()))

    def _local_seconds(self, jobs: Sequence[MeasureJob]) -> list[list[float]]:
        """Local jobs of one target together, each device on its own executor at the same time."""
        by_target: dict[str, list[int]] = {}
        for j, job in enumerate(jobs):
            by_target.setdefault(str(job.target), []).append(j)
        result: list[list[float]] = [[] for _ in jobs]
        try:
            for members in by_target.values():
                group = [jobs[j] for j in members]
                for j, times in zip(members, self._together(group)):
                    result[j] = times
        finally:
            self._alive.clear()  # the measuring runtimes go once timed
        return result

    def _tick(self, done: float, total: int, jobs: Sequence[MeasureJob], stage: str) -> None:
        if self._count is not None:
            where = ", ".join(name_of(job.device) for job in jobs)
            self._count(int(done), total, f"{int(done)}/{total} kernels timed on {where} ({stage})")

    def _together(self, jobs: Sequence[MeasureJob]) -> list[list[float]]:
        total = sum(len(job.calls) for job in jobs)
        self._tick(0, total, jobs, "compiling")
        lib = compile_jobs(jobs)
        self._tick(0, total, jobs, "first pass")
        first_trace, first_ids = self._prepare(jobs, lib, [range(len(job.calls)) for job in jobs], 0)
        first_trace(1)  # warm-up (a backend builds its primitives on the first call)
        rough = self._sample(first_trace, first_ids)
        long_ones = [[i for i, t in enumerate(times) if t >= LONG_SECONDS] for times in rough]
        short = [[i for i, t in enumerate(times) if t < LONG_SECONDS] for times in rough]
        final = total - sum(len(s) for s in short)  # long kernels keep their first time once confirmed
        times = [list(t) for t in rough]
        unconfirmed: list[set[int]] = [set() for _ in jobs]

        def timed_run(run: int, runs: int) -> None:
            self._tick(final + (total - final) * run / runs, total, jobs, f"run {run}/{runs}")

        self._tick(final, total, jobs, "timed runs")
        self._confirm(jobs, lib, short, times, unconfirmed, timed_run)
        # The long kernels' second sample, apart in time from the first: agreeing, the lower stays.
        again = self._sample(first_trace, first_ids)
        recheck = []
        for j, picked in enumerate(long_ones):
            for i in picked:
                times[j][i] = min(rough[j][i], again[j][i])
            recheck.append([i for i in picked if not _agree(rough[j][i], again[j][i])])
        if any(recheck):
            self._confirm(jobs, lib, recheck, times, unconfirmed)
        for job, calls in zip(jobs, unconfirmed):
            self._unconfirmed[id(job)] = calls
        return times

    def _sample(self, trace, kernel_ids) -> list[list[float]]:
        """One traced run: every job's kernel time (inf where the trace has none)."""
        times = self._spans(trace, [nid for ids in kernel_ids for nid in ids])
        return [[times[nid][0] if times[nid] else math.inf for nid in ids] for ids in kernel_ids]

    def _confirm(self, jobs: Sequence[MeasureJob], lib: tvm.runtime.Module, pending: list[list[int]],
                 times: list[list[float]], unconfirmed: list[set[int]],
                 after_run: Callable[[int, int], None] = lambda _run, _runs: None) -> None:
        """Timed runs of every job's calls ``pending`` until each time is confirmed (its halves'
        medians agree), at most ``CONFIRM_ROUNDS`` rounds; writes ``times`` and, for the calls
        never confirmed (their lowest median written), ``unconfirmed``."""
        lowest: dict[tuple[int, int], float] = {}
        for _round in range(CONFIRM_ROUNDS):
            if not any(pending):
                return
            trace, kernel_ids = self._prepare(jobs, lib, pending, WARM_REPEATS)
            estimates = self._timed_runs(trace, kernel_ids, jobs, pending, after_run)
            after_run = _no_tick  # the bar counts the first round only
            for j, (picked, found) in enumerate(zip(pending, estimates)):
                for i, (median, first_half, second_half) in zip(picked, found):
                    if _agree(first_half, second_half):
                        times[j][i] = median
                        unconfirmed[j].discard(i)
                    else:
                        times[j][i] = lowest[(j, i)] = min(lowest.get((j, i), math.inf), median)
                        unconfirmed[j].add(i)
            pending = [[i for i in picked if i in unconfirmed[j]] for j, picked in enumerate(pending)]

    @staticmethod
    def _spans(trace, node_ids) -> dict[int, list[float]]:
        times: dict[int, list[float]] = {nid: [] for nid in node_ids}
        for span in json.loads(trace(1))["runs"][-1]:
            if span["node"] in times and span["kind"] == "kernel":
                times[span["node"]].append((span["end_us"] - span["start_us"]) * 1e-6)
        return times

    def _timed_runs(self, trace, kernel_ids, jobs: Sequence[MeasureJob], picked,
                    after_run: Callable[[int, int], None] = lambda _run, _runs: None
                    ) -> list[list[tuple[float, float, float]]]:
        """Per job and picked call: the median of its timed runs, and the medians of their first
        and second half (two estimates apart in time, to confirm each other)."""
        every = [nid for ids in kernel_ids for nid in ids]
        first = json.loads(trace(1))["runs"][-1]  # warm-up, and a size
        longest = max([sum(s["end_us"] - s["start_us"] for s in first if s.get("device") == d)
                       for d in range(len(jobs))] or [0.0]) * 1e-6
        runs = max(MIN_RUNS, min(MAX_RUNS, int(TARGET_SECONDS / max(longest, 1e-9))))
        durations: dict[int, list[float]] = {nid: [] for nid in every}
        for run in range(runs if every else 0):
            for nid, samples in self._spans(trace, every).items():
                durations[nid].extend(samples)
            after_run(run + 1, runs)
        result = []
        for job, ids, indices in zip(jobs, kernel_ids, picked):
            missing = [job.calls[i].func_name for i, nid in zip(indices, ids) if not durations[nid]]
            if missing:
                raise RuntimeError(f"measuring on {name_of(job.device)}: the trace has no time for kernels {', '.join(missing)}")
            halves = [(durations[nid][: len(durations[nid]) // 2] or durations[nid],
                       durations[nid][len(durations[nid]) // 2:]) for nid in ids]
            result.append([(statistics.median(durations[nid]), statistics.median(a), statistics.median(b))
                           for nid, (a, b) in zip(ids, halves)])
        return result

    def _prepare(self, jobs: Sequence[MeasureJob], lib: tvm.runtime.Module, picked: Sequence[Sequence[int]],
                 repeats: int):
        """One runtime running, for every job, its calls ``picked`` as independent nodes on its own
        device (all devices at once, each on its executor), each call ``repeats`` times before the
        call timed, inputs set: (its trace function, per job the timed node ids in order)."""
        nodes: list[Node] = []
        kernel_ids: list[list[int]] = []
        for position, (job, indices) in enumerate(zip(jobs, picked)):
            ids = []
            for i in indices:
                call = job.calls[i]
                inputs = []
                for j, (shape, dtype) in enumerate(call.input_types):
                    nodes.append(Node(name=f"d{position}_k{i}_in{j}", op="null", shapes=[tuple(shape)],
                                      dtypes=[dtype]))
                    inputs.append(Entry(len(nodes) - 1, 0))
                for r in range(repeats + 1):  # the last call finds its inputs and weights in cache
                    nodes.append(Node(name=f"d{position}_k{i}_{r}", inputs=inputs, func_name=call.func_name,
                                      device=position, shapes=[tuple(s) for s, _ in call.output_types],
                                      dtypes=[t for _, t in call.output_types]))
                ids.append(len(nodes) - 1)
            kernel_ids.append(ids)
        if not any(kernel_ids):
            return (lambda _runs: json.dumps({"runs": [[]]})), kernel_ids
        heads = [Entry(nid, o) for nid, node in enumerate(nodes) if not node.is_input for o in range(node.num_outputs)]
        options = [job.options for job in jobs]
        module = graph_runtime.create(Graph(nodes, heads).to_json(), lib, [job.device for job in jobs],
                                      execution="concurrent", device_options=options if any(options) else None)
        for node in nodes:
            if node.is_input:
                module.set_input(node.name, sample_value(node.shapes[0], node.dtypes[0], self.rng, floats=FLOATS))
        self._alive.append(module)  # kept to the end: a backend's state keyed by address stays valid
        return module.module["trace"], kernel_ids

    def _remote_seconds(self, job: MeasureJob) -> list[float]:
        """A remote device's kernels, timed in its own process through the session (TVM's
        ``time_evaluator``: the loop runs remotely, so the call's round trip is not in the time;
        :meth:`call_latency` measures that)."""
        if job.externals:
            raise ValueError(f"measuring on {name_of(job.device)}: external backends run only on local CPUs")
        session = getattr(job.device, "_rpc_sess", None)
        if session is None:
            raise ValueError(f"measuring on {name_of(job.device)}: a remote device without its RPC session")
        remote_lib = upload_library(session, compile_jobs([job]), "autoplace_kernels.so")
        times = []
        for call in job.calls:
            self._tick(len(times), len(job.calls), [job], "in its own process")
            args = [tvm.runtime.tensor(sample_value(shape, dtype, self.rng, floats=FLOATS), job.device)
                    for shape, dtype in call.input_types]
            args += [tvm.runtime.empty(tuple(shape), dtype, job.device) for shape, dtype in call.output_types]
            timer = remote_lib.time_evaluator(call.func_name, job.device, number=1, repeat=REMOTE_REPEATS,
                                              min_repeat_ms=REMOTE_MIN_MS)
            times.append(statistics.median(timer(*args).results))
        self._tick(len(times), len(job.calls), [job], "in its own process")
        return times

    def call_latency(self, device: tvm.runtime.Device, options: dict | None) -> float:
        """Seconds of one call into ``device`` from this process (0 for a local device): a tiny
        kernel called through the session, the median of several calls."""
        if not is_remote(device):
            return 0.0
        session = getattr(device, "_rpc_sess", None)
        if session is None:
            raise ValueError(f"measuring the call latency of {name_of(device)}: a remote device without its RPC session")
        tiny = upload_library(session, compile_for_target(_tiny_kernel(), tvm.target.Target("llvm")),
                              "autoplace_tiny.so")["tiny"]
        x, y = tvm.runtime.tensor(np.zeros((1,), "float32"), device), tvm.runtime.empty((1,), "float32", device)

        def call() -> None:
            tiny(x, y)
            device.sync()

        return median_seconds(call, SYNC_RUNS)

    def copy_cost(self, src: tvm.runtime.Device, dst: tvm.runtime.Device) -> tuple[float, float]:
        """(fixed seconds, seconds per byte) of one copy from ``src`` to ``dst``."""
        times = []
        for nbytes in COPY_SIZES:
            a = tvm.runtime.empty((nbytes // 4,), "float32", src)
            b = tvm.runtime.empty((nbytes // 4,), "float32", dst)
            def copy(a=a, b=b) -> None:
                a.copyto(b)
                if needs_completion_wait(dst):
                    dst.sync()

            times.append(statistics.median(wall_times(copy, 7)))
        slope = max(0.0, (times[1] - times[0]) / (COPY_SIZES[1] - COPY_SIZES[0]))
        return max(0.0, times[0] - slope * COPY_SIZES[0]), slope

    def sync_latency(self, src: tvm.runtime.Device, dst: tvm.runtime.Device, src_options: dict | None,
                     dst_options: dict | None) -> float:
        """Seconds from a kernel's end on ``src`` until ``dst``'s executor, waiting for it, runs the
        next: a chain of busy kernels (each long enough that the waiting executor sleeps, as in a
        graph) alternating between the two devices, against the same chain on ``src`` alone, per
        crossing (both directions alike; the median of several runs). A chain of tiny kernels
        measured 1-5 us: the waiting executor had not gone to sleep yet."""
        if not shares_memory(src, dst):
            return 0.0  # devices with copies between them: the copy's fixed cost holds the hand-off
        lib = compile_for_target(_busy_kernel(), tvm.target.Target("llvm"))
        both = [src_options, dst_options]
        seconds = []
        for alternate in (False, True):
            nodes = [Node(name="x", op="null", shapes=[(1,)], dtypes=["float32"])]
            for i in range(SYNC_CHAIN):
                nodes.append(Node(name=f"t{i}", inputs=[Entry(i, 0)], func_name="busy",
                                  device=i % 2 if alternate else 0, shapes=[(1,)], dtypes=["float32"]))
            graph = Graph(nodes, [Entry(len(nodes) - 1, 0)]).to_json()
            module = graph_runtime.create(graph, lib, [src, dst], execution="concurrent",
                                          device_options=both if any(both) else None)
            module.set_input("x", np.zeros((1,), "float32"))
            seconds.append(median_seconds(module.run, SYNC_RUNS))
            module.close()
        return max(0.0, (seconds[1] - seconds[0]) / (SYNC_CHAIN - 1))

    def spin_window(self, device: tvm.runtime.Device, options: dict | None) -> float:
        """Seconds a wait of the runtime's executors spins before it sleeps (its own spin loop,
        timed by the library); 0 for a remote device, whose inputs travel with its call."""
        if is_remote(device):
            return 0.0
        return float(tvm_ffi.get_global_func("tvm_hetero.concurrency.spin_window_seconds")())

    def latency_seconds(self, artifact, device_options: Sequence[dict | None] | None = None) -> float:
        """The built graph's measured latency, for the report's predicted-vs-measured line. Without
        ``device_options`` the built graph runs with the settings its kernels were timed with (a
        build with ``targets="auto"`` takes the discovered devices' settings, which its caller never
        saw): measured another way, a 5.5 ms SqueezeNet measured 359 ms on a loaded machine."""
        if not any(device_options or []) and any(self._timed_with.values()):
            device_options = [self._timed_with.get(d) for d in range(len(artifact.devices))]
        return measure_latency(artifact, device_options)


def measure_latency(artifact, device_options: Sequence[dict | None] | None = None, runs: int = 10) -> float:
    """Median seconds of one inference of ``artifact`` (concurrent execution, random inputs)."""
    module = artifact.create(execution="concurrent", device_options=device_options)
    rng = np.random.default_rng(0)
    for name in artifact.input_names:
        current = module.get_input(name)
        module.set_input(name, sample_value(current.shape, str(current.dtype), rng, floats=FLOATS))
    return median_seconds(module.run, runs)


def median_seconds(call: Callable[[], Any], runs: int) -> float:
    """Median seconds of ``runs`` calls of ``call``, after one call not timed (a warm-up)."""
    call()
    return statistics.median(wall_times(call, runs))

