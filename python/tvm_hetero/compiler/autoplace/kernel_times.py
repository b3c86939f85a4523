"""Measured seconds of kernels and backend regions, per device: read from the cost cache, and only
what is missing measured, through a :class:`Measurer` (the runtime side does the timing; this
package never imports the runtime).

Two kinds of time are kept per device (:class:`KernelTimes`): ``"kernel"``, measured with every
device computing together (what a placement over several devices sees: shared caches, memory
bandwidth, a machine's other load), and ``"kernel_alone"``, with no other device computing (what
a placement on one device sees); a measurer that cannot time alone gives only the first, which
then serves both.

What is timed is named by a :class:`~.units.Part`: a node of a lowering (a TVM kernel, a region, or
a block of regions), keyed by :func:`.cost_cache.node_key`, so that equal kernels share one time
whichever lowering or placement they come from. A time the measurer says its re-measurement did
not confirm (``unconfirmed``) is used for the build at hand and never enters the cache.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import tvm

from ...backends import Backend, Region
from ...devices import name_of
from ..compile_kernels import _build
from .cost_cache import CostCache, settings_key
from .units import Part


@dataclass
class KernelCall:
    """One kernel or region to time: its name in the module handed over, and its arguments' types."""

    func_name: str
    input_types: list[tuple[tuple[int, ...], str]]
    output_types: list[tuple[tuple[int, ...], str]]


@dataclass
class MeasureJob:
    """What to time on one device: ``kernels`` holds every TVM kernel ``calls`` names, and each
    backend in ``externals`` the regions it names (the measurer runs the backend's codegen)."""

    position: int
    kernels: tvm.IRModule
    calls: list[KernelCall]
    device: tvm.runtime.Device
    target: tvm.target.Target
    options: dict | None
    externals: list[tuple[Backend, list[Region]]] = field(default_factory=list)


