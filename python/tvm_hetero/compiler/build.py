"""The compiler's entry: a Relax IRModule in, a :class:`CompiledGraph` (graph JSON + kernels + params) out.

The passes, in order (each in its own file, each testable alone):

    lower_to_graph      placement per Relax op, legalize, fuse within a device   (lower.py, placement.py)
    reorder_for_devices topological order with the fewest device switches          (reorder.py)
    insert_copies       one __copy per (tensor, device without shared memory)       (copies.py)
    plan_memory         storage ids shared only within a device, by liveness       (memory.py)
    compile_kernels     each device's kernels for its target, one library per architecture
                                                                   (lower.py, kernel_libraries.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from ..backends import default_backends, resolve_backends
from ..devices import DeviceSpec, is_host, kind_of, name_of, parse_spec, runs_tvm_kernels
from ..devices import devices as discover_devices
from ..graph import Graph
from ..ir.fold_constant_ops import FoldConstantOps
from ..kind_record import resolve
from .autoplace.explanation import AutoplaceReport
from .copies import copy_stats, insert_copies, shared_edges
from .kernel_libraries import DeviceLibrary, compile_kernel_libraries
from .lower import LoweredGraph, lower_to_graph
from .memory import MemoryPlan, plan_memory
from .overlap_order import reorder_for_overlap
from .reorder import reorder_for_devices

TargetSpec = Sequence[tuple[Any, Any]]


def device_name(dev: tvm.runtime.Device) -> str:
    """``"cpu:1"``, ``"cuda:0"``, or a vendor kind's ``"KIND:0"``."""
    return name_of(dev)


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


#: An accelerator report's type where a manifest written before reports named theirs.
OFFLOAD_REPORT = "tvm_hetero.ep_offload.offload_report:OffloadReport"


@dataclass
class BuildReport:
    """What the compiler decided, for :meth:`Artifact.report`."""

    devices: list[str]
    targets: list[str]
    ops_per_device: list[int]
    kernels_per_device: list[int]
    groups: list[tuple[int, int]]  # (device, number of nodes) per execution group
    switches_original: int  # between kernels, before copies are inserted
    switches_reordered: int  # the same after reordering
    num_copies: int
    bytes_copied: int
    fallbacks: list[str]
    memory: dict[str, list[int]]
    compile_seconds: float = 0.0
    # (backend, device, regions, relax ops in them) per external backend; regions are kernel nodes
    backend_regions: list[tuple[str, int, int, int]] = field(default_factory=list)
    # tensors read in place on another device that shares memory (no copy)
    shared_edges: int = 0
    # placement="auto": the choice explained (compiler/autoplace/explanation.py), else None
    autoplace: AutoplaceReport | None = None
    # why a default backend did not run (e.g. the library was built without it)
    backend_notes: list[str] = field(default_factory=list)
    # an accelerator reached through a vendor's SDK among the devices: what its vendor refused and
    # why, its graphs, their verification (its backend's report, e.g. ep_offload's OffloadReport:
    # ``explain`` names the function writing its lines, ``to_dict()`` its JSON form, which names
    # its type under "report_type" to be read back)
    offload: Any | None = None
    # (op name, relax op, placed device, run device, backend) for each op a backend pinned to a
    # device took from the device the placement gave it
    moved_by_backend: list[tuple[str, str, int, int, str]] = field(default_factory=list)
    # a convolution or matmul no backend took because its weight is computed: one line each, why
    backend_declined: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.autoplace, dict):  # read back from an artifact's manifest
            self.autoplace = AutoplaceReport.from_dict(self.autoplace)
        if isinstance(self.offload, dict):
            self.offload = resolve(self.offload.get("report_type", OFFLOAD_REPORT)).from_dict(self.offload)

    def to_dict(self) -> dict:
        """The JSON form (the artifact's manifest)."""
        doc = dict(self.__dict__)
        if self.autoplace is not None:
            doc["autoplace"] = self.autoplace.to_dict()
        if self.offload is not None:
            doc["offload"] = self.offload.to_dict()
        return doc

    def __str__(self) -> str:
        lines = ["tvm-hetero build report"]
        for d, name in enumerate(self.devices):
            lines.append(
                f"  device {d} {name:<8} target {self.targets[d]:<12} relax ops {self.ops_per_device[d]:4d}  "
                f"kernels {self.kernels_per_device[d]:4d}"
            )
        lines.append(
            f"  device switches between kernels: {self.switches_original} in the original order, "
            f"{self.switches_reordered} after reordering; {len(self.groups)} execution groups with copies"
        )
        for backend, device, regions, ops in self.backend_regions:
            lines.append(
                f"  backend {backend} on device {device} ({self.devices[device]}): {regions} regions "
                f"holding {ops} relax ops; the rest runs as TVM kernels"
            )
        if not self.backend_regions:
            lines.append("  backends: none, TVM kernels run every op")
        lines.extend(f"  backend note: {note}" for note in self.backend_notes)
        lines.extend(f"  NOT TAKEN by backend: {line}" for line in self.backend_declined)
        if self.moved_by_backend:
            lines.append(
                f"  MOVED by backend ({len(self.moved_by_backend)} ops placed on another device run "
                "where their backend is pinned):"
            )
            lines.extend(
                f"    {name} ({op}): device {src} ({self.devices[src]}) -> device {dst} ({self.devices[dst]}), "
                f"backend {backend}"
                for name, op, src, dst, backend in self.moved_by_backend
            )
        lines.append(
            f"  copies {self.num_copies}, {format_size(self.bytes_copied)} copied per inference; "
            f"{self.shared_edges} tensors read in place by another device (shared memory, no copy)"
        )
        mem = self.memory
        for d, name in enumerate(self.devices):
            bound, planned = mem["lower_bound_bytes"][d], mem["planned_bytes"][d]
            ratio = f"{planned / bound:.3f}x" if bound else "-"
            lines.append(
                f"  memory {name:<8} planned {format_size(planned)} (lower bound {format_size(bound)}, {ratio}; "
                f"unshared {format_size(mem['unshared_bytes'][d])}) + inputs/params {format_size(mem['input_bytes'][d])}"
            )
        if self.fallbacks:
            lines.append(f"  FALLBACKS to device 0 ({len(self.fallbacks)}):")
            lines.extend(f"    {f}" for f in self.fallbacks)
        else:
            lines.append("  fallbacks: none")
        if self.offload:  # its backend's own section, by the explainer its summary names
            lines.extend(resolve(self.offload.explain)(self.offload, self.devices))
        if self.autoplace:
            from .autoplace.report import explain

            lines.extend(explain(self.autoplace))
        return "\n".join(lines)


