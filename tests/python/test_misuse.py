"""Misuse gets an error or a correct answer, never a silent wrong one: inputs never set, two threads
on one runtime, parameters rebound through every path (derived caches dropped), 0-d pipeline inputs,
and ``build`` given something that is not a Relax module."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero import pipeline
from tvm_hetero.backends import DnnlBackend
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()
TWO_CPUS = [("cpu:0", "llvm"), ("cpu:1", "llvm")]
CPU = [(tvm.cpu(0), "llvm")]
X = np.random.default_rng(1).standard_normal((4, 16)).astype("float32")
HAS_DNNL = DnnlBackend().available()
BACKENDS = [pytest.param((), id="tvm"), pytest.param(("dnnl",), id="dnnl", marks=pytest.mark.skipif(
    not HAS_DNNL, reason="libtvm_hetero was built without oneDNN"))]


def mlp_reference(params: dict, x: np.ndarray = X) -> np.ndarray:
    return np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"]


@pytest.fixture(scope="module")
def mlp_artifact():
    return tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 1}, params=PARAMS)


# ---- inputs never set --------------------------------------------------------------------------
def test_run_with_params_but_no_input_names_the_input(mlp_artifact):
    rt = mlp_artifact.create()
    with pytest.raises(ValueError, match=r"run: 1 input\(s\) never set: 'x'"):
        rt.run()
    rt.run(x=X)
    np.testing.assert_allclose(rt.get_output(0).numpy(), mlp_reference(PARAMS), rtol=1e-5, atol=1e-5)


def test_run_on_a_bare_runtime_names_every_input(mlp_artifact):
    from tvm_hetero import graph_runtime

    rt = graph_runtime.create(mlp_artifact.graph_json, mlp_artifact.lib, mlp_artifact.devices)
    with pytest.raises(ValueError, match=r"4 input\(s\) never set: 'x', 'w1', 'b1', 'w2'"):
        rt.run()
    with pytest.raises(ValueError, match="never set"):
        rt.profile()
    rt.set_params(PARAMS)
    with pytest.raises(ValueError, match=r"1 input\(s\) never set: 'x' \("):
        rt.run()


# ---- one run at a time -------------------------------------------------------------------------
def deep_mlp():
    """x -> (matmul, relu) x 8 over float32[64, 64], each layer with its own weight: plenty of
    intermediates in shared buffers."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    T = R.Tensor((64, 64), "float32")

    @I.ir_module
    class Deep:
        @R.function
        def main(x: T, w0: T, w1: T, w2: T, w3: T, w4: T, w5: T, w6: T, w7: T):
            with R.dataflow():
                h = R.nn.relu(R.matmul(x, w0))
                h = R.nn.relu(R.matmul(h, w1))
                h = R.nn.relu(R.matmul(h, w2))
                h = R.nn.relu(R.matmul(h, w3))
                h = R.nn.relu(R.matmul(h, w4))
                h = R.nn.relu(R.matmul(h, w5))
                h = R.nn.relu(R.matmul(h, w6))
                y = R.nn.relu(R.matmul(h, w7))
                R.output(y)
            return y

    rng = np.random.default_rng(0)
    params = {f"w{i}": (rng.standard_normal((64, 64)) / 8).astype("float32") for i in range(8)}
    return Deep, params


def test_two_threads_on_one_runtime_never_corrupt_outputs():
    mod, params = deep_mlp()
    rt = tvm_hetero.build(mod, CPU, params=params).create()
    x = np.random.default_rng(2).standard_normal((64, 64)).astype("float32")
    rt.set_input("x", x)
    rt.run()
    expected = rt.get_output(0).numpy().copy()
    h = x
    for i in range(8):
        h = np.maximum(h @ params[f"w{i}"], 0)
    np.testing.assert_allclose(expected, h, rtol=1e-4, atol=1e-4)
    counts = {"ok": 0, "busy": 0, "corrupt": 0}
    lock = threading.Lock()

    def worker():
        out = tvm.runtime.empty((64, 64), "float32")
        for _ in range(200):
            try:
                rt.run()
                rt.get_output(0, out)
            except RuntimeError as err:
                assert "runtime is busy" in str(err)
                with lock:
                    counts["busy"] += 1
                continue
            good = np.array_equal(out.numpy(), expected)
            with lock:
                counts["ok" if good else "corrupt"] += 1

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts["corrupt"] == 0, counts
    assert counts["ok"] + counts["busy"] == 400 and counts["ok"] > 0, counts
    rt.run()  # the runtime is usable afterwards
    np.testing.assert_array_equal(rt.get_output(0).numpy(), expected)


