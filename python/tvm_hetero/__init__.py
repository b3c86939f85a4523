"""tvm-hetero: heterogeneous execution for Apache TVM.

``build`` compiles a Relax IRModule for several devices; ``graph_runtime.create`` runs the result.
Importing the package loads the runtime library (libtvm_hetero.so).

Layers (arrows point down): ``artifact`` (and ``pipeline``, its pipeline face) joins
``compiler/`` (Relax module -> graph JSON, kernels, params; never imports the runtime) and
``runtime/`` (graph and pipeline runtimes, offload, rpc, library loading). ``testing/`` holds
model fixtures and test oracles; ``cli`` the command line.
"""

from __future__ import annotations

import sys

from . import devices, pipeline
from .artifact import Artifact, PipelineArtifact, build, load
from .compiler.build import BuildReport
from .compiler.placement import Capabilities, OpInfo
from .progress import Progress
from .runtime import graph_runtime, offload, pipeline_runtime, rpc, timeline
from .testing import models

# The names these modules had before the package was layered (``import tvm_hetero.rpc``,
# ``from tvm_hetero.models import mlp``) keep working.
for _module in (graph_runtime, offload, pipeline_runtime, rpc, timeline, models):
    sys.modules.setdefault(f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}", _module)
del _module

__all__ = [
    "Artifact",
    "BuildReport",
    "Capabilities",
    "OpInfo",
    "PipelineArtifact",
    "Progress",
    "build",
    "devices",
    "graph_runtime",
    "load",
    "models",
    "pipeline",
    "pipeline_runtime",
    "rpc",
]