@dataclass
class CompiledGraph:
    """What :func:`build` makes: graph JSON, kernels, params (``tvm_hetero.Artifact`` wraps it)."""

    graph_json: str
    lib: tvm.runtime.Module
    params: dict[str, np.ndarray]
    devices: list[tvm.runtime.Device]
    input_names: list[str] = field(default_factory=list)
    build_report: BuildReport | None = None
    # Devices whose target is another architecture than this machine's: their own kernel libraries.
    device_libs: dict[int, DeviceLibrary] = field(default_factory=dict)
    # Per offload region: its plain ONNX model, the CPU reference verification runs (not exported).
    offload_references: dict[str, bytes] = field(default_factory=dict)


def build(
    mod: tvm.IRModule,
    targets: TargetSpec,
    placement: Any = None,
    params: dict[str, Any] | None = None,
    *,
    output_device: int | None = 0,
    reorder: bool | str = True,
    entry: str = "main",
    progress: Callable[[str], None] | None = None,
    backends: Sequence[Any] | None = None,
    objective: str = "latency",
    device_options: Sequence[dict | None] | None = None,
    cost_cache: Any = None,
    capabilities: Any = None,
    measurer: Any = None,
    offload_exclude: dict[str, str] | None = None,
) -> CompiledGraph:
    """Compile ``mod`` for several devices.

    Parameters
    ----------
    mod : a Relax IRModule, e.g. from ``tvm.relax.frontend.onnx.from_onnx``.
    targets : ``[(device, target), ...]``; the position is the device index, the first is the
        primary/fallback device, e.g. ``[(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]``.
    placement : None (IR annotations, else the primary device), ``{op_name: device_index}``, a
        callable ``(OpInfo) -> device_index``, or a :class:`Capabilities` table.
    params : values of function parameters that are weights (by parameter name).
    output_device : device the graph outputs end on (None: where they are produced).
    reorder : True or ``"switches"``: an order with the fewest device switches; ``"overlap"``: the same
        switches, critical-path kernels first inside each run (compiler/overlap_order.py); False:
        the lowering's order.
    progress : called with a line of text as each step starts (the CLI prints them).
    backends : external backends (BYOC), e.g. ``["dnnl"]`` or ``[("dnnl", 1)]`` (name, device
        position): their patterns are offloaded first, as regions on that device (docs/byoc.md).
        None (default): oneDNN on every host-CPU device, each region where the placement puts its
        anchor op, when libtvm_hetero was built with it; ``()``: TVM kernels only.

    With ``placement="auto"`` (docs/autoplace.md) every candidate kernel is timed on every device
    allowed to run it, each backend region (``backends``, oneDNN by default) against the TVM
    kernels it replaces, and the devices and backends minimising the predicted latency of one
    inference are chosen:
    objective : ``"latency"``, ``"calls"`` (fewest remote calls within 10% of the best latency) or
        ``"throughput"`` (the smallest bottleneck: the largest time one device spends per inference).
    device_options : each device's executor settings as for the runtime (``{"cores": [0],
        "num_threads": 1}``); kernels are timed with them, and the artifact should run with them.
    cost_cache : where measurements are kept: None (``~/.cache/tvm-hetero/costs.sqlite``), a path,
        or False (not kept).
    capabilities : a :class:`Capabilities` table restricting which device may run which op.
    measurer : what times kernels (default: ``tvm_hetero.placement_measurer.RuntimeMeasurer``).
    targets may be ``"auto"``: the devices :func:`tvm_hetero.devices` finds (with their settings).
    An entry may also name a device kind with options, e.g. ``"KIND"`` or ``{"kind": KIND,
    option: value, ...}``: an accelerator reached through its vendor's SDK is given the ops its
    vendor accepts (its kind record's backend; docs/new-accelerator.md); ``offload_exclude``
    keeps named bindings off it.
    """
    say = progress or (lambda _msg: None)
    if not isinstance(mod, tvm.IRModule):
        hint = " (import ONNX first: tvm_hetero.importers.from_onnx(model))" if type(mod).__name__ == "ModelProto" else ""
        raise TypeError(f"build: mod must be a Relax tvm.IRModule, got {type(mod).__name__}{hint}")
    if any(gv.name_hint == entry for gv in mod.get_global_vars()) and isinstance(mod[entry], tvm.relax.Function):
        mod = FoldConstantOps(entry)(mod)  # every constant subgraph folded before the backends look
    if isinstance(targets, str) and targets == "auto":
        # An accelerator with a vendor SDK joins only when asked for by name: its graphs are a choice.
        found = [d for d in discover_devices() if runs_tvm_kernels(d.device)]
        targets = [(d.device, d.target) for d in found]
        if device_options is None:
            device_options = [d.options for d in found]
    if not targets:
        raise ValueError("targets: at least one (device, target) pair is needed")
    specs = resolve_targets(targets)
    devices = [s.device for s in specs]
    target_list = [s.target for s in specs]
    if output_device is not None and not 0 <= output_device < len(devices):
        raise ValueError(f"output_device {output_device} is out of range for {len(devices)} devices")

    notes: list[str] = []
    if backends is None:
        cpus = [d for d, dev in enumerate(devices) if runs_tvm_kernels(dev) and shares_memory_between(
            devices, target_list)(d, d)]
        backends, notes = default_backends(cpus)
    backends = with_offload_backends(backends, specs, placement, offload_exclude)
    if reorder not in (True, False, "switches", "overlap"):
        raise ValueError(f"reorder must be True, False, 'switches' or 'overlap', got {reorder!r}")
    start = time.perf_counter()
    auto = None
    if isinstance(placement, str):
        if placement != "auto":
            raise ValueError(f"placement {placement!r}: the only placement given by name is 'auto'")
        def lower(prepared, choose, chosen_backends):  # a candidate placement, lowered as this build would
            lowered, graph, _switches = lower_as_built(prepared, choose, devices, target_list, params, entry,
                                                       chosen_backends, reorder, output_device)
            return lowered, graph

        auto = _auto_placement(mod, devices, target_list, params, entry, objective, device_options,
                               cost_cache, capabilities, measurer, say, resolve_backends(backends), lower)
        placement, mod, backends = auto.choose, auto.module, auto.backends  # the regions chosen
    say("placing and lowering Relax ops")
    lowered, graph, switches = lower_as_built(mod, placement, devices, target_list, params, entry, backends,
                                              reorder, output_device, say)
    plan = plan_memory(graph)
    say(f"compiling {len(lowered.kernel_devices)} kernels")
    lib, device_libs = compile_kernel_libraries(lowered, target_list, devices)
    report = _make_report(lowered, graph, plan, devices, target_list, switches)
    report.compile_seconds = time.perf_counter() - start
    report.backend_notes = notes
    references = {}
    for backend in backends:
        summary = backend.build_summary(lowered)
        if summary is not None:  # an accelerator's backend: what it took, refused and runs
            report.offload = summary
            references.update(backend.reference_models)
    compiled = CompiledGraph(
        graph_json=graph.to_json(plan.storage_ids, plan.storage_offsets),
        lib=lib,
        params=lowered.params,
        devices=devices,
        input_names=list(lowered.input_names),
        build_report=report,
        device_libs=device_libs,
        offload_references=references,
    )
    if auto is not None:
        report.autoplace = auto.explanation  # the artifact layer adds the built graph's measured latency
        # A block (regions joined after the choice) counts as the regions it runs.
        formed = sum(len(region.spec["steps"]) if region.pattern == "block" else 1
                     for node in lowered.graph.nodes if (region := lowered.regions.get(node.func_name)))
        if formed != auto.explanation.regions_chosen:  # the choice checked against what was built
            report.autoplace.regions_formed = formed
    return compiled


