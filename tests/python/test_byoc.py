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
    follows = resolve_backends([("dnnl", None)])[0]
    assert follows.follows_placement() and follows.runs_on(0) and follows.runs_on(3)
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


# ---- on by default: every host CPU, each region where its anchor op is placed ---------------
def two_conv_model() -> onnx.ModelProto:
    """3x3 conv+relu, then 1x1 conv+bias+relu: two regions, for a placement that splits them."""
    c = 8
    inits = [_weight("W1", (c, c, 3, 3)), _weight("W2", (c, c, 1, 1)), _weight("B2", (c,))]
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["y1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y1"], ["r1"]),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["y2"]),
        helper.make_node("Relu", ["y2"], ["z"]),
    ]
    return _model(nodes, {"x": (1, c, 9, 9)}, ("z", (1, c, 9, 9)), inits)


def build_and_check(model: onnx.ModelProto, targets=CPU, **build_args) -> tvm_hetero.Artifact:
    """Build (no ``backends`` unless given), run, compare with onnxruntime."""
    inputs = models.model_inputs(model)
    expected = models.onnxruntime_outputs(model, inputs)
    art = tvm_hetero.build(models.relax_module(model), list(targets), **build_args)
    rt = art.create()
    rt.run(**inputs)
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected[0], rtol=1e-4, atol=1e-4)
    return art


@needs_dnnl
def test_a_build_without_backends_runs_onednn_on_the_cpu():
    art = build_and_check(conv_model(bn=True, residual=True))
    assert len(region_nodes(art)) == 1
    assert [(b, d) for b, d, _n, _ops in art.build_report.backend_regions] == [("dnnl", 0)]
    assert "backend dnnl on device 0" in art.report()


def test_empty_backends_opt_out_and_say_so():
    art = build_and_check(conv_model(bn=True, residual=True), backends=())
    assert region_nodes(art) == []
    assert art.build_report.backend_regions == []
    assert "backends: none, TVM kernels run every op" in art.report()


@needs_dnnl
@pytest.mark.parametrize("split", [(0, 1), (1, 0), (1, 1)])
def test_default_regions_follow_the_placement_of_their_anchor_op(split):
    # The 3x3 conv goes to device split[0], the 1x1 to split[1]; each region (conv + its bias
    # and relu) runs on its conv's device, whatever device the relu alone would get.
    def place(info):
        if info.op != "relax.nn.conv2d":
            return 0
        return split[0] if info.input_shapes[1][-1] == 3 else split[1]

    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    art = build_and_check(two_conv_model(), targets=targets, placement=place)
    device_index = art.graph["attrs"]["device_index"][1]
    nodes = art.graph["nodes"]
    got = [device_index[nodes.index(n)] for n in region_nodes(art)]
    assert sorted(got) == sorted(split)
    expected_lines = sorted({(d, split.count(d)) for d in split})
    assert sorted((d, n) for _b, d, n, _ops in art.build_report.backend_regions) == expected_lines


@needs_dnnl
def test_default_leaves_an_anchor_placed_on_a_device_that_cannot_run_it_to_tvm():
    # Only host CPUs run oneDNN: a backend limited to device 0 leaves the conv placed on device 1.
    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    backend = DnnlBackend(device=None, devices=[0])
    art = build_and_check(
        two_conv_model(),
        targets=targets,
        placement=lambda info: int(info.op == "relax.nn.conv2d" and info.input_shapes[1][-1] == 1),
        backends=[backend],
    )
    assert [(d, n) for _b, d, n, _ops in art.build_report.backend_regions] == [(0, 1)]
    assert art.build_report.kernels_per_device[1] >= 1


@needs_dnnl
def test_following_the_placement_takes_every_region_a_fixed_device_takes():
    # Matching sees other call objects than the function the placement was asked about (after
    # batch-norm folding and bias unsharing); every match must still find its anchor's device.
    from tvm_hetero.compiler.lower import lower_to_graph

    mod = models.relax_module(models.light_model("squeezenet"))

    def regions(backends):
        graph = lower_to_graph(mod, None, 1, None, "main", backends).graph
        return sorted(n.func_name.rstrip("0123456789") for n in graph.nodes if "_dnnl" in n.func_name)

    fixed = regions([DnnlBackend(device=0, merge=False)])
    assert len(fixed) >= 20 and regions([DnnlBackend(device=None, merge=False)]) == fixed
    assert regions([("dnnl", None)]) == regions([("dnnl", 0)])  # blocks too


