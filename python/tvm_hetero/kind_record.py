"""The Python half of a device kind: one record, the only thing a new kind adds outside its own package.

Built-in kinds are listed in :mod:`tvm_hetero.devices`; an accelerator reached through a vendor's
SDK brings its record in its own package (``tvm_hetero.<vendor>.KIND``), registered by one line of
:data:`tvm_hetero.devices.VENDOR_PACKAGES` (or by :func:`tvm_hetero.devices.register_kind` from
outside the product). The record names everything the build needs of the vendor as dotted paths
(``"package.module:attribute"``), imported only when a build uses the kind, so listing a kind costs
nothing and a missing vendor library is an error only for those who ask for it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KindRecord:
    """One device kind as the build and the user see it."""

    #: The kind's name, as the C++ record names it (``"cpu"``, ``"cuda"``).
    name: str
    #: TVM's DLDeviceType of its local devices.
    device_type: int
    #: What its TVM kernels compile for; None: it runs no TVM kernels (only a vendor's graphs).
    default_target: str | None
    #: Options a device of this kind gets unless the user gives others (``{"kind": ..., ...}``).
    default_options: dict = field(default_factory=dict)
    #: The extra to install when the kind's vendor library is missing, if any.
    extra: str | None = None
    #: Its tensors are host memory of this process, read in place by the CPUs (an NPU sharing it);
    #: what the C++ half of a kind registered at run time says (built-in kinds have their own).
    host_memory: bool = True
    #: What the user reads for a device of the kind ("Intel GPU"); empty: the kind's name.
    label: str = ""
    #: The backend class that runs the kind's graphs (a kind with no TVM kernels needs one).
    backend: str | None = None
    #: ``build(mod, targets, placement, args, kwargs, wrap, auto) -> artifact``: the build for
    #: targets with this kind (verification of what the vendor computes included); None: the plain one.
    verifier: str | None = None
    #: ``() -> list[DeviceInfo]``: the kind's devices on this machine; None: TVM's own discovery.
    discover: str | None = None
    #: ``() -> str | None``: why the vendor library cannot be used here, or None when it can.
    unavailable: str | None = None
    #: ``(subparsers) -> None``: the vendor's own commands for ``tvm-hetero``.
    cli: str | None = None

    @property
    def display_name(self) -> str:
        return self.label or self.name


def resolve(path: str) -> Any:
    """``"package.module:attribute"`` -> the attribute (imported now)."""
    module, _, attribute = path.partition(":")
    value = importlib.import_module(module)
    for part in filter(None, attribute.split(".")):
        value = getattr(value, part)
    return value
