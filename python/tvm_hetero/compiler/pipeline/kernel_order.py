"""The kernel order of a module and a split of it into pipeline stages (docs/pipeline.md).

**Where cuts live.** A module is lowered once, exactly as ``tvm_hetero.build`` lowers it for ONE
device (same passes, same node order). Its kernel nodes, in that topological order, are the
*kernel order*; ``split(...).describe()`` lists it (position, node name = the Relax var bound to
the kernel call, kernel symbol, output bytes). A split point is a kernel position (an int) or a
kernel node name (a str): the kernel where the next stage begins. Stage ``s`` runs the kernels
between split point ``s - 1`` and split point ``s``. A cut in a topological order sends every
tensor forward, so stage inputs come from the pipeline inputs, parameters, or earlier stages.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from ...backends import resolve_backends
from ...graph import Entry, Graph
from ..build import format_size
from ..copies import insert_copies
from ..lower import LoweredGraph, lower_to_graph
from ..reorder import reorder_for_devices
from .cost_model import SegmentModel, Tensor
from .stages import stage_backends, stage_spec


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
        return make_split(self.lowered, self.graph, split_points, libs=self.libs)

    def tensors(self) -> list[Tensor]:
        """Tensors kernels pass each other: ``(producer position, consumer positions, bytes)``."""
        return tensors_between(self.graph, self.kernels)

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
                f"receives {format_size(self.boundary_bytes[s])}{cost}"
            )
        if self.stage_costs_us:
            lines.append(f"  ideal speedup (sum / max of stage costs): {self.ideal_speedup():.2f}x")
        if kernels:
            starts = set(self.split_points)
            for k in self.kernels:
                cost = "" if not self.costs_us else f"  {self.costs_us[0][k.position] / 1e3:8.3f} ms"
                mark = "|" if k.position in starts else " "
                lines.append(
                    f"  {mark}{k.position:4d} {k.name:<20} {k.func_name:<40} out {format_size(k.output_bytes):>10}{cost}"
                )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _on_device_zero(_info: Any) -> int:
    return 0


def lower_one_device(mod: tvm.IRModule, params: Mapping[str, Any] | None, entry: str, backends: Sequence[Any]):
    """The lowering and the one-device graph, as ``tvm_hetero.build`` makes them for one device,
    but with one backend region per match: stages are cut between graph nodes, and a block of
    regions would be one node (ResNet-50: two) that no cut could split. ``backends`` is resolved
    already (None is ``stages.stage_backends``'s business)."""
    backends = [b.without_blocks() for b in resolve_backends(backends)]
    lowered = lower_to_graph(mod, _on_device_zero, 1, dict(params or {}), entry, backends)
    return lowered, insert_copies(reorder_for_devices(lowered.graph), 0)


def kernel_order(graph: Graph) -> list[Kernel]:
    kernels: list[Kernel] = []
    for nid, node in enumerate(graph.nodes):
        if not node.is_input:
            nbytes = sum(node.output_bytes(i) for i in range(node.num_outputs))
            kernels.append(Kernel(len(kernels), nid, node.name, node.func_name, nbytes))
    return kernels


def tensors_between(graph: Graph, kernels: list[Kernel]) -> list[Tensor]:
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


def make_split(lowered, graph, points, costs_us=None, model=None, libs=None) -> PipelineSplit:
    kernels = kernel_order(graph)
    resolved = _resolve_split_points(points, kernels)
    tables = model or SegmentModel(len(kernels), tensors_between(graph, kernels))
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
    backends: Sequence[Any] | None = None,
) -> PipelineSplit:
    """Cut ``mod`` at ``split_points``: kernel positions or kernel node names where stages 1.. begin.

    ``split(mod, [])`` is one stage; its ``describe(kernels=True)`` lists the kernel order.
    ``params`` and ``backends`` are as in ``tvm_hetero.build`` for one host CPU (they shape the
    graph): None is oneDNN when libtvm_hetero has it; ``backends=()`` for stages off the host CPU.
    """
    lowered, graph = lower_one_device(mod, params, entry, stage_backends(backends, [stage_spec("cpu:0")]))
    return make_split(lowered, graph, split_points)

