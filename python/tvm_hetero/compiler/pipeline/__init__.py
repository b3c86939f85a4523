"""Pipeline splitting: the kernel order, its cost model and DP, stage graphs, and the pipeline build."""

from .auto_split import MeasureKernels, auto_split
from .build import CompiledPipeline, build
from .cost_model import DEFAULT_COPY_BYTES_PER_US, choose_split_points
from .kernel_order import Kernel, PipelineSplit, split
from .stage_graphs import stage_graphs
from .stages import StageSpec, target_label

__all__ = [
    "DEFAULT_COPY_BYTES_PER_US",
    "CompiledPipeline",
    "Kernel",
    "MeasureKernels",
    "PipelineSplit",
    "StageSpec",
    "auto_split",
    "build",
    "choose_split_points",
    "split",
    "stage_graphs",
    "target_label",
]