def _auto_placement(mod, devices, targets, params, entry, objective, device_options, cost_cache, capabilities,
                    measurer, say, backends, lower):
    """placement="auto": measure (through the runtime, imported only here) and solve."""
    from .autoplace.cost_cache import open_cache
    from .autoplace.measured import choose_placement

    if measurer is None:  # tvm_hetero.build passes the runtime's measurer; the compiler has none
        raise ValueError("placement='auto' needs a measurer (tvm_hetero.build gives the runtime's)")
    cache = open_cache(cost_cache)
    try:
        auto = choose_placement(
            mod, devices, targets, shares_memory_between(devices, targets), measurer, cache,
            params=params, entry=entry, objective=objective, device_options=device_options,
            capabilities=capabilities, progress=say, backends=backends, lower=lower,
        )
    finally:
        cache.close()
    return auto


def lower_as_built(mod: tvm.IRModule, placement: Any, devices: Sequence[tvm.runtime.Device],
                   targets: Sequence[tvm.target.Target], params: dict[str, Any] | None, entry: str,
                   backends: Sequence[Any], reorder: Any = True, output_device: int | None = None,
                   say: Callable[[str], None] = lambda _msg: None) -> tuple[LoweredGraph, Graph, tuple[int, int]]:
    """The build's lowering: the kernel graph of ``mod`` under ``placement``, in the order it runs
    (reordered), with its copies; and the device switches before and after reordering. Automatic
    placement judges its candidates on exactly this graph."""
    kernel_free = [d for d, dev in enumerate(devices) if not runs_tvm_kernels(dev)]
    lowered = lower_to_graph(mod, placement, len(devices), params, entry, backends, targets=targets,
                             kernel_free_devices=kernel_free)
    graph = lowered.graph
    switches_original = graph.device_switches()
    if reorder:
        say(f"reordering {len(graph.nodes)} nodes")
        graph = reorder_for_overlap(graph) if reorder == "overlap" else reorder_for_devices(graph)
    switches_reordered = graph.device_switches()
    graph = insert_copies(graph, output_device, shares_memory_between(devices, targets))
    return lowered, graph, (switches_original, switches_reordered)


