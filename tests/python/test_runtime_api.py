"""One runtime API style: GraphModule and PipelineModule convert, return and describe the same way,
both release what they hold as context managers, and an artifact's create takes every keyword of
graph_runtime.create."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_hetero import graph_runtime, pipeline
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()
TWO_CPUS = [("cpu:0", "llvm"), ("cpu:1", "llvm")]
X = np.random.default_rng(7).standard_normal((4, 16)).astype("float32")


@I.ir_module
class ScaleByScalar:
    """A 0-d input: the pipeline must keep its shape ``()``."""

    @R.function
    def main(x: R.Tensor((4, 4), "float32"), s: R.Tensor((), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            y = R.multiply(R.matmul(x, x), s)
            z = R.matmul(y, y)
            R.output(z)
        return z


@pytest.fixture(scope="module")
def artifact():
    return tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 1}, params=PARAMS)


def test_artifact_create_takes_every_graph_runtime_keyword(artifact, tmp_path):
    # device_libs (kernel libraries of other architectures) and params are the artifact's own: it passes them.
    given_by_the_artifact = {"graph_json", "lib", "devices", "device_libs", "params"}
    runtime_keywords = set(inspect.signature(graph_runtime.create).parameters) - given_by_the_artifact
    loaded = tvm_hetero.load(artifact.export(tmp_path / "a"))
    for art in (artifact, loaded):
        assert runtime_keywords <= set(inspect.signature(art.create).parameters)
        serial = art.create(execution="serial", device_options=[None, {"num_threads": 1}], offload="per_op")
        concurrent = art.create()
        for rt in (serial, concurrent):
            rt.run(x=X)
        np.testing.assert_array_equal(serial.get_outputs()[0], concurrent.get_outputs()[0])
    with pytest.raises(ValueError, match="execution must be one of"):
        artifact.create(execution="sideways")


def test_a_graph_module_is_a_context_manager_that_releases_what_it_holds(artifact, rpc_server):
    session = rpc_server.connect()
    with artifact.create([tvm.cpu(0), session.cpu(0)], remote_timeout=60) as rt:
        assert not rt.closed  # holds the session, the remote library and runners, and a watchdog
        rt.run(x=X)
        out = rt.get_outputs()
    assert rt.closed
    rt.close()  # idempotent
    with artifact.create() as local:
        local.run(x=X)
        np.testing.assert_allclose(local.get_outputs()[0], out[0], rtol=1e-5, atol=1e-5)
    assert local.closed


def test_graph_and_pipeline_modules_share_conversion_outputs_and_metadata():
    art = pipeline.build(ScaleByScalar, ["cpu:0", "cpu:0"], [1])
    unsplit = art.unsplit()
    x, s = (np.arange(16, dtype="float32").reshape(4, 4) - 7.5) / 8, np.float32(3.0)
    with art.create() as pipe, unsplit.create() as rt:
        assert pipe.input_names == ["x", "s"]
        assert [n for n in rt.input_names if n in pipe.input_names] == ["x", "s"]
        assert pipe.num_outputs == rt.num_outputs == 1
        pipe.run({"x": x, "s": s})  # a 0-d input stays 0-d
        rt.run(x=x, s=s)
        got, want = pipe.get_output(), rt.get_outputs()
        assert [type(a) for a in got] == [type(a) for a in want] == [np.ndarray]
        np.testing.assert_array_equal(got[0], want[0])
        y = (x @ x) * s
        np.testing.assert_allclose(want[0], y @ y, rtol=1e-5, atol=1e-5)
    assert all(stage.closed for stage in pipe.stages)


def test_graph_runtime_create_binds_the_params_it_is_given(artifact, tmp_path):
    # The README's alternative to art.create(): the params as a dict, or params.bin's bytes.
    with artifact.create() as reference:
        reference.run(x=X)
        want = reference.get_outputs()[0]
    params_bin = (artifact.export(tmp_path / "a") / "params.bin").read_bytes()
    for params in (artifact.params, params_bin):
        with graph_runtime.create(artifact.graph_json, artifact.lib, artifact.devices, params=params) as rt:
            rt.run(x=X)
            np.testing.assert_array_equal(rt.get_outputs()[0], want)


def test_run_without_params_says_how_to_give_them(artifact):
    with graph_runtime.create(artifact.graph_json, artifact.lib, artifact.devices) as rt:
        with pytest.raises(ValueError, match=r"never set: 'x', .*'w1'.*params=artifact\.params"):
            rt.run()


def test_input_names_are_the_inputs_a_user_feeds_and_parameters_are_listed_apart(artifact):
    with artifact.create() as rt:
        assert rt.input_names == ["x"]
        assert sorted(rt.param_names) == sorted(PARAMS)
        assert rt.frame().input_names == ["x"]
    with graph_runtime.create(artifact.graph_json, artifact.lib, artifact.devices) as bare:
        assert sorted(bare.input_names) == sorted(["x", *PARAMS]) and bare.param_names == []
        bare.set_params(artifact.params)
        assert bare.input_names == ["x"]


def test_a_mistyped_input_name_lists_the_valid_ones(artifact):
    with artifact.create() as rt:
        for setter in (rt.set_input, rt.frame().set_input):
            with pytest.raises(KeyError, match=r"no input named 'X'; its inputs: \['x'\] \(parameters: "):
                setter("X", X)
        with pytest.raises(KeyError, match=r"its inputs: \['x'\]"):
            rt.run(X=X)
