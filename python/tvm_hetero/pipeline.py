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

import functools
from collections.abc import Callable
from typing import Any

from .artifact import PipelineArtifact
from .artifact import load_pipeline as load
from .compiler import pipeline as compiler_pipeline
from .compiler.pipeline import (
    Kernel,
    PipelineSplit,
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


def _with_runtime_measuring(compile_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``compile_fn`` with the runtime's kernel timing passed in (the compiler never runs graphs)."""

    @functools.wraps(compile_fn)
    def measured(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("measure", measure_kernels)
        return compile_fn(*args, **kwargs)

    return measured


#: Split points for stages balancing kernel times measured on this machine.
auto_split = _with_runtime_measuring(compiler_pipeline.auto_split)


@functools.wraps(compiler_pipeline.build)
def build(*args: Any, **kwargs: Any) -> PipelineArtifact:
    return PipelineArtifact.of(_with_runtime_measuring(compiler_pipeline.build)(*args, **kwargs))
