"""Find and load libtvm_hetero.so, which registers the runtime's global functions with TVM."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import tvm  # noqa: F401  (libtvm_runtime must be loaded before our library)

_PACKAGE_DIR = Path(__file__).resolve().parent  # tvm_hetero/
LIBRARY_NAME = "libtvm_hetero.so"


def library_path() -> Path:
    """Where the runtime library is: $TVM_HETERO_LIBRARY, the installed wheel, or a source build."""
    candidates = []
    if os.environ.get("TVM_HETERO_LIBRARY"):
        candidates.append(Path(os.environ["TVM_HETERO_LIBRARY"]))
    candidates.append(_PACKAGE_DIR / "lib" / LIBRARY_NAME)
    candidates.append(_PACKAGE_DIR.parent.parent / "build" / LIBRARY_NAME)  # source checkout
    for path in candidates:
        if path.is_file():
            return path
    raise ImportError(
        f"{LIBRARY_NAME} not found (looked in {', '.join(map(str, candidates))}); "
        "install the package with `pip install .` or build it with CMake"
    )


def load_library(path: Path) -> ctypes.CDLL:
    # RTLD_GLOBAL: its dependencies (oneDNN, OpenMP) join the global scope, where the library looks
    # up omp_set_num_threads at run time.
    return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


#: The runtime library this process loaded.
LOADED_LIBRARY = library_path()
_LIB = load_library(LOADED_LIBRARY)