def test_default_without_onednn_falls_back_to_tvm_kernels_and_reports_it(monkeypatch):
    monkeypatch.setattr(DnnlBackend, "available", lambda self: False)
    art = build_and_check(conv_model())
    assert region_nodes(art) == []
    assert "oneDNN: not built in: CPU convolutions and matmuls run as untuned TVM kernels" in art.report()
    with pytest.raises(RuntimeError, match="not available"):
        tvm_hetero.build(models.relax_module(conv_model()), CPU, backends=["dnnl"])


def test_no_default_backend_for_a_device_that_is_not_a_host_cpu():
    from tvm_hetero.backends import default_backends

    assert default_backends([]) == ([], [])
    if HAS_DNNL:
        (backend,), notes = default_backends([0, 2])
        assert backend.device is None and backend.devices == frozenset({0, 2}) and notes == []


# ---- light models, export/load --------------------------------------------------------------
@needs_dnnl
@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_light_model_matches_onnxruntime(name):
    model = models.light_model(name)
    art = run_both(model, rtol=1e-3, atol=1e-3 * 10 ** (4 if name == "resnet50" else 0))
    ((_backend, _device, regions, ops),) = art.build_report.backend_regions
    print(f"{name}: {regions} oneDNN regions holding {ops} ops, {len(region_nodes(art))} region nodes")
    # Nearly every op is oneDNN's (the bias reshapes are folded at build, so they are not counted).
    assert ops >= 0.95 * sum(art.build_report.ops_per_device) and regions == len(region_nodes(art))


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


# ---- fused activations (post-ops) against numpy ---------------------------------------------
def _np_activation(name: str, v: np.ndarray) -> np.ndarray:
    import math

    erf = np.vectorize(math.erf)
    return {
        "relu": lambda: np.maximum(v, 0),
        "relu6": lambda: np.clip(v, 0, 6),
        "hardtanh": lambda: np.clip(v, -1, 1),
        "sigmoid": lambda: 1 / (1 + np.exp(-v)),
        "hardswish": lambda: v * np.clip(v + 3, 0, 6) / 6,
        "gelu": lambda: 0.5 * v * (1 + erf(v / np.sqrt(2))),
        "gelu_tanh": lambda: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3))),
        "silu": lambda: v / (1 + np.exp(-v)),
    }[name]()


def _relax_activation(name: str, v):
    from tvm import relax

    op = relax.op
    return {
        "relu": lambda: op.nn.relu(v),
        "relu6": lambda: op.clip(v, 0, 6),
        "hardtanh": lambda: op.clip(v, -1, 1),
        "sigmoid": lambda: op.sigmoid(v),
        # the frontends' hardswish (ONNX HardSwish, torch hardswish)
        "hardswish": lambda: op.multiply(
            v, op.divide(op.clip(op.add(v, relax.const(3.0)), 0, 6), relax.const(6.0))
        ),
        "gelu": lambda: op.nn.gelu(v),
        "gelu_tanh": lambda: op.nn.gelu_tanh(v),
        "silu": lambda: op.nn.silu(v),
    }[name]()


def _anchor_with_activation(anchor: str, act: str):
    """``act(conv2d_1x1(x, W) + b)`` or ``act(matmul(x, W) + b)`` in Relax, with its weights."""
    from tvm import relax

    rng = np.random.default_rng(1)
    if anchor == "conv2d":
        xs, ws, bs = (1, 8, 5, 5), (16, 8, 1, 1), (1, 16, 1, 1)
    else:
        xs, ws, bs = (4, 32), (32, 24), (24,)
    params = {"w": rng.standard_normal(ws).astype("float32") * 0.5, "b": rng.standard_normal(bs).astype("float32")}
    x, w, b = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in (("x", xs), ("w", ws), ("b", bs)))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w) if anchor == "conv2d" else relax.op.matmul(x, w))
            y = bb.emit(relax.op.add(y, b))
            out = bb.emit_output(_relax_activation(act, y))
        bb.emit_func_output(out)
    x_value = rng.standard_normal(xs).astype("float32") * 2
    if anchor == "conv2d":
        pre = np.einsum("oc,nchw->nohw", params["w"][:, :, 0, 0], x_value) + params["b"]
    else:
        pre = x_value @ params["w"] + params["b"]
    return bb.get(), params, x_value, _np_activation(act, pre.astype(np.float64))


