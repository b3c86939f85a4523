"""The interface of an external backend (BYOC) and the region it is given.

A backend says four things: its ``name``; the ``patterns`` it runs (Relax DPL patterns, composites
such as conv2d+bias+relu included, each with a check); how a matched composite becomes a
``describe``-d region; and a ``codegen`` that turns the regions of one graph into a runtime module
whose functions are named by the regions. It runs on the device at position ``device`` of the
build's targets, or (``device=None``) on whichever of the positions ``devices`` the placement puts
each region's anchor op on, so a backend is a placement target like any other: the reorder, copy
insertion, memory planning and the report see its regions as kernel nodes on their device.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import tvm

#: ``is_weight(expr) -> bool``: whether a Relax expression is a weight (a constant, or a function
#: parameter with a value in ``params``), i.e. the same tensor on every run.
WeightPredicate = Callable[[Any], bool]


@dataclass(frozen=True)
class MovedOp:
    """An op a backend pinned to one device took from the device the placement gave it."""

    #: Name of the variable the op call was bound to.
    name: str
    #: Relax op name, e.g. ``"relax.matmul"``.
    op: str
    #: The device position the placement gave it.
    placed: int


@dataclass
class Region:
    """One partitioned region: a call in the entry function to a function run by a backend."""

    #: The symbol of the region: the graph's ``func_name`` and the runtime module's function name.
    name: str
    #: Name of the backend that runs it.
    backend: str
    #: Device position (in the build's targets) it runs on.
    device: int
    #: The composite pattern that made it, e.g. ``"dnnl.conv2d_bias_relu"``.
    pattern: str
    #: Relax ops inside, in order.
    ops: list[str]
    #: What the backend's codegen needs (JSON-able), from :meth:`Backend.describe`.
    spec: dict = field(default_factory=dict)
    #: Ops inside that the placement put on another device: only a backend pinned to a device
    #: (``device=`` a position) takes such ops; one that follows the placement never does.
    moved: list[MovedOp] = field(default_factory=list)


class Backend:
    """Base class of external backends; subclasses live one per file in ``tvm_hetero/backends/``."""

    #: Short name; region symbols end with it and patterns are prefixed with it.
    name: str = ""

    def __init__(
        self,
        device: int | None = 0,
        min_flops: float = 0.0,
        devices: Iterable[int] | None = None,
        merge: bool = False,
    ) -> None:
        #: Device position the regions run on; None: the device the placement gives the anchor op.
        self.device = device
        #: With ``device=None``, the positions that can run it (an anchor placed elsewhere stays
        #: with TVM); None: every position.
        self.devices = None if devices is None else frozenset(int(d) for d in devices)
        #: Cost gate: a match doing fewer floating-point operations stays with TVM.
        self.min_flops = min_flops
        #: Join consecutive regions into blocks (:meth:`merges_regions`).
        self.merge = merge
        #: Per region name, a plain model of it that the build checks the backend's result against
        #: (an accelerator's backend fills it at codegen); empty: nothing to check.
        self.reference_models: dict[str, bytes] = {}

    def available(self) -> bool:
        """Whether the backend can run here (e.g. the library was built with it)."""
        return True

    def require_available(self) -> None:
        """Raise an error that says what is missing when the backend cannot run here."""
        if not self.available():
            raise RuntimeError(
                f"backend {self.name!r} is not available: libtvm_hetero was built without it "
                "(for dnnl: apt-get install libdnnl-dev, then rebuild)"
            )

    def follows_placement(self) -> bool:
        """Whether each region goes where the placement puts its anchor op (``device=None``)."""
        return self.device is None

    def runs_on(self, device: int) -> bool:
        """Whether a region whose anchor op is placed on ``device`` may run on it."""
        if self.device is not None:
            return device == self.device
        return self.devices is None or device in self.devices

    def merges_regions(self) -> bool:
        """Whether consecutive regions are joined into blocks (:mod:`.merge_regions`): the
        backend's ``codegen`` then also gets regions described as ``{"op": "block", "steps":
        [...]}``, each step a member's description plus ``args`` (value ids: inputs first, then
        earlier steps' outputs) and ``shape``."""
        return self.merge

    def block_wait_budget(self) -> int:
        """How much work of other devices (elements their ops make) a block may make one of its
        members wait for (:mod:`.merge_regions`). By default none: a block holds a member fed across
        devices only as its source, so work that does not need that input can start without it; a
        backend whose every call costs more than a short wait (a vendor graph execution) allows some."""
        return 0

    def without_blocks(self) -> Backend:
        """A copy that makes one region per match (for callers that cut the graph between nodes
        afterwards, such as pipeline stages: a block would be one node they cannot cut)."""
        out = copy.copy(self)
        out.merge = False
        return out

    def prepare(self, mod: tvm.IRModule, entry: str) -> tvm.IRModule:
        """Rewrite the module before matching (e.g. fold batch norm into convolutions)."""
        return mod

    def patterns(self, is_weight: WeightPredicate) -> list[Any]:
        """``relax.transform.FusionPattern`` list, most specific first; names start with ``<name>.``.

        Each pattern annotates its anchor op (the op whose device a region takes) as ``"anchor"``.
        """
        raise NotImplementedError

    def describe(self, composite: Any, pattern: str) -> dict:
        """The codegen's description of one matched composite function (params = region inputs)."""
        raise NotImplementedError

    def unique_regions(self) -> bool:
        """Whether each call site needs a region function of its own (matching shares one function
        between equal matches): true for a backend that compiles a site's weights into it."""
        return False

    def bind_call_sites(self, func: Any, regions: dict[str, Region], weight_values: dict[str, Any]) -> None:
        """Called once the backend's regions are formed (before blocks): ``func`` is the entry
        function calling them, ``weight_values`` the values of its weight parameters. A backend
        that needs its regions' weight values at build time (to compile them into a vendor graph)
        records them here; the default needs nothing."""

    def build_summary(self, lowered: Any) -> dict | None:
        """What the build report keeps of this backend's work on a lowered graph (an accelerator's
        backend: its vendor's answers, its graphs); None: nothing beyond the regions."""
        return None

    def codegen(self, regions: list[Region]) -> tvm.runtime.Module:
        """A runtime module with one function per region, named ``region.name``.

        It is imported into the kernel library, so it must be binary-serializable to survive
        ``export_library``.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        where = (
            f"device={self.device}" if self.device is not None else f"devices={sorted(self.devices or ())}"
        )
        return f"{type(self).__name__}({where})"
