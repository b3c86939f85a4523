"""Pipelines from a Relax module: cut its graph into stages, build them, run them (docs/pipeline.md).

    plan = pipeline.split(mod, [30], params=params)             # manual: stage 1 starts at kernel 30
    plan = pipeline.auto_split(mod, 2, "llvm", options=opts)     # measured and balanced
    art = pipeline.build(mod, ["cpu:0", "cpu:1"], plan, params=params, options=opts)
    with art.create() as pipe:
        outputs = pipe.run_batch(batch)

The public face of three layers: splitting and compiling live in ``compiler/pipeline/`` (kernel
order, cost model and dynamic program, stage graphs, build), measuring and running in
``runtime/`` (``measure.py``, ``pipeline_runtime.py``), files in ``artifact.py``. This module
joins them: ``auto_split`` and ``build`` measure kernels with the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tvm

from .artifact import PipelineArtifact
from .artifact import load_pipeline as load
from .compiler import pipeline as compiler_pipeline
from .compiler.pipeline import (
    DEFAULT_COPY_BYTES_PER_US,
    Kernel,
    PipelineSplit,
    StageSpec,
    choose_split_points,
    split,
    stage_graphs,
)
from .runtime.measure import configure_thread, measure_kernels, run_in_thread
from .runtime.pipeline_runtime import PipelineModule, create

__all__ = [
    "Kernel",
    "PipelineArtifact",
    "PipelineModule",
    "PipelineSplit",
    "auto_split",
    "build",
    "choose_split_points",
    "configure_thread",
    "create",
    "load",
    "measure_kernels",
    "run_in_thread",
    "split",
    "stage_graphs",
]


def auto_split(
    mod: tvm.IRModule,
    num_stages: int,
    targets: StageSpec | list[StageSpec] = "llvm",
    params: Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    rounds: int = 5,
    tolerance: float = 0.02,
    copy_bytes_per_us: float | None = DEFAULT_COPY_BYTES_PER_US,
    entry: str = "main",
    backends: Sequence[Any] = (),
    progress: Callable[[str], None] | None = None,
) -> PipelineSplit:
    """Split points for ``num_stages`` stages balancing kernel times measured here
    (:func:`tvm_hetero.compiler.pipeline.auto_split` documents the arguments)."""
    return compiler_pipeline.auto_split(
        mod,
        num_stages,
        targets,
        params,
        measure=measure_kernels,
        options=options,
        rounds=rounds,
        tolerance=tolerance,
        copy_bytes_per_us=copy_bytes_per_us,
        entry=entry,
        backends=backends,
        progress=progress,
    )


def build(
    mod: tvm.IRModule,
    stages: StageSpec | list[StageSpec],
    split_points: Sequence[int | str] | int | PipelineSplit | None = None,
    params: Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    entry: str = "main",
    backends: Sequence[Any] = (),
    rounds: int = 5,
    tolerance: float = 0.02,
    progress: Callable[[str], None] | None = None,
) -> PipelineArtifact:
    """Compile ``mod`` as a pipeline of stages: stage graphs, one library, params and wiring.

    Parameters
    ----------
    stages : a list with one stage spec per stage (``(device, target)``, a device such as
        ``"cpu:0"``, or a target such as ``"llvm"``), or one spec for every stage.
    split_points : kernel positions or names where stages 1.. begin (:func:`split`); an int, the
        number of stages, or None (one per entry of ``stages``) to choose them with
        :func:`auto_split`; or a :class:`PipelineSplit` of the same module and params.
    options : pipeline options kept as the default of :meth:`PipelineArtifact.create` and used to
        measure for auto_split: ``{"queue_capacity": 2, "stages": [{"cores": [0], "num_threads": 1}]}``.
    rounds, tolerance : for auto_split.
    """
    compiled = compiler_pipeline.build(
        mod,
        stages,
        split_points,
        params,
        measure=measure_kernels,
        options=options,
        entry=entry,
        backends=backends,
        rounds=rounds,
        tolerance=tolerance,
        progress=progress,
    )
    return PipelineArtifact.of(compiled)