@needs_dnnl
@pytest.mark.parametrize("anchor", ["conv2d", "matmul"])
@pytest.mark.parametrize("act", ["relu", "relu6", "hardtanh", "sigmoid", "hardswish", "gelu", "gelu_tanh", "silu"])
def test_activation_fuses_into_the_region_and_matches_numpy(anchor, act):
    mod, params, x, expected = _anchor_with_activation(anchor, act)
    art = tvm_hetero.build(mod, CPU, params=params)
    assert len(region_nodes(art)) == 1
    assert len([n for n in art.graph["nodes"] if n["op"] != "null"]) == 1, "all in one region"
    rt = art.create()
    rt.run(x=x)
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_unknown_activation_in_a_region_document_is_an_error_naming_it():
    doc = '{"format": "tvm-hetero-dnnl/1", "regions": [{"name": "r0", "op": "conv2d", "activation": "cube"}]}'
    with pytest.raises(Exception, match="r0.*unknown activation 'cube'"):
        tvm.get_global_func("tvm_hetero.dnnl.create_module")(doc)


# ---- channel shuffle as one reorder against onnxruntime -------------------------------------
def shuffle_model(groups: int, channels: int = 12) -> onnx.ModelProto:
    """ShuffleNet's shuffle: Reshape (N, g, C/g, H, W), Transpose (0, 2, 1, 3, 4), Reshape back."""
    shape = (1, channels, 5, 4)
    grouped = numpy_helper.from_array(np.array([1, groups, channels // groups, 5, 4], np.int64), "grouped")
    flat = numpy_helper.from_array(np.array(shape, np.int64), "flat")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),  # the shuffle's input is computed, as in ShuffleNet
        helper.make_node("Reshape", ["r", "grouped"], ["g"]),
        helper.make_node("Transpose", ["g"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "flat"], ["z"]),
    ]
    return _model(nodes, {"x": shape}, ("z", shape), [grouped, flat])


@needs_dnnl
@pytest.mark.parametrize("groups", [2, 3, 4])
def test_channel_shuffle_is_one_region_and_matches_onnxruntime(groups):
    art = run_both(shuffle_model(groups), rtol=0, atol=0)
    (node,) = region_nodes(art)
    assert "transpose" in node["attrs"]["func_name"] or "permute_dims" in node["attrs"]["func_name"]


def test_a_transpose_that_is_not_a_channel_shuffle_stays_with_tvm():
    shape = (1, 12, 5, 4)
    grouped = numpy_helper.from_array(np.array([1, 3, 4, 5, 4], np.int64), "grouped")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "grouped"], ["g"]),
        helper.make_node("Transpose", ["g"], ["z"], perm=[0, 1, 2, 4, 3]),
    ]
    model = _model(nodes, {"x": shape}, ("z", (1, 3, 4, 4, 5)), [grouped])
    art = run_both(model, backends=["dnnl"] if HAS_DNNL else [])
    assert region_nodes(art) == []


# ---- softmax against onnxruntime ------------------------------------------------------------
@needs_dnnl
@pytest.mark.parametrize("shape,axis", [((2, 3, 5, 7), -1), ((2, 3, 5, 7), 1), ((4, 10), 1), ((2, 4, 6), 0)])
def test_softmax_is_one_region_and_matches_onnxruntime(shape, axis):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["z"], axis=axis)]
    art = run_both(_model(nodes, {"x": shape}, ("z", shape)), rtol=1e-5, atol=1e-6)
    (node,) = region_nodes(art)
    assert "softmax" in node["attrs"]["func_name"]


# ---- layer norm against numpy ---------------------------------------------------------------
@needs_dnnl
@pytest.mark.parametrize("shape", [(4, 16), (2, 5, 32)])
def test_layer_norm_is_one_region_and_matches_numpy(shape):
    from tvm import relax

    rng = np.random.default_rng(2)
    c = shape[-1]
    gamma, beta = rng.standard_normal(c).astype("float32"), rng.standard_normal(c).astype("float32")
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    g, b = relax.Var("g", relax.TensorType((c,), "float32")), relax.Var("b", relax.TensorType((c,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, g, b, axes=[-1], epsilon=1e-3))
        bb.emit_func_output(out)
    art = tvm_hetero.build(bb.get(), CPU, params={"g": gamma, "b": beta})
    (node,) = region_nodes(art)
    assert "layer_norm" in node["attrs"]["func_name"]
    value = rng.standard_normal(shape).astype("float32") * 3 + 1
    rt = art.create()
    rt.run(x=value)
    v = value.astype(np.float64)
    mean, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
    expected = (v - mean) / np.sqrt(var + 1e-3) * gamma + beta
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)


