"""Device kinds: the one place in Python that knows what a device *is*.

Every kind has two halves. The runtime's half (remote or local, asynchronous or not, host memory or
its own, storage offsets, how to wait for it, whether TVM kernels run on it) is the C++ record in
``src/support/device_kinds.cc``, read here through ``tvm_hetero.support.device_kind_traits`` so
the two languages cannot disagree. The Python half below is what only the build and the user need:
the names a device is given by (``"cpu:1"``), its default target and options, and how the machine's
devices of the kind are discovered.

Nothing else in the package compares a ``device_type`` or knows TVM's RPC session mask
(tests/python/test_devices.py checks that). Adding a built-in kind is one C++ record and one
:data:`KINDS` entry here; an accelerator reached through a vendor's SDK is its own package, whose
:class:`~tvm_hetero.kind_record.KindRecord` one line of :data:`VENDOR_PACKAGES` registers
(docs/new-accelerator.md).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi

import tvm_hetero.native  # noqa: F401  (registers the C++ records)

from .kind_record import KindRecord, resolve

SYS_CPU = Path("/sys/devices/system/cpu")


# ---- the kinds ---------------------------------------------------------------------------------
KINDS: dict[str, KindRecord] = {
    record.name: record
    for record in (
        KindRecord("cpu", 1, "llvm"),
        KindRecord("cuda", 2, "cuda"),
        KindRecord("opencl", 4, "opencl"),
        KindRecord("vulkan", 7, "vulkan"),
        KindRecord("metal", 8, "metal"),
        KindRecord("rocm", 10, "rocm"),
    )
}
#: The registry of accelerators reached through a vendor's SDK: each package's ``KIND`` record.
VENDOR_PACKAGES = ("tvm_hetero.qnn",)


def register_kind(record: KindRecord) -> None:
    """Add a kind (before devices of it are used); its C++ half must be registered too
    (``tvm_hetero.support.register_device_kind``) unless it is a built-in one."""
    known = KINDS.get(record.name)
    if known is not None and known != record:
        raise ValueError(f"device kind {record.name!r} is registered already, with another record")
    if any(r.device_type == record.device_type and r.name != record.name for r in KINDS.values()):
        raise ValueError(f"device kind {record.name!r}: device type {record.device_type} belongs to another kind")
    if str(tvm_ffi.get_global_func("tvm_hetero.support.device_kind_traits")(record.device_type)["name"]) != record.name:
        tvm_ffi.get_global_func("tvm_hetero.support.register_device_kind")(
            record.device_type, record.name, record.host_memory, record.default_target is not None)
    KINDS[record.name] = record
    _traits.cache_clear()


#: Kinds whose devices :func:`devices` looks for, after the CPU clusters.
ACCELERATOR_KINDS = ("cuda", "rocm", "metal", "vulkan", "opencl")


@dataclass(frozen=True)
class DeviceKind:
    """Both halves of a kind: the C++ record's facts and the Python record."""

    name: str
    remote: bool
    asynchronous: bool
    host_memory: bool
    offsets_usable: bool
    wait: str
    runs_tvm_kernels: bool
    record: KindRecord | None

    @property
    def default_target(self) -> str | None:
        return self.record.default_target if self.record is not None else None


@functools.cache
def _traits(device_type: int) -> DeviceKind:
    raw = tvm_ffi.get_global_func("tvm_hetero.support.device_kind_traits")(int(device_type))
    name = str(raw["name"])
    record = next((r for r in KINDS.values() if r.device_type == device_type % rpc_session_mask()), None)
    return DeviceKind(
        name=name,
        remote=bool(raw["remote"]),
        asynchronous=bool(raw["asynchronous"]),
        host_memory=bool(raw["host_memory"]),
        offsets_usable=bool(raw["offsets_usable"]),
        wait=str(raw["wait"]),
        runs_tvm_kernels=bool(raw["runs_tvm_kernels"]),
        record=record,
    )


@functools.cache
def rpc_session_mask() -> int:
    """TVM marks a device behind an RPC session by adding multiples of this to its type."""
    return int(tvm_ffi.get_global_func("tvm_hetero.support.rpc_session_mask")())


def kind_of(device: tvm.runtime.Device) -> DeviceKind:
    """The kind of ``device`` (a remote device's kind is ``remote``; see :func:`local_kind`)."""
    return _traits(device.dlpack_device_type())


def local_kind(device: tvm.runtime.Device) -> DeviceKind:
    """The kind of the device under the RPC session, for a remote device; else :func:`kind_of`."""
    return _traits(device.dlpack_device_type() % rpc_session_mask())


def is_remote(device: tvm.runtime.Device) -> bool:
    """A device of another process, reached through a TVM RPC session."""
    return kind_of(device).remote


def is_host(device: tvm.runtime.Device) -> bool:
    """A local device whose tensors are host memory of this process (a CPU, an NPU sharing it)."""
    kind = kind_of(device)
    return kind.host_memory and not kind.remote