# ---- every parameter write path drops derived caches -----------------------------------------------
def conv_model():
    from test_byoc import conv_model as make

    return make()


@pytest.fixture(scope="module", params=BACKENDS)
def conv(request):
    model = conv_model()
    inputs = models.model_inputs(model)
    art = tvm_hetero.build(models.relax_module(model), CPU, backends=list(request.param))
    return model, inputs, art


def conv_reference(params: dict, inputs: dict) -> np.ndarray:
    """relu(conv2d(x, W, padding 1) + B), the conv model of test_byoc, with the weights ``params``
    (named by the compiler: W is the larger one; B the other, 1-d or, once its reshape to
    (1, C, 1, 1) is folded at build time, 4-d)."""
    import torch

    weight, bias = sorted(params.values(), key=np.size, reverse=True)
    bias = np.ascontiguousarray(np.ravel(bias))
    out = torch.nn.functional.conv2d(torch.from_numpy(inputs["x"]), torch.from_numpy(weight),
                                     torch.from_numpy(bias), padding=1)
    return torch.relu(out).numpy()


def new_weights(art) -> dict:
    rng = np.random.default_rng(7)
    return {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in art.params.items()}


PATHS = ["set_params", "set_input", "load_params", "share_params"]


@pytest.mark.parametrize("path", PATHS)
def test_new_weights_through_every_path_are_used(conv, path):
    model, inputs, art = conv
    rt = art.create()
    rt.run(**inputs)
    np.testing.assert_allclose(rt.get_output(0).numpy(), models.onnxruntime_outputs(model, inputs)[0], rtol=1e-4, atol=1e-4)
    weights = new_weights(art)
    if path == "set_params":
        rt.set_params(weights)
    elif path == "set_input":
        for name, value in weights.items():
            rt.set_input(name, value)
    elif path == "load_params":
        rt.load_params(tvm.runtime.save_param_dict(weights))
    else:
        holder = art.create()
        holder.set_params(weights)
        rt.share_params(holder, tvm.runtime.save_param_dict(weights))
    rt.run()
    np.testing.assert_allclose(rt.get_output(0).numpy(), conv_reference(weights, inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", ["set_params", "load_params"])
@pytest.mark.parametrize("backends", BACKENDS)
def test_new_weights_through_the_pipeline_are_used(backends, path):
    model = conv_model()
    inputs = models.model_inputs(model)
    art = pipeline.build(models.relax_module(model), "llvm", [], backends=list(backends))
    weights = new_weights(art)
    with art.create() as pipe:
        first = pipe.run_batch([inputs])[0][0]
        np.testing.assert_allclose(first, models.onnxruntime_outputs(model, inputs)[0], rtol=1e-4, atol=1e-4)
        if path == "set_params":
            pipe.set_params(None, weights)
        else:
            pipe.load_params(None, tvm.runtime.save_param_dict(weights))
        second = pipe.run_batch([inputs])[0][0]
    np.testing.assert_allclose(second, conv_reference(weights, inputs), rtol=1e-4, atol=1e-4)


# ---- 0-d pipeline inputs -----------------------------------------------------------------------
def test_scalar_pipeline_inputs_stay_scalar():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Scalar:
        @R.function
        def main(x: R.Tensor((), "float32"), w: R.Tensor((), "float32")):
            with R.dataflow():
                y = R.multiply(R.add(x, w), w)
                R.output(y)
            return y

    art = pipeline.build(Scalar, "llvm", [], params={"w": np.array(2.0, "float32")})
    with art.create() as pipe:
        (out,) = pipe.run_batch([{"x": np.float32(3.0)}])[0]
        assert out.shape == () and float(out) == 10.0
        (out,) = pipe.run_batch([[np.array(1.0, "float32")]])[0]
        assert float(out) == 6.0


# ---- build given the wrong thing -----------------------------------------------------------------
def test_build_given_an_onnx_model_says_to_import_it():
    with pytest.raises(TypeError, match=r"mod must be a Relax tvm.IRModule, got ModelProto \(import ONNX first"):
        tvm_hetero.build(conv_model(), CPU)
