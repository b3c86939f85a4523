"""Op-level placement: which device each Relax op call runs on.

The lowering (:mod:`tvm_hetero.compiler.lower`) describes every Relax op call of the entry
function by an :class:`OpInfo` and asks a placement function for a device index. A placement is
given in one of four forms and turned into such a function by :func:`resolve_placement`:

- ``None``: respect the device annotations in the IR (``R.hint_on_device`` / vdevices, see
  :attr:`OpInfo.annotated_device`); unannotated ops run on device 0.
- ``{op_name: device}``: ops by name (``"relax.nn.conv2d"``, ``"nn.conv2d"`` or ``"conv2d"``);
  ops not named run on device 0.
- a callable ``(OpInfo) -> int``.
- :class:`Capabilities`: "device k supports these ops" (a set of names or a predicate per
  device, BYOC style). An op goes to the first listed device that supports it; an op no listed
  device supports falls back to device 0, with a warning and a :class:`Fallback` record.

Every placement function checks that the index lies in ``[0, num_devices)`` and raises
ValueError naming the op otherwise.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import tvm

Shape = tuple[int, ...]
OpPredicate = Callable[["OpInfo"], bool]


@dataclass
class OpInfo:
    """What a placement policy knows about one Relax op call."""

    #: Relax op name, e.g. ``"relax.nn.conv2d"`` (``"relax.call_tir"`` for a direct kernel call).
    op: str
    #: Position among the entry function's op calls, in the original binding order.
    index: int
    #: Name of the variable the call is bound to.
    name: str
    #: Shape of each argument; None for an argument that is not a tensor (tuple, shape, ...).
    input_shapes: list[Shape | None]
    #: Shape of the result; a tuple of shapes for an op returning a tuple.
    output_shape: Shape | tuple[Shape | None, ...] | None
    #: dtype of the result (of its first field for a tuple result).
    dtype: str | None
    #: Device the IR asks for (``hint_on_device`` / vdevice), as a position; None if unannotated.
    annotated_device: int | None = None
    #: The Relax call itself, for predicates that need its attributes.
    call: Any = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        return f"{self.op} '{self.name}' (op #{self.index})"


@dataclass
class Fallback:
    """An op that no capable device supports, placed on the fallback device instead."""

    op: str
    index: int
    name: str
    device: int


PlacementSpec = Union[None, Mapping[str, int], Callable[[OpInfo], int], "Capabilities", "Placement"]


class Placement:
    """A resolved placement: ``placement(info) -> device``, validated; fallbacks are recorded."""

    def __init__(
        self,
        choose: Callable[[OpInfo], int],
        num_devices: int,
        describe: str = "",
        fallbacks: list[Fallback] | None = None,
    ) -> None:
        if num_devices < 1:
            raise ValueError(f"num_devices must be at least 1, got {num_devices}")
        self._choose = choose
        self.num_devices = num_devices
        self.describe = describe
        #: Ops placed on the fallback device because no device supports them (Capabilities).
        self.fallbacks: list[Fallback] = [] if fallbacks is None else fallbacks

    def __call__(self, info: OpInfo) -> int:
        device = self._choose(info)
        if isinstance(device, bool) or not isinstance(device, int):
            try:
                device = int(device)  # numpy integers
            except (TypeError, ValueError):
                raise ValueError(
                    f"placement returned {device!r} for {info}; expected a device index"
                ) from None
        if not 0 <= device < self.num_devices:
            raise ValueError(
                f"placement put {info} on device {device}, outside [0, {self.num_devices}) "
                f"for {self.num_devices} device(s)"
            )
        return device

    def __repr__(self) -> str:
        return f"Placement({self.describe}, num_devices={self.num_devices})"


class Capabilities:
    """Which ops each device supports: ``Capabilities({1: {"relax.nn.conv2d", "matmul"}})``.

    Each value is an iterable of op names (long or short, as for a dict placement) or a
    predicate ``(OpInfo) -> bool``. An op goes to the first device, in the mapping's order, that
    supports it; an op that none supports goes to ``fallback`` (device 0 by default), and each
    such op is warned about and recorded in :attr:`Placement.fallbacks`. A device that appears
    in the mapping but supports nothing is simply never chosen.
    """

    def __init__(self, supported: Mapping[int, Iterable[str] | OpPredicate], fallback: int = 0) -> None:
        self.fallback = fallback
        self.checks: list[tuple[int, OpPredicate]] = []
        for device, spec in supported.items():
            if callable(spec):
                self.checks.append((int(device), spec))
            else:
                if isinstance(spec, str):
                    raise TypeError(f"device {device}: give a set of op names, not the string {spec!r}")
                matcher = OpNameMatcher({name: True for name in spec})
                self.checks.append((int(device), lambda info, m=matcher: m.lookup(info.op) is not None))

    def choose(self, info: OpInfo, fallbacks: list[Fallback]) -> int:
        for device, supports in self.checks:
            if supports(info):
                return device
        record = Fallback(info.op, info.index, info.name, self.fallback)
        fallbacks.append(record)
        warnings.warn(
            f"no device supports {info}; it falls back to device {self.fallback}",
            RuntimeWarning,
            stacklevel=2,
        )
        return self.fallback

    def __repr__(self) -> str:
        return f"Capabilities(devices={[d for d, _ in self.checks]}, fallback={self.fallback})"


class OpNameMatcher:
    """Looks up Relax op names in a mapping whose keys may be long or short names.

    ``"relax.nn.conv2d"`` matches the key ``"relax.nn.conv2d"``, then ``"nn.conv2d"``, then
    ``"conv2d"`` (the first present wins). Every key must name a registered Relax op.
    """

    def __init__(self, mapping: Mapping[str, Any]) -> None:
        known = [name for name in tvm.ir.Op.list_op_names() if name.startswith("relax.")]
        for key in mapping:
            if not isinstance(key, str):
                raise TypeError(f"op names must be strings, got {key!r}")
            if not any(key in _short_names(name) for name in known):
                raise ValueError(f"'{key}' names no Relax op (expected e.g. 'relax.nn.conv2d' or 'conv2d')")
        self.mapping = dict(mapping)

    def lookup(self, op_name: str) -> Any:
        for key in _short_names(op_name):
            if key in self.mapping:
                return self.mapping[key]
        return None


def _short_names(op_name: str) -> list[str]:
    """``"relax.nn.conv2d"`` -> ``["relax.nn.conv2d", "nn.conv2d", "conv2d"]``, longest first."""
    parts = op_name.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def resolve_placement(placement: PlacementSpec, num_devices: int) -> Placement:
    """Turn any accepted placement form into a validated ``(OpInfo) -> device`` function."""
    if isinstance(placement, Placement):
        if placement.num_devices != num_devices:
            raise ValueError(f"placement was resolved for {placement.num_devices} devices, not {num_devices}")
        return placement
    if placement is None:
        return Placement(_annotated_or_zero, num_devices, "annotations")
    if isinstance(placement, Capabilities):
        if not 0 <= placement.fallback < num_devices:
            raise ValueError(f"fallback device {placement.fallback} is outside [0, {num_devices})")
        fallbacks: list[Fallback] = []
        return Placement(
            lambda info: placement.choose(info, fallbacks), num_devices, repr(placement), fallbacks
        )
    if isinstance(placement, Mapping):
        matcher = OpNameMatcher(placement)

        def by_name(info: OpInfo) -> int:
            device = matcher.lookup(info.op)
            return 0 if device is None else device

        return Placement(by_name, num_devices, f"by op name {dict(placement)}")
    if callable(placement):
        return Placement(placement, num_devices, getattr(placement, "__name__", repr(placement)))
    raise TypeError(
        "placement must be None, a dict of op names to devices, a callable or Capabilities; "
        f"got {placement!r}"
    )


def _annotated_or_zero(info: OpInfo) -> int:
    return 0 if info.annotated_device is None else info.annotated_device
