"""Pipelines use the build's default backends: oneDNN on host-CPU stages when libtvm_hetero has it,
as ``tvm_hetero.build`` does (one default, ``backends.default_backends``); none for other stages."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero import pipeline
from tvm_hetero.backends import dnnl
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()
X = np.random.default_rng(5).standard_normal((4, 16)).astype("float32")
needs_onednn = pytest.mark.skipif(not dnnl.DnnlBackend().available(), reason="libtvm_hetero built without oneDNN")


def backend_names(backends) -> list[str]:
    return [b.name for b in backends]


@needs_onednn
def test_the_default_is_the_builds_on_host_cpus_and_none_elsewhere():
    from tvm_hetero.compiler.pipeline.stages import stage_backends, stage_spec

    cpus = [stage_spec("cpu:0"), stage_spec("cpu:1")]
    assert backend_names(stage_backends(None, cpus)) == ["dnnl"]
    assert stage_backends(None, [stage_spec("cpu:0"), stage_spec(("cuda:0", "cuda"))]) == []
    assert stage_backends((), cpus) == ()  # given backends are kept as they are
    # tvm_hetero.build's default for the same device is the same backend
    report = tvm_hetero.build(MLP, [(tvm.cpu(0), "llvm")], params=PARAMS).report()
    assert "dnnl" in report


@needs_onednn
def test_split_auto_split_and_build_form_onednn_regions_by_default():
    assert pipeline.split(MLP, [], PARAMS).lowered.regions
    plan = pipeline.auto_split(MLP, 2, "llvm", PARAMS, rounds=1)
    assert plan.lowered.regions  # the kernels were measured as they will run: regions included
    art = pipeline.build(MLP, ["cpu:0", "cpu:1"], [1], params=PARAMS)
    kinds = {m.kind for m in art.lib.imports}
    assert "tvm_hetero_dnnl" in kinds
    want = np.maximum(X @ PARAMS["w1"] + PARAMS["b1"], 0) @ PARAMS["w2"]
    with art.create() as pipe, art.unsplit().create() as whole:
        pipe.run({"x": X})
        got = pipe.get_output()[0]
        whole.run(x=X)
        assert got.tobytes() == whole.get_outputs()[0].tobytes()  # same library, same bits
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not pipeline.split(MLP, [], PARAMS, backends=()).lowered.regions  # opting out


@needs_onednn
def test_a_split_with_onednn_regions_refuses_a_stage_off_the_host_cpu():
    plan = pipeline.split(MLP, [1], PARAMS)
    with pytest.raises(ValueError, match=r"stage 1 \(cuda:0\): the split has \d+ backend region"):
        pipeline.build(MLP, ["cpu:0", ("cuda:0", "cuda")], plan)