def is_cpu(device: tvm.runtime.Device) -> bool:
    """A CPU of this process (it runs host kernels and is timed with a wall clock)."""
    return kind_of(device).name == "cpu"


def shares_memory(a: tvm.runtime.Device, b: tvm.runtime.Device) -> bool:
    """A tensor on ``a`` is read on ``b`` in place (both local kinds with host memory)."""
    return is_host(a) and is_host(b)


def needs_completion_wait(device: tvm.runtime.Device) -> bool:
    """A call returns before the device's work is done: a clock must wait (``device.sync()``) first."""
    return kind_of(device).wait != "return"


def runs_tvm_kernels(device: tvm.runtime.Device) -> bool:
    """Compiled TVM kernels run on it (an accelerator reached through a vendor SDK runs only its graphs)."""
    return kind_of(device).runs_tvm_kernels


def without_session(device: tvm.runtime.Device) -> tvm.runtime.Device:
    """The device as its own process names it (the RPC session's mask removed)."""
    return tvm.runtime.Device(device.dlpack_device_type() % rpc_session_mask(), device.index)


def cost_key(device: str | tvm.runtime.Device) -> str:
    """A device as the cost cache names it: a remote device without its RPC session
    (``remote:cpu(0)``), so a new session to a server of the same target finds what an earlier one
    measured."""
    if isinstance(device, str):
        return device
    if not is_remote(device):
        return name_of(device)
    return "remote:" + str(without_session(device))


def name_of(device: tvm.runtime.Device) -> str:
    """``cpu:1``, ``cuda:0``, ``remote[0]:cpu:0``; a kind with no TVM kernels by its kind's name."""
    if is_remote(device):
        session = device.dlpack_device_type() // rpc_session_mask() - 1
        local = without_session(device)
        return f"remote[{session}]:{name_of(local)}"
    kind = kind_of(device)
    if kind.record is not None and kind.record.default_target is None:
        return f"{kind.record.name}:{device.index}"
    return str(device)


for _package in VENDOR_PACKAGES:
    register_kind(importlib.import_module(_package).KIND)


# ---- device specs --------------------------------------------------------------------------------
@dataclass
class DeviceSpec:
    """One device of a build: the TVM device, what its kernels compile for, the kind's options."""

    device: tvm.runtime.Device
    target: Any
    options: dict = field(default_factory=dict)

    @property
    def kind(self) -> DeviceKind:
        return kind_of(self.device)


def parse_device(spec: Any) -> tvm.runtime.Device:
    """A tvm Device, or a string such as ``"cpu:1"``, ``"cuda"``, ``"cuda:0"`` or a vendor kind's name."""
    if isinstance(spec, tvm.runtime.Device):
        return spec
    if isinstance(spec, str):
        kind, _, index = spec.partition(":")
        record = KINDS.get(kind)
        try:
            number = int(index or 0)
            if record is not None:
                return tvm.runtime.Device(record.device_type, number)
            return tvm.runtime.device(kind, number)
        except (ValueError, KeyError, RuntimeError) as err:
            raise ValueError(f"device {spec!r}: expected KIND[:INDEX], e.g. 'cpu:0' or 'cuda:1' "
                             f"(kinds: {', '.join(KINDS)})") from err
    raise TypeError(f"device must be a tvm Device or a string like 'cpu:1', got {type(spec).__name__}")


