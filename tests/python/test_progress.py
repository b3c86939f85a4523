"""The progress a build shows: lines for messages, a bar while kernels are timed."""

from __future__ import annotations

import io

import tvm
import tvm_hetero
from tvm_hetero.progress import WIDTH, Progress
from tvm_hetero.testing import models


def test_progress_bar_counts_to_the_total_and_clamps():
    out = io.StringIO()
    progress = Progress(stream=out)
    for done in range(11):
        progress.count(done, 10, f"{done}/10 kernels")
    progress.count(12, 10, "past the end")
    progress("next step")
    lines = out.getvalue().splitlines()
    assert any(f"[{'#' * WIDTH}] 100%" in line for line in lines)
    assert any(f"[{'.' * WIDTH}]   0%" in line for line in lines)
    assert len([line for line in lines if "%" in line]) <= 12  # not a terminal: one line per tenth at most
    assert lines[-1].endswith("next step")


def test_measuring_for_automatic_placement_draws_a_bar_of_kernels():
    from tvm_hetero.placement_measurer import RuntimeMeasurer

    out = io.StringIO()
    progress = Progress(stream=out)
    mlp, params = models.mlp()
    tvm_hetero.build(mlp, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], placement="auto", params=params,
                     cost_cache=False, progress=progress, measurer=RuntimeMeasurer(progress))
    text = out.getvalue()
    assert "kernels timed on cpu:0, cpu:1" in text
    assert f"[{'#' * WIDTH}] 100%" in text
