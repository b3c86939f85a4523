"""The compiled entry graphs of one model (one per chunk size) and their runtimes, weights once.

Every graph declares the same weights as parameters. The first runtime on each device loads them
(``load_params``); every other runtime on that device aliases that runtime's tensors
(``share_params``, no copy), and the frames of every runtime read the same memory again.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from ..runtime import graph_runtime
from ..runtime.graph_runtime import GraphModule


@dataclass
class EntryGraph:
    """One static graph: its chunk size, the phase it serves, and what runs it."""

    #: Rows per call (1: the decode graph).
    size: int
    #: "prefill" or "decode": which targets it was built for.
    phase: str
    graph_json: str
    lib: Any
    devices: list[tvm.runtime.Device]
    #: The build report (None when loaded from disk without one).
    build_report: Any = None
    #: Seconds its build took (0 when loaded).
    build_seconds: float = 0.0
    #: The runtime holding (or sharing) the weights; set by :func:`create_runtimes`.
    runtime: GraphModule | None = field(default=None, repr=False)
    #: Why this graph runs on the host although its phase's targets hold an accelerator (the
    #: whole-path check failed it, phase_check.py); "" otherwise.
    moved_to_host: str = ""
    #: Parameters of this graph alone besides the weights (constants its build lifted out of the
    #: graph, e.g. those an accelerator's preparation folded), set on its runtime.
    constants: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Its outputs packed into one tensor (packed_outputs.py: a graph with an accelerator's regions).
    packed: bool = False
    #: Per accelerator graph (region name): the ONNX model handed to the vendor (empty when loaded).
    accelerator_models: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def offload(self) -> Any | None:
        """The build report's accelerator section (None: no accelerator, or loaded from disk)."""
        offload = getattr(self.build_report, "offload", None) if self.build_report is not None else None
        return offload or None

    @property
    def accelerator_executions(self) -> int:
        """Accelerator graph executions per call of this graph (0 when it runs on the host alone)."""
        offload = self.offload
        return int(offload.graph_executions) if offload and offload.regions else 0


def create_runtimes(graphs: Sequence[EntryGraph], params_blob: bytes, what: str,
                    device_options: dict[str, Any] | None = None) -> None:
    """Create each graph's runtime; weights are loaded once per device and shared by the others.
    ``device_options``: per phase, the runtime's executor settings for that phase's graphs (e.g.
    ``[{"cores": [0], "num_threads": 1}]``, one entry per device), as ``graph_runtime.create`` takes."""
    keep_large_allocations_apart()
    owners: dict[tuple[int, int], GraphModule] = {}
    names_blob = None
    for graph in graphs:
        options = (device_options or {}).get(graph.phase)
        runtime = graph_runtime.create(graph.graph_json, graph.lib, graph.devices, device_options=options)
        key = (graph.devices[0].dlpack_device_type(), graph.devices[0].index)
        if key in owners:
            runtime.share_params(owners[key], names_blob)
        else:
            runtime.load_params(params_blob, what)
            owners[key] = runtime
            # the weights alone, named before this graph's own constants are set (theirs are not shared)
            names_blob = names_blob or _names_only(runtime.param_names)
        if graph.constants:
            runtime.set_params(graph.constants)
        graph.runtime = runtime


def _names_only(names: list[str]) -> bytes:
    """A parameter blob of ``names`` with one-element values: ``share_params`` reads only the names.
    Giving it the whole blob would decode every weight again per graph (a transient copy of all of
    them, whose memory glibc then keeps: +129 MiB resident per graph for the 8-bit 135M shape)."""
    one = np.zeros(1, np.float32)
    return bytes(tvm.runtime.save_param_dict({name: tvm.runtime.tensor(one) for name in names}))


#: glibc's mallopt parameter for the size from which an allocation is its own mapping.
_M_MMAP_THRESHOLD = -3


def keep_large_allocations_apart() -> None:
    """Fix glibc's mmap threshold at its initial 128 KiB. It otherwise grows to the largest block
    freed (up to 32 MiB), and the transient copy ``load_params`` makes of each weight then lands in
    the heap, whose pages stay resident after it is freed: +97 MiB for the 8-bit 135M shape
    (weights 129 MiB), against +20 MiB with the threshold fixed. Only allocations of 128 KiB and
    more are affected (each its own mapping, returned when freed); nothing where glibc is not."""
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):
        pass


def release_freed_memory() -> None:
    """Give the memory freed after loading (the parameter blob, transient copies) back to the system:
    glibc keeps freed heap memory of that size otherwise (tens of MiB resident for nothing). Where
    glibc's ``malloc_trim`` is not there, nothing is done."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def weight_devices(graphs: Sequence[EntryGraph]) -> list[tvm.runtime.Device]:
    """The devices holding a copy of the weights (one per distinct primary device)."""
    seen: dict[tuple[int, int], tvm.runtime.Device] = {}
    for graph in graphs:
        seen.setdefault((graph.devices[0].dlpack_device_type(), graph.devices[0].index), graph.devices[0])
    return list(seen.values())