@needs_dnnl
@pytest.mark.parametrize("act", [None, "gelu"])
def test_matmul_on_token_batches_is_one_region_and_matches_numpy(act):
    # A transformer's linear layer: (batch, tokens, K) @ (K, N) + b, then GELU.
    from tvm import relax

    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((32, 24)).astype("float32"), "b": rng.standard_normal(24).astype("float32")}
    x = relax.Var("x", relax.TensorType((2, 5, 32), "float32"))
    w, b = relax.Var("w", relax.TensorType((32, 24), "float32")), relax.Var("b", relax.TensorType((24,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(x, w), b))
            out = bb.emit_output(relax.op.nn.gelu(y) if act else y)
        bb.emit_func_output(out)
    art = tvm_hetero.build(bb.get(), CPU, params=params)
    assert len(region_nodes(art)) == 1
    assert len([n for n in art.graph["nodes"] if n["op"] != "null"]) == 1
    value = rng.standard_normal((2, 5, 32)).astype("float32")
    rt = art.create()
    rt.run(x=value)
    pre = value.astype(np.float64) @ params["w"] + params["b"]
    expected = _np_activation("gelu", pre) if act else pre
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_a_default_region_never_takes_an_op_placed_on_another_device():
    # matmul on cpu:0, its bias add and relu placed on cpu:1: a matmul+bias(+relu) region anchored
    # on cpu:0 must not swallow them.
    mod, params = models.mlp()
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], placement={"add": 1, "relu": 1},
                           params=params)
    assert art.build_report.ops_per_device == [2, 2]
    x = np.ones((4, 16), "float32")
    rt = art.create()
    rt.run(x=x)
    expected = np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"]
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_a_pinned_backend_reports_every_op_it_moves_from_the_placement():
    # Tower b of two towers placed on cpu:1; oneDNN pinned to device 0 wins over that placement,
    # and the report names each op it took, where it was placed, where it runs and the backend.
    mod, params = models.two_towers()
    tower_b = {"lv2", "lv3", "lv6", "lv7", "lv10", "lv11"}  # depth 3: b's matmul and relu of each layer
    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]

    def place(info):
        return int(info.name in tower_b)

    art = tvm_hetero.build(mod, targets, placement=place, params=params, backends=["dnnl"])
    moved = art.build_report.moved_by_backend
    assert sorted(name for name, *_ in moved) == sorted(tower_b)
    assert {(src, dst, backend) for _name, _op, src, dst, backend in moved} == {(1, 0, "dnnl")}
    assert {op for _name, op, *_ in moved} == {"relax.matmul", "relax.nn.relu"}
    text = art.report()
    assert "MOVED by backend (6 ops" in text
    assert "lv2 (relax.matmul): device 1 (cpu:1) -> device 0 (cpu:0), backend dnnl" in text
    # Following the placement moves nothing, and says nothing; nor does the default placement
    # (everything on device 0) that a backend pinned elsewhere overrides as asked.
    follow = tvm_hetero.build(mod, targets, placement=place, params=params, backends=[("dnnl", None)])
    assert follow.build_report.moved_by_backend == []
    assert "MOVED by backend" not in follow.report()
    pinned = tvm_hetero.build(mod, targets, params=params, backends=[("dnnl", 1)])
    assert pinned.build_report.ops_per_device[1] == 12 and pinned.build_report.moved_by_backend == []


# ---- LRN and per-channel scale + shift against onnxruntime ----------------------------------
def only_regions(art: tvm_hetero.Artifact) -> list[dict]:
    """The region nodes, asserting that no TVM kernel node is left."""
    kernels = [n for n in art.graph["nodes"] if n["op"] != "null" and n not in region_nodes(art)]
    assert not kernels, [n["attrs"]["func_name"] for n in kernels]
    return region_nodes(art)


