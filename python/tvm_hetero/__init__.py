"""tvm-hetero: heterogeneous execution for Apache TVM.

Importing the package loads the runtime library (libtvm_hetero.so).
"""

from . import _lib  # noqa: F401
from . import graph_runtime

__all__ = ["graph_runtime"]
