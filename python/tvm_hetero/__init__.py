"""tvm-hetero: heterogeneous execution for Apache TVM.

``build`` compiles a Relax IRModule for several devices; ``graph_runtime.create`` runs the result.
Importing the package loads the runtime library (libtvm_hetero.so).
"""

from . import (
    _lib,  # noqa: F401
    graph_runtime,
    pipeline,
)
from .compiler.build import Artifact, BuildReport, build, load
from .compiler.placement import Capabilities, OpInfo
from .device_discovery import devices

__all__ = ["Artifact", "BuildReport", "Capabilities", "OpInfo", "build", "devices", "graph_runtime", "load", "pipeline"]