def with_offload_backends(backends: Any, specs: Sequence[DeviceSpec], placement: Any,
                          exclude: dict[str, str] | None) -> list:
    """``backends`` with the backend its kind record names first for each device that runs no TVM
    kernels (unless one of that name is listed): it takes every op its vendor accepts when no
    placement is given, else the ops the placement puts on the device."""
    from ..backends import resolve_backends

    resolved = resolve_backends(backends)
    listed = {b.name for b in resolved}
    added = []
    for position, spec in enumerate(specs):
        if runs_tvm_kernels(spec.device):
            continue
        record = spec.kind.record
        if record is None or record.backend is None:
            raise ValueError(f"targets[{position}]: {name_of(spec.device)} runs no TVM kernels and its kind names "
                             "no backend to run its graphs")
        backend_class = resolve(record.backend)
        if backend_class.name in listed:
            continue
        added.append(backend_class.for_device(position, spec.options, exclude, follow_placement=placement is not None))
    return added + resolved


def resolve_targets(targets: Sequence[Any]) -> list[DeviceSpec]:
    """Each entry of ``targets`` as a :class:`~tvm_hetero.devices.DeviceSpec` whose target is a
    ``tvm.target.Target``. A device that runs no TVM kernels (an NPU behind a vendor SDK) gets the
    host's ``llvm`` as a placeholder: the lowering never places a TVM kernel on it (its ops run in
    its backend's regions or fall back to the primary device), so nothing is compiled for it."""
    specs = []
    for position, entry in enumerate(targets):
        try:
            spec = parse_spec(entry)
            if spec.target is None and runs_tvm_kernels(spec.device):
                raise ValueError(f"{name_of(spec.device)} needs a target")
            target = spec.target if spec.target is not None else "llvm"
            spec.target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
        except (TypeError, ValueError) as err:
            raise ValueError(f"targets[{position}]: {err} (entries are (device, target) pairs, or a device "
                             "kind's name with options, 'KIND:key=value' or {'kind': KIND, ...})") from err
        specs.append(spec)
    return specs


