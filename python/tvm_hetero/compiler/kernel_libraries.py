"""One kernel library per architecture: a device whose target is another instruction set (an ARM
board driven from an x86 host) gets its own library, exported with that target's cross toolchain.

Guarantee: the host library (``Artifact.lib``, ``lib.so``) holds only kernels of devices whose
target's architecture is the build machine's, so the host's ``g++`` can link it; each device of a
foreign architecture has a :class:`DeviceLibrary` (devices with equal targets share one) that is
compiled for its target, linked with ``<arch>-linux-gnu-g++`` (else ziglang's ``zig cc``) and
uploaded to that device's RPC session when a runtime is created. Artifacts without foreign devices
keep their one-library layout.

A device of a foreign architecture cannot be local (this process cannot execute its kernels):
:func:`tvm_hetero.runtime.graph_runtime.check_local_devices` raises naming
the device. Failures to compile or link name the device
and its target.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from ..devices import name_of
from ..toolchain import host_architecture, normalize_arch, zig_linker
from .compile_kernels import compile_kernels
from .lower import LoweredGraph

# Target kinds whose code runs on a CPU of the target's triple; other kinds (cuda, ...) run their
# host code on the build machine's CPU.
_CPU_KINDS = ("llvm", "c")


def target_architecture(target: tvm.target.Target) -> str:
    """The instruction set a target's kernels run on (first part of its ``mtriple``)."""
    if target.kind.name in _CPU_KINDS:
        triple = str(target.attrs.get("mtriple", "") or "")
        if triple:
            return normalize_arch(triple.split("-", 1)[0])
    return host_architecture()


def cross_compiler_name(target: tvm.target.Target) -> str:
    """The linker driver for a target's architecture: Debian's ``<arch>-linux-gnu-g++``."""
    return f"{target_architecture(target)}-linux-gnu-g++"


@dataclass
class DeviceLibrary:
    """The kernels of the devices ``devices`` (one foreign target), built or loaded from a file."""

    devices: list[int]
    target: str  # the target as JSON text (str(Target))
    arch: str
    module: tvm.runtime.Module | None = None  # compiled in this process (not loadable here)
    path: Path | None = None  # exported file (a loaded artifact)
    device_names: list[str] = field(default_factory=list)

    def describe(self) -> str:
        names = self.device_names or [""] * len(self.devices)
        listed = ", ".join(f"{d} ({n})" if n else str(d) for d, n in zip(self.devices, names))
        return f"device {listed} with target {self.target_kind()} for {self.arch}"

    def target_kind(self) -> str:
        """Short form for messages, e.g. ``llvm -mtriple=aarch64-linux-gnu``."""
        if not self.target:
            return "?"
        target = tvm.target.Target(self.target)
        triple = target.attrs.get("mtriple", "")
        return f"{target.kind.name} -mtriple={triple}" if triple else target.kind.name

    def file_name(self) -> str:
        return f"lib.{self.arch}.dev{self.devices[0]}.so"

    def export(self, path: str | os.PathLike) -> Path:
        """Link the kernels into the shared library ``path`` with the target's cross toolchain."""
        out = Path(path)
        if self.module is None:
            if self.path is None:
                raise ValueError(f"{self.describe()}: the library has neither a module nor a file")
            shutil.copyfile(self.path, out)
            return out
        target = tvm.target.Target(self.target)
        compiler = cross_compiler_name(target)
        if shutil.which(compiler) is not None:
            from tvm.support.cc import cross_compiler

            fcompile = cross_compiler(compiler)
        elif (zig := zig_linker(self.arch)) is not None:  # no cross toolchain: ziglang's (toolchain.py)
            compiler, fcompile = zig.describe(), zig.fcompile()
        else:
            raise RuntimeError(
                f"{self.describe()}: cross compiler {compiler} not found on PATH (Debian: apt-get install "
                f"g++-{self.arch.replace('_', '-')}-linux-gnu, or pip install ziglang)"
            )
        try:
            self.module.export_library(str(out), fcompile=fcompile)
        except Exception as error:  # the toolchain's message, with the device and target in front
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise RuntimeError(
                f"{self.describe()}: exporting its kernels with {compiler} failed: {first}"
            ) from error
        return out

    def upload(self, session, cache: dict) -> tvm.runtime.Module:
        """This library loaded in ``session``'s process (uploaded once per session)."""
        key = (id(session), id(self))
        if key not in cache:
            # A fresh remote name each time: overwriting a library the remote process has mapped would crash it.
            name = f"tvm_hetero_{self.arch}_kernels_{uuid.uuid4().hex}.so"
            with tempfile.TemporaryDirectory() as tmp:
                local = self.path if self.module is None and self.path is not None else self.export(Path(tmp) / name)
                session.upload(str(local), target=name)
            try:
                cache[key] = session.load_module(name)
            except Exception as error:
                raise RuntimeError(
                    f"{self.describe()}: the remote process could not load the library (is the remote "
                    f"device an {self.arch} machine?): {error}"
                ) from error
        return cache[key]

    def manifest_entry(self, file_name: str) -> dict:
        return {"file": file_name, "devices": self.devices, "target": self.target, "arch": self.arch}