def compile_for_target(kernels: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Module:
    """``kernels`` compiled for ``target`` as a build compiles a device's kernels (a GPU target
    gets TVM's default schedule): what a measurer runs."""
    return _build(kernels, target)


def compile_jobs(jobs: Sequence[MeasureJob]) -> tvm.runtime.Module:
    """Every job's kernels (all of one target) in one library, each backend's regions imported (its
    codegen run afresh on every call: a backend module keeps state by address)."""
    funcs = {gv: f for job in jobs for gv, f in job.kernels.functions.items()}
    lib = compile_for_target(tvm.IRModule(funcs), jobs[0].target)
    regions: dict[int, tuple[Any, list]] = {}
    for job in jobs:
        for backend, job_regions in job.externals:
            regions.setdefault(id(backend), (backend, []))[1].extend(job_regions)
    for backend, all_regions in regions.values():
        lib.import_module(backend.codegen(all_regions))
    return lib


class Measurer(Protocol):
    """What the runtime side provides (tvm_hetero.placement_measurer.RuntimeMeasurer)."""

    def kernel_seconds(self, jobs: Sequence[MeasureJob]) -> list[list[float]]:
        """Seconds of every call of every job (all devices in one call, so that a measurer can
        interleave them and every device sees the same load)."""
        ...

    def copy_cost(self, src: tvm.runtime.Device, dst: tvm.runtime.Device) -> tuple[float, float]: ...

    # Optional: ``kernel_seconds_alone(jobs)`` (each device with no other computing),
    # ``sync_latency(src, dst, src_options, dst_options) -> seconds`` from a kernel's end on ``src``
    # until ``dst``'s executor waiting for it runs, ``call_latency(device, options) -> seconds`` of
    # one call into a remote device (0 where a measurer has none), ``spin_window(device, options)
    # -> seconds`` an executor spins in a wait before it sleeps, and
    # ``latency_seconds(artifact, device_options)`` of a built graph, and ``unconfirmed(job) -> set``
    # of the indices of ``job``'s calls whose last time its re-measurement did not confirm: those
    # are used for the build at hand and never enter the cost cache.


#: Per device: measurement key -> the part to time for it.
Wanted = list[dict[str, Part]]


class KernelTimes:
    """The seconds of every part measured so far on each device, in each kind (see the module
    docstring), backed by the cost cache."""

    def __init__(self, measurer: Measurer, cache: CostCache, devices: Sequence[tvm.runtime.Device],
                 targets: Sequence[tvm.target.Target], options: Sequence[dict | None],
                 backends: Sequence[Backend], progress: Callable[[str], None]) -> None:
        self.measurer = measurer
        self.cache = cache
        self.devices = list(devices)
        self.targets = list(targets)
        self.options = list(options)
        self.backend_of = {b.name: b for b in backends}
        self.say = progress
        self._alone_timer = getattr(measurer, "kernel_seconds_alone", None)
        #: ``"kernel"`` always; ``"kernel_alone"`` where the measurer can time a device alone.
        self.kinds = ("kernel", "kernel_alone") if self._alone_timer is not None else ("kernel",)
        self.settings = [settings_key(device, self.options[d]) for d, device in enumerate(self.devices)]
        #: Parts measured so far (each counted once, whatever the kinds).
        self.measured = 0
        #: Times used unconfirmed (their re-measurement never agreed): this build only, not cached.
        self.unconfirmed = 0
        self.known = {(kind, d): cache.table(kind, str(self.targets[d]), self.settings[d])
                      for kind in self.kinds for d in range(len(self.devices))}

    @property
    def alone(self) -> str:
        """The kind a placement on one device is predicted with."""
        return self.kinds[-1]

    def of(self, kind: str, device: int) -> dict[str, float]:
        """Seconds by key on ``device`` (``kind`` "kernel_alone" falls back to "kernel")."""
        return self.known[(kind if kind in self.kinds else "kernel", device)]

    def missing(self, wanted: Wanted, kinds: Sequence[str] | None = None) -> Wanted:
        """The parts of ``wanted`` some of ``kinds`` (default: all) has no time for."""
        kinds = [k for k in (kinds or self.kinds) if k in self.kinds]
        return [{k: part for k, part in wanted[d].items() if any(k not in self.known[(kind, d)] for kind in kinds)}
                for d in range(len(self.devices))]

    def measure(self, missing: Wanted, lowerings: Sequence[Any], kinds: Sequence[str] | None = None,
                what: str = "kernels") -> int:
        """Time every part of ``missing`` (nodes of ``lowerings[part.lowering]``) in each of
        ``kinds`` (default: all), store the times in the cache; returns how many parts per kind."""
        kinds = [k for k in (kinds or self.kinds) if k in self.kinds]
        jobs = [make_job(d, self.devices[d], self.targets[d], self.options[d], missing[d], lowerings, self.backend_of)
                for d in range(len(self.devices)) if missing[d]]
        if not jobs:
            return 0
        self.say("automatic placement: measuring " + ", ".join(
            f"{len(job.calls)} {what} on {name_of(job.device)}" for job in jobs))
        timers = {"kernel": self.measurer.kernel_seconds, "kernel_alone": self._alone_timer}
        unconfirmed = getattr(self.measurer, "unconfirmed", None)
        for kind in kinds:
            for job, times in zip(jobs, _checked(timers[kind](jobs), jobs)):
                keys = list(missing[job.position])
                doubtful = unconfirmed(job) if unconfirmed is not None else set()
                self.unconfirmed += len(doubtful)
                self.cache.put_many(kind, [(key, str(job.target), self.settings[job.position], seconds)
                                           for i, (key, seconds) in enumerate(zip(keys, times)) if i not in doubtful])
                self.known[(kind, job.position)].update(zip(keys, times))
        count = sum(len(job.calls) for job in jobs)
        self.measured += count
        return count


def _checked(measured: Sequence[Sequence[float]], jobs: Sequence[MeasureJob]) -> Sequence[Sequence[float]]:
    """A measurer's answer, one finite non-negative time per call of every job, or a clear error."""
    if len(measured) != len(jobs):
        raise ValueError(f"measurer answered for {len(measured)} devices, asked for {len(jobs)}")
    for job, times in zip(jobs, measured):
        if len(times) != len(job.calls) or not all(math.isfinite(t) and t >= 0 for t in times):
            raise ValueError(f"measurer on {name_of(job.device)}: expected {len(job.calls)} finite non-negative "
                             f"times, got {list(times)[:8]}")
    return measured


def make_job(d: int, device, target, options, missing: dict[str, Part], lowerings: Sequence[Any],
             backend_of: dict[str, Backend]) -> MeasureJob:
    """One device's measuring job: every missing key once, TVM kernels renamed ``d<d>_k<i>`` into one
    module, regions renamed ``d<d>_r<i>_<backend>`` (names unique across devices, so a measurer
    may run several devices' jobs in one library)."""
    funcs: dict[tvm.ir.GlobalVar, Any] = {}
    calls: list[KernelCall] = []
    externals: dict[str, list[Region]] = {}
    for i, part in enumerate(missing.values()):
        lowered = lowerings[part.lowering]
        call = _kernel_call(lowered, part.node_id)
        if part.anchor is None:
            name = f"d{d}_k{i}"
            funcs[tvm.ir.GlobalVar(name)] = lowered.kernels[part.func_name].with_attr("global_symbol", name)
        else:
            name = f"d{d}_r{i}_{part.variant}"
            region = lowered.regions[part.func_name]
            spec = dict(region.spec, name=name)
            externals.setdefault(region.backend, []).append(dataclasses.replace(region, name=name, device=0, spec=spec))
        calls.append(KernelCall(name, call.input_types, call.output_types))
    return MeasureJob(d, tvm.IRModule(funcs), calls, device, target, options,
                      [(backend_of[b], regions) for b, regions in externals.items()])


def _kernel_call(lowered, node_id: int) -> KernelCall:
    node = lowered.graph.nodes[node_id]
    inputs = [
        (tuple(lowered.graph.nodes[e.node].shapes[e.index]), lowered.graph.nodes[e.node].dtypes[e.index])
        for e in node.inputs
    ]
    outputs = [(tuple(s), t) for s, t in zip(node.shapes, node.dtypes)]
    return KernelCall(node.func_name, inputs, outputs)