@needs_dnnl
@pytest.mark.parametrize("size,alpha,beta,bias", [(5, 1e-4, 0.75, 1.0), (3, 0.5, 0.6, 2.0)])
def test_lrn_is_one_region_and_matches_onnxruntime(size, alpha, beta, bias):
    shape = (1, 16, 6, 5)
    nodes = [helper.make_node("LRN", ["x"], ["z"], size=size, alpha=alpha, beta=beta, bias=bias)]
    art = run_both(_model(nodes, {"x": shape}, ("z", shape)), rtol=1e-5, atol=1e-5)
    (node,) = only_regions(art)
    assert "power" in node["attrs"]["func_name"]


@needs_dnnl
@pytest.mark.parametrize("after", [[], ["Relu"], ["Mul", "Add", "Relu"]])
def test_batch_norm_without_a_conv_is_one_scale_shift_region(after):
    # DenseNet: batch norm (+ per-channel Mul and Add) + ReLU on a concat's output, no conv before.
    c = 8
    inits = [_weight(n, (c,)) for n in ("scale", "beta", "mean")]
    inits.append(numpy_helper.from_array(RNG.uniform(0.5, 2.0, c).astype(np.float32), "var"))
    inits += [_weight("m", (c, 1, 1)), _weight("a", (c, 1, 1))]
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "beta", "mean", "var"], ["y0"])]
    for k, op in enumerate(after):
        operands = [f"y{k}"] + {"Mul": ["m"], "Add": ["a"]}.get(op, [])
        nodes.append(helper.make_node(op, operands, [f"y{k + 1}"]))
    shape = (1, c, 5, 4)
    art = run_both(_model(nodes, {"x": shape}, (f"y{len(after)}", shape), inits), rtol=1e-5, atol=1e-5)
    (node,) = only_regions(art)
    assert "multiply" in node["attrs"]["func_name"]


@needs_dnnl
def test_linear_with_the_bias_on_the_left_is_one_region():
    # torch's linear imports as add(bias, matmul(x, permute_dims(w))): the bias still fuses.
    from tvm import relax

    rng = np.random.default_rng(4)
    params = {"w": rng.standard_normal((24, 32)).astype("float32"), "b": rng.standard_normal(24).astype("float32")}
    x = relax.Var("x", relax.TensorType((6, 32), "float32"))
    w, b = relax.Var("w", relax.TensorType((24, 32), "float32")), relax.Var("b", relax.TensorType((24,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(b, relax.op.matmul(x, relax.op.permute_dims(w))))
        bb.emit_func_output(out)
    art = tvm_hetero.build(bb.get(), CPU, params=params)
    assert len(only_regions(art)) == 1
    value = rng.standard_normal((6, 32)).astype("float32")
    rt = art.create()
    rt.run(x=value)
    np.testing.assert_allclose(rt.get_output(0).numpy(), value @ params["w"].T + params["b"], rtol=1e-4, atol=1e-4)


@needs_dnnl
@pytest.mark.parametrize("batch", [(8,), (2, 4)])
def test_batched_matmul_of_two_activations_is_one_block_and_matches_numpy(batch):
    # Attention: softmax(q @ k) @ v, every operand computed: batched matmul, softmax, batched
    # matmul in one block.
    from tvm import relax

    rng = np.random.default_rng(5)
    shapes = {"q": (*batch, 6, 4), "k": (*batch, 4, 6), "v": (*batch, 6, 5)}
    args = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in shapes.items()]
    bb = relax.BlockBuilder()
    with bb.function("main", args):
        with bb.dataflow():
            scores = bb.emit(relax.op.nn.softmax(relax.op.matmul(args[0], args[1]), axis=-1))
            out = bb.emit_output(relax.op.matmul(scores, args[2]))
        bb.emit_func_output(out)
    art = tvm_hetero.build(bb.get(), CPU)
    (node,) = only_regions(art)
    assert "_block" in node["attrs"]["func_name"]
    values = {n: rng.standard_normal(s).astype("float32") for n, s in shapes.items()}
    rt = art.create()
    rt.run(**values)
    s = values["q"].astype(np.float64) @ values["k"]
    p = np.exp(s - s.max(-1, keepdims=True))
    expected = (p / p.sum(-1, keepdims=True)) @ values["v"]
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-5)
