"""The program that links kernel objects into a shared library (``lib.so``), for TVM's ``export_library``.

TVM compiles kernels to object files itself (LLVM, in process); only the last step, linking them and
the packed imports (oneDNN and accelerator regions) into a ``.so``, runs an outside program. TVM looks for
``g++``/``gcc``/... on PATH and, on a machine with none, fails with a ``TypeError`` about ``None``.

Guarantee: :func:`linker` makes one deterministic choice, the first of

1. ``$TVM_HETERO_CC``: ``zig`` for the ``ziglang`` package's, or a compiler command (``"g++"``,
   ``"clang++ -fuse-ld=lld"``) for this machine's architecture;
2. the system's compiler, as TVM itself picks it: ``$CXX`` or ``$CC``, else the first of ``g++``,
   ``gcc``, ``clang++``, ``clang``, ``c++``, ``cc`` on PATH (what artifacts have always been linked
   with; it needs no first-use set-up);
3. ``zig cc`` from the ``ziglang`` package, a dependency of the wheel: clang and lld with the C
   library stubs of every target in one pip package, no system compiler, linker or sysroot needed
   (its first link for a target prepares that target's stubs, then they are cached in zig's cache);

or raises :class:`LinkerNotFoundError` naming what to install. A foreign architecture (a board's
kernels) is linked by ``<arch>-linux-gnu-g++`` when on PATH, else by ``zig cc -target
<arch>-linux-gnu``. This module imports neither the compiler nor the runtime: both use it.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Selects the linker: a compiler command, or ``zig`` for the ziglang package's.
ENV_VAR = "TVM_HETERO_CC"
#: TVM's own search order for a system compiler (tvm.support.cc.get_cc).
SYSTEM_COMPILERS = ("g++", "gcc", "clang++", "clang", "c++", "cc")
#: What to install when nothing links (pyproject.toml pins the same ziglang).
INSTALL_HINT = "pip install ziglang==0.17.1 (tvm-hetero's wheel depends on it), or a C compiler (apt-get install g++)"

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}


class LinkerNotFoundError(RuntimeError):
    """No program on this machine can link a shared library."""


@dataclass(frozen=True)
class Linker:
    """A linker driver: ``command`` + ``-shared -fPIC -o OUT OBJECTS OPTIONS`` makes a shared library."""

    #: The driver and its fixed leading arguments (``[".../zig", "cc", "-target", "x86_64-linux-gnu"]``).
    command: tuple[str, ...]
    #: Where the choice came from: ``$TVM_HETERO_CC``, ``$CXX``, ``PATH``, ``ziglang``.
    source: str

    def describe(self) -> str:
        return f"{shlex.join(self.command)} (from {self.source})"

    def link_shared(self, output: str, objects: Sequence[str], options: Sequence[str] | None = None) -> None:
        """Link ``objects`` into the shared library ``output``; a failure raises with the tool's output."""
        cmd = [*self.command, "-shared", "-fPIC", "-o", output, *objects, *(options or [])]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as err:
            raise RuntimeError(f"linking {output} with {self.describe()} failed: {err}") from None
        if done.returncode != 0:
            raise RuntimeError(
                f"linking {output} with {self.describe()} failed (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr).strip()[-3000:]}\ncommand: {shlex.join(cmd)}"
            )

    def fcompile(self) -> Callable[..., None]:
        """The ``fcompile`` argument of ``tvm.runtime.Module.export_library``."""

        def fcompile(output: str, objects: Sequence[str], options: Sequence[str] | None = None, **_: object) -> None:
            self.link_shared(output, objects, options)

        fcompile.output_format = "so"  # type: ignore[attr-defined]
        return fcompile


def normalize_arch(name: str) -> str:
    """``arm64`` → ``aarch64``, ``amd64`` → ``x86_64``."""
    name = name.lower()
    return _ARCH_ALIASES.get(name, name)


def host_architecture() -> str:
    """This machine's instruction set, e.g. ``"x86_64"``."""
    return normalize_arch(platform.machine())


def zig_executable() -> Path | None:
    """The ``zig`` binary of the installed ``ziglang`` package (found without importing it), or None."""
    spec = importlib.util.find_spec("ziglang")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        zig = Path(folder) / "zig"
        if zig.is_file() and os.access(zig, os.X_OK):
            return zig
    return None


def zig_linker(arch: str | None = None) -> Linker | None:
    """``zig cc`` for ``<arch>-linux-gnu`` (default: this machine's), or None without ziglang."""
    zig = zig_executable()
    if zig is None:
        return None
    return Linker((str(zig), "cc", "-target", f"{normalize_arch(arch or host_architecture())}-linux-gnu"),
                  "ziglang")


def system_compiler() -> Linker | None:
    """The compiler TVM itself would pick: ``$CXX``/``$CC``, else the first of SYSTEM_COMPILERS on PATH."""
    for var in ("CXX", "CC"):
        if os.environ.get(var, "").strip():
            return Linker(tuple(shlex.split(os.environ[var])), f"${var}")
    for name in SYSTEM_COMPILERS:
        found = shutil.which(name)
        if found:
            return Linker((found,), "PATH")
    return None


def linker(arch: str | None = None) -> Linker:
    """The linker for kernels of ``arch`` (default: this machine's), chosen by the rule at the top."""
    arch = normalize_arch(arch or host_architecture())
    chosen = os.environ.get(ENV_VAR, "").strip()
    if chosen == "zig":
        found = zig_linker(arch)
        if found is None:
            raise LinkerNotFoundError(f"${ENV_VAR}=zig but the ziglang package is not installed: {INSTALL_HINT}")
        return Linker(found.command, f"${ENV_VAR}")
    if chosen and arch == host_architecture():  # a compiler command links this machine's kernels only
        return Linker(tuple(shlex.split(chosen)), f"${ENV_VAR}")
    if arch == host_architecture():
        found = system_compiler()
        tried = f"no ${ENV_VAR}, $CXX or $CC, none of {', '.join(SYSTEM_COMPILERS)} on PATH"
    else:
        cross = f"{arch}-linux-gnu-g++"
        found = Linker((shutil.which(cross),), "PATH") if shutil.which(cross) else None
        tried = f"no ${ENV_VAR}, no {cross} on PATH"
    found = found or zig_linker(arch)
    if found is None:
        raise LinkerNotFoundError(
            f"no linker for {arch} shared libraries ({tried}, and the ziglang package is not installed): "
            f"{INSTALL_HINT}"
        )
    return found
