"""oneDNN blocks: consecutive regions joined into one region that keeps oneDNN's layouts inside.

Each model is the smallest that shows one shape real networks have (a residual block, an
Inception-style branch and concat, ShuffleNet's concat + ReLU and channel shuffle between convs,
a global mean, a value read outside the chain, two devices); each is checked against onnxruntime
and against the same build with merging off, and the number of regions is asserted.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
import tvm_hetero
from onnx import helper, numpy_helper
from test_byoc import CPU, HAS_DNNL, _model, _weight, region_nodes, run_both
from tvm_hetero.backends import DnnlBackend
from tvm_hetero.backends.merge_regions import merge_regions
from tvm_hetero.testing import models

pytestmark = pytest.mark.skipif(
    not HAS_DNNL, reason="libtvm_hetero was built without oneDNN (libdnnl-dev absent at build time)"
)
C = 16


def conv(name: str, x: str, out: str, cin: int = C, cout: int = C, k: int = 3, relu: bool = True, **attrs):
    """A conv (+bias) [+ReLU] node list and its initializers."""
    pad = k // 2
    attrs.setdefault("pads", [pad] * 4)
    inits = [_weight(f"{name}_w", (cout, cin // attrs.get("group", 1), k, k)), _weight(f"{name}_b", (cout,))]
    nodes = [helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [out + "_c" if relu else out], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", [out + "_c"], [out]))
    return nodes, inits


def build(model: onnx.ModelProto, nodes_expected: int, unmerged_expected: int | None = None) -> tvm_hetero.Artifact:
    """Checked against onnxruntime with blocks (``nodes_expected`` region nodes) and with one
    region per composite (more of them, or ``unmerged_expected``)."""
    art = run_both(model, backends=[DnnlBackend(device=0)], rtol=1e-4, atol=1e-4)
    assert len(region_nodes(art)) == nodes_expected, [n["attrs"]["func_name"] for n in region_nodes(art)]
    unmerged = len(region_nodes(run_both(model, backends=[DnnlBackend(device=0, merge=False)], rtol=1e-4, atol=1e-4)))
    assert unmerged == unmerged_expected if unmerged_expected is not None else unmerged > nodes_expected
    return art


def test_a_residual_block_is_one_region():
    # ResNet's basic block: x -> conv -> relu -> conv (+ x) -> relu, after a stem conv; the stem's
    # output is read by the first conv and by the residual add, both inside the block.
    nodes, inits = conv("stem", "x", "s", cin=3)
    for name, x, out in (("a", "s", "a"),):
        n, i = conv(name, x, out)
        nodes += n
        inits += i
    n, i = conv("b", "a", "b", relu=False)
    nodes += n + [helper.make_node("Add", ["b", "s"], ["sum"]), helper.make_node("Relu", ["sum"], ["z"])]
    inits += i
    art = build(_model(nodes, {"x": (1, 3, 12, 12)}, ("z", (1, C, 12, 12)), inits), 1)
    (node,) = region_nodes(art)
    assert "_block" in node["attrs"]["func_name"]


def inception_model() -> onnx.ModelProto:
    """A stem conv, then three branches (1x1; 1x1 -> 3x3; max pool -> 1x1), concat, and a conv."""
    nodes, inits = conv("stem", "x", "s", cin=3)
    nodes.append(helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]))
    for name, x, out, k in (("b1", "s", "b1", 1), ("b2a", "s", "b2a", 1), ("b2b", "b2a", "b2", 3), ("b3", "p", "b3", 1)):
        n, i = conv(name, x, out, k=k)
        nodes += n
        inits += i
    nodes.append(helper.make_node("Concat", ["b1", "b2", "b3"], ["cat"], axis=1))
    n, i = conv("head", "cat", "h", cin=3 * C)
    nodes += n + [helper.make_node("ReduceMean", ["h"], ["z"], axes=[2, 3], keepdims=1)]
    inits += i
    return _model(nodes, {"x": (1, 3, 10, 10)}, ("z", (1, C, 1, 1)), inits)


def test_branches_concat_and_global_mean_are_one_region():
    art = build(inception_model(), 1)
    assert not [n for n in art.graph["nodes"] if n["op"] != "null" and n not in region_nodes(art)]


@pytest.mark.parametrize("groups", [2, 4])
def test_concat_relu_and_a_channel_shuffle_between_convs_are_one_region(groups):
    # ShuffleNet: concat(conv branch, avg-pooled input) then ReLU; a grouped conv, a channel shuffle
    # on the blocked layout (oneDNN's shuffle primitive), a depthwise conv.
    nodes, inits = conv("stem", "x", "s", cin=3)
    n, i = conv("g", "s", "g", group=groups, k=1, relu=False)
    nodes += n
    inits += i
    grouped = numpy_helper.from_array(np.array([1, groups, C // groups, 8, 8], np.int64), "grouped")
    flat = numpy_helper.from_array(np.array([1, C, 8, 8], np.int64), "flat")
    nodes += [
        helper.make_node("Reshape", ["g", "grouped"], ["g5"]),
        helper.make_node("Transpose", ["g5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "flat"], ["sh"]),
    ]
    inits += [grouped, flat]
    n, i = conv("dw", "sh", "dw", group=C, relu=False)
    nodes += n
    inits += i
    nodes += [
        helper.make_node("AveragePool", ["s"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Concat", ["dw", "ap"], ["cat"], axis=1),
        helper.make_node("Relu", ["cat"], ["z"]),
    ]
    build(_model(nodes, {"x": (1, 3, 8, 8)}, ("z", (1, 2 * C, 8, 8)), inits), 1)


def test_dropout_does_not_cut_a_chain():
    nodes, inits = conv("a", "x", "a", cin=3)
    nodes.append(helper.make_node("Dropout", ["a"], ["d"]))
    n, i = conv("b", "d", "z")
    build(_model(nodes + n, {"x": (1, 3, 8, 8)}, ("z", (1, C, 8, 8)), inits + i), 1)


def test_a_value_read_outside_stays_a_region_output():
    # a = conv(x) is read by the next conv and by Tanh (a TVM kernel): a must leave its region, so
    # the two convs stay two regions, and the output is still right.
    nodes, inits = conv("a", "x", "a", cin=3)
    n, i = conv("b", "a", "b")
    nodes += n + [helper.make_node("Tanh", ["a"], ["t"]), helper.make_node("Add", ["b", "t"], ["z"])]
    build(_model(nodes, {"x": (1, 3, 8, 8)}, ("z", (1, C, 8, 8)), inits + i), 2, unmerged_expected=2)


def chain_model(length: int = 4) -> onnx.ModelProto:
    nodes, inits = conv("c0", "x", "y0", cin=3)
    for k in range(1, length):
        n, i = conv(f"c{k}", f"y{k - 1}", f"y{k}")
        nodes += n
        inits += i
    return _model(nodes, {"x": (1, 3, 8, 8)}, (f"y{length - 1}", (1, C, 8, 8)), inits)


def test_a_block_never_spans_two_devices():
    # The first two convs are placed on cpu:1, the last two on cpu:0: two blocks, one per device.
    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]

    model = chain_model()
    num_ops = sum(tvm_hetero.build(models.relax_module(model), CPU, backends=()).build_report.ops_per_device)

    def place(info: tvm_hetero.OpInfo) -> int:
        return 1 if info.index < num_ops / 2 else 0  # four equal convs: two on each device

    inputs = models.model_inputs(model)
    art = tvm_hetero.build(models.relax_module(model), targets, placement=place)
    rt = art.create()
    rt.run(**inputs)
    np.testing.assert_allclose(
        rt.get_output(0).numpy(), models.onnxruntime_outputs(model, inputs)[0], rtol=1e-4, atol=1e-4
    )
    nodes = art.graph["nodes"]
    devices = art.graph["attrs"]["device_index"][1]
    got = sorted(devices[nodes.index(n)] for n in region_nodes(art))
    assert got == [0, 1], got


def test_a_region_fed_by_another_device_holds_back_no_branch_of_its_own():
    # Branch 2 (1x1 -> 3x3) on cpu:1, the rest on cpu:0. The concat waits for cpu:1; joined with
    # cpu:0's own branches into one block, they would wait too. So cpu:0 has the stem, branch 1,
    # pool -> branch 3, and concat -> head -> mean; cpu:1 one block of its two convs.
    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    # Its two convs, bias adds and ReLUs: op indices of inception_model once the build has folded the
    # biases' constant reshapes (placement sees the ops left after constant folding).
    branch_2 = set(range(5, 10)) | {14}
    model = inception_model()
    inputs = models.model_inputs(model)
    art = tvm_hetero.build(models.relax_module(model), targets, placement=lambda info: int(info.index in branch_2))
    for execution in ("serial", "concurrent"):
        rt = art.create(execution=execution)
        rt.run(**inputs)
        np.testing.assert_allclose(rt.get_output(0).numpy(), models.onnxruntime_outputs(model, inputs)[0],
                                   rtol=1e-4, atol=1e-4)
    nodes = art.graph["nodes"]
    devices = art.graph["attrs"]["device_index"][1]
    per_device = [sum(1 for n in region_nodes(art) if devices[nodes.index(n)] == d) for d in (0, 1)]
    assert per_device == [4, 1], per_device


def test_a_block_survives_export_and_new_params(tmp_path):
    model = chain_model()
    inputs = models.model_inputs(model)
    art = tvm_hetero.build(models.relax_module(model), CPU, backends=[DnnlBackend(device=0)])
    (node,) = region_nodes(art)
    assert "_block" in node["attrs"]["func_name"]
    art.export(tmp_path)
    loaded = tvm_hetero.load(tmp_path)
    rt = loaded.create()
    rt.run(**inputs)
    first = rt.get_output(0).numpy().copy()
    np.testing.assert_allclose(first, models.onnxruntime_outputs(model, inputs)[0], rtol=1e-4, atol=1e-4)
    # New parameters (every weight and bias doubled): the block's cached (reordered) weights must
    # be dropped, and the output is the doubled model's.
    rt.load_params(tvm.runtime.save_param_dict({k: v * 2 for k, v in loaded.params.items()}))
    rt.run()
    doubled = onnx.ModelProto()
    doubled.CopyFrom(model)
    for init in doubled.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, init.name))
    want = models.onnxruntime_outputs(doubled, inputs)[0]
    assert not np.allclose(want, first)
    np.testing.assert_allclose(rt.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4)


def test_merge_keeps_a_region_whose_value_the_function_also_returns():
    # Hand-made: region call a feeds region call b, and the function returns (a, b): a must not be
    # absorbed into b's block (its value would be an intermediate leaking out).
    from tvm import relax
    from tvm_hetero.backends.base import Region

    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    p = relax.Var("p", x.ty)
    region = Region("r_dnnl", "dnnl", 0, "dnnl.x", [], {"op": "softmax", "num_inputs": 1})

    def module(return_both: bool) -> tvm.IRModule:
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                g = bb.add_func(relax.Function([p], p, x.ty), "r_dnnl")
                a = bb.emit(relax.Call(g, [x]))
                b = bb.emit(relax.Call(g, [a]))
                out = bb.emit_output(relax.Tuple([a, b]) if return_both else b)
            bb.emit_func_output(out)
        return bb.get()

    mod = module(return_both=True)
    merged, kept = merge_regions(mod, "main", {"r_dnnl": region}, "dnnl")
    assert list(kept) == ["r_dnnl"]
    assert str(merged["main"]) == str(mod["main"])
    # Returned alone (only b), a is read by b only and joins it: b's step reads step 0's value.
    merged, kept = merge_regions(module(return_both=False), "main", {"r_dnnl": region}, "dnnl")
    (name,) = kept
    assert "_block" in name and kept[name].spec["steps"][1]["args"] == [1]


def test_blocks_called_from_alternating_threads_use_each_threads_scratch():
    # A block's arena is its thread's scratch, shared by every call site of that thread: calls
    # from two threads in turn (and two runtimes with different parameters) must each point their
    # values into the scratch of the thread they run on.
    import threading

    from tvm_hetero.backends import dnnl

    model = inception_model()
    inputs = models.model_inputs(model)
    art = tvm_hetero.build(models.relax_module(model), CPU, backends=[DnnlBackend(device=0)])
    first, second = art.create(), art.create()
    second.load_params(tvm.runtime.save_param_dict({k: v * 2 for k, v in art.params.items()}))
    first.run(**inputs)
    want = first.get_output(0).numpy().copy()
    second.run(**inputs)
    want2 = second.get_output(0).numpy().copy()
    assert not np.allclose(want, want2)
    errors = []

    def run(rt, expected):
        try:
            for _ in range(5):
                rt.run(**inputs)
                np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-5, atol=1e-5)
        except AssertionError as e:  # pragma: no cover - reported below
            errors.append(e)

    for _ in range(3):
        threads = [threading.Thread(target=run, args=(first, want)), threading.Thread(target=run, args=(second, want2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        run(first, want)  # and the main thread again
    assert not errors, errors[0]
    assert dnnl.info()["scratch_bytes"] > 0


def test_dense_layers_are_one_block():
    # DenseNet: concat(x, conv(relu(bn(x)))) twice; the batch norms follow a concat, not a conv, so
    # they are scale+shift(+ReLU) steps on the blocked layout.
    c = 8
    nodes, inits = conv("stem", "x", "s", cin=3, cout=c)
    last, channels = "s", c
    for k in range(2):
        names = [f"bn{k}_{n}" for n in ("scale", "beta", "mean", "var")]
        inits += [_weight(n, (channels,)) for n in names[:3]]
        inits.append(numpy_helper.from_array(np.linspace(0.5, 2.0, channels).astype(np.float32), names[3]))
        nodes += [
            helper.make_node("BatchNormalization", [last, *names], [f"n{k}"]),
            helper.make_node("Relu", [f"n{k}"], [f"r{k}"]),
        ]
        n, i = conv(f"c{k}", f"r{k}", f"g{k}", cin=channels, cout=c, relu=False)
        nodes += n + [helper.make_node("Concat", [last, f"g{k}"], [f"cat{k}"], axis=1)]
        inits += i
        last, channels = f"cat{k}", channels + c
    build(_model(nodes, {"x": (1, 3, 8, 8)}, (last, (1, channels, 8, 8)), inits), 1)


def test_pipeline_stages_cut_between_regions_not_blocks():
    # A pipeline cuts the one-device graph between nodes after lowering: its oneDNN regions are one
    # per conv (a block would be one node no cut can split); the 2-stage run equals onnxruntime.
    from tvm_hetero import pipeline

    model = chain_model()
    mod = models.relax_module(model)
    plan = pipeline.split(mod, [2], backends=["dnnl"])
    assert [k.func_name.endswith("_dnnl") for k in plan.kernels] == [True] * 4
    assert len(region_nodes(tvm_hetero.build(mod, CPU))) == 1  # the plain build: one block
    inputs = models.model_inputs(model)
    art = pipeline.build(mod, "llvm", plan)
    with art.create() as pipe:
        (got,) = pipe.run_batch([inputs])
    np.testing.assert_allclose(got[0], models.onnxruntime_outputs(model, inputs)[0], rtol=1e-4, atol=1e-4)
