"""External backends (BYOC): partitioning, the oneDNN backend against onnxruntime, export/load."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
import tvm_hetero
from onnx import TensorProto, helper, numpy_helper
from tvm_hetero.backends import BACKENDS, DnnlBackend, resolve_backends
from tvm_hetero.backends import dnnl as dnnl_mod
from tvm_hetero.testing import models

CPU = [(tvm.cpu(0), "llvm")]
HAS_DNNL = DnnlBackend().available()
needs_dnnl = pytest.mark.skipif(
    not HAS_DNNL, reason="libtvm_hetero was built without oneDNN (libdnnl-dev absent at build time)"
)
if HAS_DNNL:
    dnnl_mod.set_num_threads(1)  # this machine's CPU quota makes more threads slower, not faster

RNG = np.random.default_rng(0)


# ---- small ONNX models ----------------------------------------------------------------------
def _weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.3, name)


def _model(nodes, inputs: dict[str, tuple], output: tuple[str, tuple], inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])],
        initializer=list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def conv_model(
    groups=1,
    strides=(1, 1),
    pads=(1, 1, 1, 1),
    dilations=(1, 1),
    bias=True,
    relu=True,
    residual=False,
    bn=False,
    kernel=3,
) -> onnx.ModelProto:
    cin, cout, h = 8, 16, 10
    inits = [_weight("W", (cout, cin // groups, kernel, kernel))]
    conv_in = ["x", "W"]
    if bias:
        inits.append(_weight("B", (cout,)))
        conv_in.append("B")
    attrs = {"group": groups, "strides": list(strides), "pads": list(pads), "dilations": list(dilations)}
    nodes = [helper.make_node("Conv", conv_in, ["y"], **attrs)]
    last = "y"
    if bn:
        for name in ("scale", "beta", "mean"):
            inits.append(_weight(name, (cout,)))
        inits.append(numpy_helper.from_array(RNG.uniform(0.5, 2.0, cout).astype(np.float32), "var"))
        nodes.append(helper.make_node("BatchNormalization", [last, "scale", "beta", "mean", "var"], ["bn"]))
        last = "bn"
    eff = (kernel - 1) * dilations[0] + 1
    oh = (h + pads[0] + pads[2] - eff) // strides[0] + 1
    ow = (h + pads[1] + pads[3] - eff) // strides[1] + 1
    inputs = {"x": (1, cin, h, h)}
    if residual:
        inputs["r"] = (1, cout, oh, ow)
        nodes.append(helper.make_node("Add", [last, "r"], ["sum"]))
        last = "sum"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["out"]))
        last = "out"
    nodes.append(helper.make_node("Identity", [last], ["z"]))
    return _model(nodes, inputs, ("z", (1, cout, oh, ow)), inits)


def gemm_model(trans_b: bool, bias: bool, relu: bool) -> onnx.ModelProto:
    k, n = 32, 24
    inits = [_weight("W", (n, k) if trans_b else (k, n))]
    ins = ["x", "W"]
    if bias:
        inits.append(_weight("C", (n,)))
        ins.append("C")
    nodes = [helper.make_node("Gemm", ins, ["y"], transB=int(trans_b))]
    nodes.append(helper.make_node("Relu" if relu else "Identity", ["y"], ["z"]))
    return _model(nodes, {"x": (4, k)}, ("z", (4, n)), inits)


def pool_model(kind: str) -> onnx.ModelProto:
    node = helper.make_node(kind, ["x"], ["z"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    return _model([node], {"x": (1, 8, 11, 11)}, ("z", (1, 8, 6, 6)))


def run_both(model: onnx.ModelProto, backends=("dnnl",), targets=CPU, rtol=1e-4, atol=1e-4, **build_args):
    """Build with ``backends``, run, compare with onnxruntime; returns the artifact."""
    inputs = models.model_inputs(model)
    expected = models.onnxruntime_outputs(model, inputs)
    art = tvm_hetero.build(models.relax_module(model), list(targets), backends=list(backends), **build_args)
    rt = art.create()
    for name, value in inputs.items():
        rt.set_input(name, value)
    rt.run()
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected[0], rtol=rtol, atol=atol)
    return art


def region_nodes(art: tvm_hetero.Artifact, backend: str = "dnnl") -> list[dict]:
    return [
        n for n in art.graph["nodes"] if n["op"] != "null" and n["attrs"]["func_name"].endswith(f"_{backend}")
    ]


# ---- registry and partitioning --------------------------------------------------------------
def test_registry_resolves_names_pairs_and_instances():
    assert BACKENDS["dnnl"] is DnnlBackend
    b = resolve_backends(["dnnl"])[0]
    assert isinstance(b, DnnlBackend) and b.device == 0
    assert resolve_backends([("dnnl", 1)])[0].device == 1
    inst = DnnlBackend(device=1)
    assert resolve_backends([inst]) == [inst]
    with pytest.raises(ValueError, match="unknown backend"):
        resolve_backends(["nope"])


def test_backend_device_out_of_range_is_an_error():
    with pytest.raises(ValueError, match="outside"):
        tvm_hetero.build(models.relax_module(pool_model("MaxPool")), CPU, backends=[("dnnl", 3)])


# ---- node tests against onnxruntime ---------------------------------------------------------
@needs_dnnl
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"bias": False, "relu": False},
        {"groups": 2, "strides": (2, 2)},
        {"groups": 8, "pads": (0, 1, 2, 1)},  # depthwise, asymmetric padding
        {"dilations": (2, 2), "pads": (2, 2, 2, 2)},
        {"kernel": 1, "pads": (0, 0, 0, 0), "residual": True},
        {"residual": True, "relu": False},
    ],
    ids=["bias_relu", "plain", "groups_stride", "depthwise_asym_pad", "dilation", "1x1_residual", "residual"],
)
def test_conv2d_region_matches_onnxruntime(attrs):
    art = run_both(conv_model(**attrs))
    (node,) = region_nodes(art)
    assert node["attrs"]["func_name"].startswith("fused_relax_nn_conv2d")


@needs_dnnl
def test_batch_norm_folds_into_the_conv_region():
    art = run_both(conv_model(bn=True))
    (node,) = region_nodes(art)
    assert not [n for n in art.graph["nodes"] if n["op"] != "null" and n not in region_nodes(art)]
    assert "batch_norm" not in node["attrs"]["func_name"]


@needs_dnnl
@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize("bias,relu", [(True, True), (True, False), (False, False)])
def test_matmul_region_matches_onnxruntime(trans_b, bias, relu):
    art = run_both(gemm_model(trans_b, bias, relu))
    assert len(region_nodes(art)) == 1


@needs_dnnl
@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool"])
def test_pool_region_matches_onnxruntime(kind):
    art = run_both(pool_model(kind))
    assert len(region_nodes(art)) == 1


@needs_dnnl
def test_cost_gate_keeps_small_ops_on_tvm():
    gated = DnnlBackend(min_flops=1e12)
    art = run_both(conv_model(), backends=[gated])
    assert region_nodes(art) == []
    assert "backend dnnl" not in art.report()


# ---- placement target: another device, copies, report ---------------------------------------
@needs_dnnl
def test_backend_on_second_device_gets_copies_and_report_lines():
    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    art = run_both(conv_model(bn=True, residual=True), backends=[("dnnl", 1)], targets=targets)
    report = art.build_report
    assert [(b, d, n) for b, d, n, _ops in report.backend_regions] == [("dnnl", 1, 1)]
    assert report.num_copies == 0  # the region's output on cpu:1 is read in place on cpu:0
    assert art.create().get_output(0).device == tvm.cpu(0)
    assert "backend dnnl on device 1" in art.report()
    device_of = art.graph["attrs"]["device_index"][1]
    nid = art.graph["nodes"].index(region_nodes(art)[0])
    assert device_of[nid] == 1


# ---- light models, export/load --------------------------------------------------------------
@needs_dnnl
@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_light_model_matches_onnxruntime(name):
    model = models.light_model(name)
    art = run_both(model, rtol=1e-3, atol=1e-3 * 10 ** (4 if name == "resnet50" else 0))
    assert len(region_nodes(art)) >= 20


@needs_dnnl
def test_export_and_load_keep_the_regions(tmp_path):
    model = conv_model(bn=True, residual=True)
    art = run_both(model)
    art.export(tmp_path)
    loaded = tvm_hetero.load(tmp_path)
    assert "tvm_hetero_dnnl" in [m.kind for m in loaded.lib.imports]
    inputs = models.model_inputs(model)
    rt = loaded.create()
    for name, value in inputs.items():
        rt.set_input(name, value)
    rt.run()
    expected = models.onnxruntime_outputs(model, inputs)[0]
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)
    assert loaded.build_report.backend_regions


@needs_dnnl
def test_new_params_after_a_run_are_used_not_stale_cached_weights():
    # The region caches weights reordered into oneDNN's (blocked) conv layout; loading params must
    # drop that cache. Doubling every parameter doubles conv+bias+relu's output.
    model = conv_model()
    inputs = models.model_inputs(model)
    art = tvm_hetero.build(models.relax_module(model), CPU, backends=["dnnl"])
    assert region_nodes(art), "the matmul should be a oneDNN region"
    rt = art.create()
    rt.run(**inputs)
    first = rt.get_output(0).numpy().copy()
    doubled = {name: value * 2 for name, value in art.params.items()}
    rt.load_params(tvm.runtime.save_param_dict(doubled))
    rt.run()
    np.testing.assert_allclose(rt.get_output(0).numpy(), 2 * first, rtol=1e-5, atol=1e-5)
    # A runtime made after another is gone must not see the other's cached weights either.
    del rt
    again = art.create()
    again.run(**inputs)
    np.testing.assert_allclose(again.get_output(0).numpy(), first, rtol=1e-5, atol=1e-5)


@needs_dnnl
def test_matmul_weight_given_as_a_function_parameter():
    mlp, params = models.mlp()
    art = tvm_hetero.build(mlp, CPU, params=params, backends=["dnnl"])
    rt = art.create()
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    rt.run(x=x)
    expected = np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"]
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_two_runtimes_of_one_library_keep_their_own_weights_and_scratch():
    # Each region call site owns its reordered weights; scratch is per thread. Two runtimes made
    # from one library with different parameters, run alternately, each give their own output.
    model = conv_model()
    inputs = models.model_inputs(model)
    art = tvm_hetero.build(models.relax_module(model), CPU, backends=["dnnl"])
    first, second = art.create(), art.create()
    second.load_params(tvm.runtime.save_param_dict({name: value * 2 for name, value in art.params.items()}))
    first.run(**inputs)
    want = first.get_output(0).numpy().copy()
    for _ in range(2):
        second.run(**inputs)
        first.run(**inputs)
        np.testing.assert_allclose(first.get_output(0).numpy(), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(second.get_output(0).numpy(), 2 * want, rtol=1e-5, atol=1e-5)
