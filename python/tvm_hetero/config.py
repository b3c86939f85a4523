"""Where the installed wheel keeps what C++ programs build against (as ``python -m tvm_ffi.config`` does):

    python -m tvm_hetero.config --cmakedir     # for find_package(tvm_hetero CONFIG PATHS ...)
    python -m tvm_hetero.config --includedir   # the public headers (tvm_hetero/graph_runtime.h, ...)
    python -m tvm_hetero.config --libdir       # libtvm_hetero.so

Each prints one folder; a folder the installation lacks (a source checkout: build with CMake from the
source tree instead) is an error naming it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def cmake_dir() -> Path:
    """The folder of ``tvm_heteroConfig.cmake`` (defines ``tvm_hetero::tvm_hetero``)."""
    return PACKAGE_DIR / "share" / "cmake" / "tvm_hetero"


def include_dir() -> Path:
    """The folder holding ``tvm_hetero/*.h``."""
    return PACKAGE_DIR / "include"


def library_dir() -> Path:
    """The folder holding ``libtvm_hetero.so``."""
    return PACKAGE_DIR / "lib"


FOLDERS = {"--cmakedir": cmake_dir, "--includedir": include_dir, "--libdir": library_dir}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_hetero.config", description=__doc__.split("\n")[0])
    for flag, folder in FOLDERS.items():
        parser.add_argument(flag, action="store_true", help=folder.__doc__)
    args = parser.parse_args(argv)
    asked = [flag for flag in FOLDERS if getattr(args, flag[2:])]
    if not asked:
        parser.print_help()
        return 2
    for flag in asked:
        path = FOLDERS[flag]()
        if not path.is_dir():
            print(f"{flag}: {path} is missing: this tvm_hetero is not an installed wheel "
                  "(build C++ programs from the source tree with CMake instead)", file=sys.stderr)
            return 1
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