def compile_kernel_libraries(
    lowered: LoweredGraph, targets: Sequence[tvm.target.Target], devices: Sequence[tvm.runtime.Device]
) -> tuple[tvm.runtime.Module, dict[int, DeviceLibrary]]:
    """The host library (devices of the build machine's architecture) and, per foreign device, its library."""
    host_arch = host_architecture()
    arch = [target_architecture(t) for t in targets]
    local = [d for d in range(len(targets)) if arch[d] == host_arch]
    foreign: dict[str, list[int]] = {}
    for d in range(len(targets)):
        if arch[d] != host_arch:
            foreign.setdefault(str(targets[d]), []).append(d)
    if not foreign:
        return compile_kernels(lowered, targets), {}
    for region in lowered.regions.values():
        if arch[region.device] != host_arch:
            raise ValueError(
                f"backend {region.backend}: a region is placed on device {region.device} ({name_of(devices[region.device])}) "
                f"whose target is for {arch[region.device]}; external backends run only on {host_arch} devices"
            )
    if arch[0] != host_arch:  # fallbacks, copies and outputs live there
        raise ValueError(
            f"device 0 ({name_of(devices[0])}) is the primary device and runs in this process: its target must be for "
            f"{host_arch}, not {arch[0]} (put the {arch[0]} device at another position)"
        )
    host = compile_kernels(lowered, targets, only_devices=local)
    libraries: dict[int, DeviceLibrary] = {}
    for target_text, group in foreign.items():
        module = compile_kernels(lowered, targets, only_devices=group)
        library = DeviceLibrary(devices=group, target=target_text, arch=arch[group[0]], module=module,
                                device_names=[name_of(devices[d]) for d in group])
        for d in group:
            libraries[d] = library
    return host, libraries


def distinct(libraries: Mapping[int, DeviceLibrary]) -> list[DeviceLibrary]:
    """Each library once, in device order."""
    seen: dict[int, DeviceLibrary] = {}
    for _device, library in sorted(libraries.items()):
        seen.setdefault(id(library), library)
    return list(seen.values())


def export_device_libraries(libraries: Mapping[int, DeviceLibrary], out: Path) -> dict[str, Any]:
    """Write each foreign library into ``out``; the manifest's ``libraries`` section."""
    entries = []
    for library in distinct(libraries):
        name = library.file_name()
        library.export(out / name)
        entries.append(library.manifest_entry(name))
    return {"host_arch": host_architecture(), "device_libraries": entries}


def load_device_libraries(manifest: Mapping[str, Any], src: Path) -> dict[int, DeviceLibrary]:
    """The foreign libraries a manifest lists (kept as files: this machine cannot load them)."""
    libraries: dict[int, DeviceLibrary] = {}
    for entry in manifest.get("device_libraries", []):
        path = src / entry["file"]
        if not path.is_file():
            raise FileNotFoundError(
                f"{src}: the library {entry['file']} of device(s) {entry['devices']} (target for {entry['arch']}) "
                "is missing"
            )
        library = DeviceLibrary(devices=list(entry["devices"]), target=entry["target"], arch=entry["arch"], path=path)
        for d in library.devices:
            libraries[d] = library
    return libraries
