"""What this install of tvm-hetero was built with: the package version, the apache-tvm release, the
oneDNN built in (or none) and the backends, as the runtime library itself reports them
(src/build_info.cc). An installed wheel therefore answers for itself, wherever it is installed.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi

from .native import LOADED_LIBRARY

#: What a library built without oneDNN means for the user: the line the build report and
#: ``tvm-hetero --version`` print.
ONEDNN_MISSING = (
    "oneDNN: not built in: CPU convolutions and matmuls run as untuned TVM kernels, many times slower "
    "(ResNet-50: 36x); install the wheel (scripts/wheel.sh) or rebuild with oneDNN "
    "(apt-get install libdnnl-dev)"
)


@dataclass(frozen=True)
class BuildInfo:
    """How the loaded libtvm_hetero.so was built, and what it loaded."""

    package: str
    """tvm-hetero's version (pyproject.toml at build time)."""
    tvm: str
    """The apache-tvm release the library was compiled against."""
    onednn: str | None
    """The oneDNN version compiled in (its headers); None: built without oneDNN."""
    backends: tuple[str, ...]
    """External backends compiled into the library."""
    library: Path
    """The libtvm_hetero.so this process loaded."""

    @property
    def version(self) -> str:
        """The package version with a PEP 440 local label naming the build, as torch's "2.13.0+cpu"
        does: ``0.1.0+tvm0.27.0.post1.onednn2.6.3``, or ``...onednn.none`` without oneDNN."""
        onednn = f"onednn{self.onednn}" if self.onednn else "onednn.none"
        return f"{self.package}+tvm{self.tvm}.{onednn}"

    def describe(self) -> str:
        """The lines of ``tvm-hetero --version``."""
        lines = [f"tvm-hetero {self.package} ({self.library})"]
        running = _installed_version("apache-tvm")
        tvm_line = f"TVM: apache-tvm {self.tvm}"
        if running and running != self.tvm:
            tvm_line += f" (built against it; {running} is installed: rebuild tvm-hetero for it)"
        lines.append(tvm_line)
        if self.onednn:
            loaded = onednn_library()
            lines.append(f"oneDNN: {self.onednn}, loaded from {loaded or 'nowhere yet'}")
        else:
            lines.append(ONEDNN_MISSING)
        lines.append(f"backends built in: {', '.join(self.backends)}")
        return "\n".join(lines)


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def onednn_library() -> Path | None:
    """The oneDNN shared library mapped into this process (the wheel's own copy, or the system's
    for a source build), read from /proc/self/maps; None when none is mapped or on other systems."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1]
        if "/libdnnl" in path:
            return Path(path)
    return None


@functools.cache
def built_with() -> BuildInfo:
    """What the loaded runtime library was built with (asked once per process)."""
    found = tvm_ffi.get_global_func("tvm_hetero.build_info", allow_missing=True)
    if found is None:  # a library built from an older checkout (a stale build/ beside the sources)
        raise ImportError(f"tvm_hetero: the runtime library {LOADED_LIBRARY} predates this package (it has no "
                          "tvm_hetero.build_info); rebuild it (cmake --build build, or pip install .)")
    raw = found()
    return BuildInfo(
        package=str(raw["package"]),
        tvm=str(raw["tvm"]),
        onednn=str(raw["onednn"]) or None,
        backends=tuple(str(b) for b in raw["backends"]),
        library=LOADED_LIBRARY,
    )
