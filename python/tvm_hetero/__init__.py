"""tvm-hetero: heterogeneous execution for Apache TVM.

``build`` compiles a Relax IRModule for several devices; ``graph_runtime.create`` runs the result.
Importing the package loads the runtime library (libtvm_hetero.so).

Layers (arrows point down): ``build_driver`` (``build``: routing, measured checks, verified
offload) sits on ``artifact`` (and ``pipeline``, its pipeline face), which joins
``compiler/`` (Relax module -> graph JSON, kernels, params; never imports the runtime) and
``runtime/`` (graph and pipeline runtimes, offload, rpc, library loading); ``importers`` brings
ONNX and PyTorch models in. ``testing/`` (model fixtures and test oracles: import
``tvm_hetero.testing.models`` yourself; the package never loads it) and ``cli`` sit on top.
"""

from __future__ import annotations

import sys

from . import devices, importers, pipeline
from .artifact import Artifact, PipelineArtifact, load
from .build_driver import build
from .build_info import BuildInfo, built_with
from .compiler.build import BuildReport
from .compiler.placement import Capabilities, OpInfo
from .ep_offload import region_runner  # noqa: F401  (registers the runner accelerator regions call)
from .progress import Progress
from .runtime import graph_runtime, offload, pipeline_runtime, rpc, timeline

#: "0.1.0+tvm0.27.0.post1.onednn2.6.3": the package version and, as a local label, what the loaded
#: runtime library was built with (``built_with()`` has the details).
__version__ = built_with().version

# The names these modules had before the package was layered (``import tvm_hetero.rpc``) keep working.
for _module in (graph_runtime, offload, pipeline_runtime, rpc, timeline):
    sys.modules.setdefault(f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}", _module)
del _module

__all__ = [
    "Artifact",
    "BuildInfo",
    "BuildReport",
    "Capabilities",
    "OpInfo",
    "PipelineArtifact",
    "Progress",
    "build",
    "built_with",
    "devices",
    "graph_runtime",
    "importers",
    "load",
    "pipeline",
    "pipeline_runtime",
    "rpc",
]