def shares_memory_between(devices: Sequence[tvm.runtime.Device], targets: Sequence[tvm.target.Target]):
    """``(a, b) -> bool``: devices ``a`` and ``b`` are CPUs of this process, both compiled for the
    host's own architecture, so a tensor of one is read by the other in place. (A device that is
    given as a CPU at build time but is remote at run time gets its copies from the runtime.)"""
    host = [is_host(dev) and (not runs_tvm_kernels(dev) or _host_architecture(tgt)) for dev, tgt in zip(devices, targets)]
    return lambda a, b: host[a] and host[b]


def _host_architecture(target: tvm.target.Target) -> bool:
    import platform

    triple = str(target.attrs.get("mtriple", "")) if target.kind.name == "llvm" else None
    if triple is None:
        return False
    if not triple:
        return True
    machine = platform.machine().lower()
    aliases = {"amd64": "x86_64", "arm64": "aarch64"}
    return triple.split("-")[0].lower() == aliases.get(machine, machine)


def _make_report(
    lowered: LoweredGraph, graph: Graph, plan: MemoryPlan, devices, targets, switches: tuple[int, int]
) -> BuildReport:
    n = len(devices)
    ops = [0] * n
    for _info, device in lowered.op_placement:
        ops[device] += 1
    per_backend: dict[tuple[str, int], list[int]] = {}
    moved: dict[str, list[tuple[str, str, int, int, str]]] = {}  # by region symbol
    for node in lowered.graph.nodes:  # per call site: identical regions share one function
        region = lowered.regions.get(node.func_name)
        if region is None:
            continue
        moved[region.name] = [(m.name, m.op, m.placed, region.device, region.backend) for m in region.moved]
        ops[region.device] += len(region.ops)
        counts = per_backend.setdefault((region.backend, region.device), [0, 0])
        counts[0] += 1
        counts[1] += len(region.ops)
    kernels = [0] * n
    for device in lowered.kernel_devices.values():
        kernels[device] += 1
    num_copies, bytes_copied = copy_stats(graph)
    return BuildReport(
        devices=[device_name(d) for d in devices],
        targets=[str(t.kind.name) if runs_tvm_kernels(d) else kind_of(d).name for d, t in zip(devices, targets)],
        ops_per_device=ops,
        kernels_per_device=kernels,
        groups=[(dev, len(ids)) for dev, ids in graph.groups()],
        switches_original=switches[0],
        switches_reordered=switches[1],
        num_copies=num_copies,
        bytes_copied=bytes_copied,
        fallbacks=[str(f) for f in lowered.fallbacks],
        memory={
            key: (list(getattr(plan, key)) + [0] * n)[:n]  # the plan lists only devices it saw
            for key in ("planned_bytes", "lower_bound_bytes", "slot_bound_bytes", "unshared_bytes", "input_bytes")
        },
        backend_regions=[(name, dev, n, k) for (name, dev), (n, k) in per_backend.items()],
        shared_edges=shared_edges(graph),
        moved_by_backend=[move for moves in moved.values() for move in moves],
        backend_declined=list(lowered.declined),
    )