def parse_spec(entry: Any) -> DeviceSpec:
    """One entry of a build's ``targets``: ``(device, target)``, a kind name with options
    (``"KIND"``, ``"KIND:1,option=value"``) or a dict ``{"kind": KIND, ...}``."""
    if isinstance(entry, (tuple, list)):
        if len(entry) != 2:
            raise ValueError(f"expected a (device, target) pair, got {entry!r}")
        device = parse_device(entry[0])
        return DeviceSpec(device, entry[1], dict(_record_of(device).default_options) if _record_of(device) else {})
    if isinstance(entry, str):
        name, _, rest = entry.partition(":")
        index, options = 0, {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep and key.isdigit():
                index = int(key)
                continue
            if not sep:
                raise ValueError(f"device {entry!r}: expected KIND[:INDEX][,key=value...], got {item!r}")
            options[key] = _option_value(value)
        entry = {"kind": name, "index": index, **options}
    if isinstance(entry, dict):
        options = dict(entry)
        name = options.pop("kind", None)
        record = KINDS.get(name) if isinstance(name, str) else None
        if record is None:
            raise ValueError(f"device {entry!r}: unknown kind {name!r} (kinds: {', '.join(KINDS)})")
        index = int(options.pop("index", 0))
        target = options.pop("target", record.default_target)
        unknown = sorted(set(options) - set(record.default_options) - {"process"})
        if unknown:
            raise ValueError(f"device {name!r}: unknown option(s) {unknown} (known: "
                             f"{sorted(record.default_options) + ['process']})")
        if options.get("process", "same") not in ("same", "separate"):
            raise ValueError(f"device {name!r}: process {options['process']!r}: expected 'same' or 'separate'")
        merged = {**record.default_options, **options}
        return DeviceSpec(tvm.runtime.Device(record.device_type, index), target, merged)
    raise TypeError(f"a device must be (device, target), a kind's name (e.g. 'cpu:1') or a dict "
                    f"{{'kind': ...}}, got {type(entry).__name__}")


def _record_of(device: tvm.runtime.Device) -> KindRecord | None:
    return local_kind(device).record


def _option_value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def default_target(device: tvm.runtime.Device) -> str | None:
    """What ``device``'s TVM kernels compile for by default (None: it runs none)."""
    record = _record_of(device)
    return record.default_target if record is not None else None


def missing_vendor_library(kind: str) -> str | None:
    """Why a kind's vendor library cannot be used here, or None when it can."""
    record = KINDS.get(kind)
    if record is None or record.unavailable is None:
        return None
    return resolve(record.unavailable)()


# ---- discovery -----------------------------------------------------------------------------------
@dataclass
class DeviceInfo:
    """One device: its TVM device, the target to compile for, and its executor settings."""

    device: tvm.runtime.Device
    target: str | None
    options: dict | None
    description: str

    def __str__(self) -> str:
        return f"{name_of(self.device)}: {self.description} (target {self.target}, options {self.options})"


def _core_rank(core: int, sys_cpu: Path) -> int | None:
    for path in (sys_cpu / f"cpu{core}" / "cpufreq" / "cpuinfo_max_freq", sys_cpu / f"cpu{core}" / "cpu_capacity"):
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def cpu_clusters(cores: list[int] | None = None, sys_cpu: Path = SYS_CPU) -> list[list[int]]:
    """Allowed cores grouped by maximum frequency (or capacity), fastest group first; one group when
    the OS says nothing (or says the same for every core).

    Cores are grouped by ``/sys/devices/system/cpu/cpu*/cpufreq/cpuinfo_max_freq``, or else by
    ``cpu_capacity`` (Arm big.LITTLE / DynamIQ report both); only the cores this process may run on
    (its affinity mask) are counted."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    ranks = {c: _core_rank(c, sys_cpu) for c in cores}
    if any(r is None for r in ranks.values()):
        return [cores]
    groups: dict[int, list[int]] = {}
    for core in cores:
        groups.setdefault(ranks[core], []).append(core)
    return [groups[r] for r in sorted(groups, reverse=True)]


def _discover_accelerators(kind: str) -> list[DeviceInfo]:
    found = []
    for index in range(8):
        try:
            dev = tvm.runtime.device(kind, index)
            if not dev.exist:
                break
        except (RuntimeError, ValueError):  # a runtime TVM was built without
            break
        found.append(DeviceInfo(dev, KINDS[kind].default_target, None, f"{kind} GPU {index} ({dev.device_name})"))
    return found


def vendor_kinds() -> list[KindRecord]:
    """The kinds reached through a vendor's SDK (their records name a backend)."""
    return [record for record in KINDS.values() if record.backend is not None]


#: How each kind's devices are found (the CPU clusters come first: the fastest is the primary).
DISCOVERY: dict[str, Callable[[], list[DeviceInfo]]] = {
    kind: functools.partial(_discover_accelerators, kind) for kind in ACCELERATOR_KINDS}


def devices() -> list[DeviceInfo]:
    """The devices of this machine, the primary (fastest CPU cluster) first: one ``cpu:k`` per
    CPU cluster (``{"cores": [...], "num_threads": len(cores)}``), then the GPUs TVM sees, then each
    vendor kind's devices that its SDK finds here."""
    found = [DeviceInfo(tvm.cpu(k), "llvm", {"cores": cores, "num_threads": len(cores)},
                        f"CPU cluster of {len(cores)} core(s) {cores}")
             for k, cores in enumerate(cpu_clusters())]
    for kind in ACCELERATOR_KINDS:
        found.extend(DISCOVERY[kind]())
    for record in vendor_kinds():
        if record.discover is not None:
            found.extend(resolve(record.discover)())
    return found


def default_devices() -> list[tuple[str, str]]:
    """The CLI's devices when none are given: cpu:0 + cuda:0 where a GPU exists, else two CPU
    devices (cpu:0 + cpu:1)."""
    gpus = DISCOVERY["cuda"]()
    if gpus:
        return [("cpu:0", "llvm"), ("cuda:0", "cuda")]
    return [("cpu:0", "llvm"), ("cpu:1", "llvm")]


class _CallableModule(types.ModuleType):
    """``tvm_hetero.devices`` is this module, and ``tvm_hetero.devices()`` lists the devices."""

    def __call__(self) -> list[DeviceInfo]:
        return devices()


sys.modules[__name__].__class__ = _CallableModule
