"""Tests of compiler/lower.py and compiler/placement.py: Relax module -> placed kernel graph."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from graph_reference import run_graph
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_hetero.compiler.compile_kernels import compile_kernels
from tvm_hetero.compiler.lower import LoweredGraph, LoweringError, lower_to_graph
from tvm_hetero.compiler.placement import Capabilities, OpInfo, resolve_placement

# ---- fixtures -------------------------------------------------------------------------------


@I.ir_module
class MLP:
    @R.function
    def main(
        x: R.Tensor((4, 8), "float32"),
        w1: R.Tensor((8, 16), "float32"),
        b1: R.Tensor((16,), "float32"),
        w2: R.Tensor((16, 4), "float32"),
    ) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            h = R.matmul(x, w1)
            h2 = R.add(h, b1)
            h3 = R.nn.relu(h2)
            o = R.matmul(h3, w2)
            R.output(o)
        return o


@I.ir_module
class TwoAdds:
    @R.function
    def main(x: R.Tensor((4, 4), "float32"), y: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            a = R.add(x, y)
            b = R.add(a, y)
            R.output(b)
        return b


@I.ir_module
class SplitTuple:
    """A multi-output kernel (split) and a nested tuple result holding an input and a constant use."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 4), "float32")):
        a = R.split(x, 2, axis=1)
        b = R.add(a[0], y)
        c = R.nn.relu(a[1])
        d = R.multiply(c, R.const(np.full((4, 4), 3.0, "float32")))
        return (b, (d, x), a)


@I.ir_module
class Hinted:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            a = R.add(x, x)
            a1 = R.hint_on_device(a, R.device(1, 1))
            b = R.matmul(a1, w)
            R.output(b)
        return b


def random_inputs(mod: tvm.IRModule, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        p.name: rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype))
        for p in mod["main"].params
    }


def flatten(value) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [a for v in value for a in flatten(v)]


def run_vm(mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    args = [tvm.runtime.tensor(inputs[p.name]) for p in mod["main"].params]
    return flatten(vm["main"](*args))


def run_lowered(lowered: LoweredGraph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    # Two differently configured CPU targets, so that device 1 really is a second module.
    targets = ["llvm"] + [{"kind": "llvm", "opt-level": 1}] * (lowered.num_devices - 1)
    lib = compile_kernels(lowered, targets)
    return run_graph(lowered.graph, lib, {k: inputs[k] for k in lowered.input_names}, lowered.params)


def kernel_nodes(lowered: LoweredGraph):
    return [n for n in lowered.graph.nodes if not n.is_input]


def assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def assert_well_formed(lowered: LoweredGraph) -> None:
    graph = lowered.graph
    graph.validate()
    kinds = [n.is_input for n in graph.nodes]
    assert kinds == sorted(kinds, reverse=True), "null nodes come first"
    for node in kernel_nodes(lowered):
        assert lowered.kernel_devices[node.func_name] == node.device
        assert node.relax_ops, node.name
    for gv, func in lowered.kernels.functions.items():
        assert func.attrs["global_symbol"] == gv.name_hint
    assert set(lowered.kernel_devices) == {gv.name_hint for gv in lowered.kernels.get_global_vars()}


# ---- (a) the MLP ----------------------------------------------------------------------------


def test_mlp_on_one_device_fuses_and_matches_the_vm():
    inputs = random_inputs(MLP)
    lowered = lower_to_graph(MLP, None, num_devices=1)
    assert_well_formed(lowered)
    assert [n.name for n in lowered.graph.nodes if n.is_input] == ["x", "w1", "b1", "w2"]
    assert lowered.input_names == ["x", "w1", "b1", "w2"] and lowered.params == {}
    assert [n.relax_ops for n in kernel_nodes(lowered)] == [
        ["relax.matmul", "relax.add", "relax.nn.relu"],
        ["relax.matmul"],
    ]
    assert {n.device for n in kernel_nodes(lowered)} == {0}
    assert_close(run_lowered(lowered, inputs), run_vm(MLP, inputs))


@pytest.mark.parametrize("name", ["relax.matmul", "matmul"])
def test_mlp_with_matmul_on_device_1_never_fuses_across_devices(name):
    inputs = random_inputs(MLP)
    lowered = lower_to_graph(MLP, {name: 1}, num_devices=2)
    assert_well_formed(lowered)
    nodes = kernel_nodes(lowered)
    assert [(n.relax_ops, n.device) for n in nodes] == [
        (["relax.matmul"], 1),
        (["relax.add", "relax.nn.relu"], 0),
        (["relax.matmul"], 1),
    ]
    assert lowered.graph.device_switches() == 2
    assert [d for _, d in lowered.op_placement] == [1, 0, 0, 1]
    assert_close(run_lowered(lowered, inputs), run_vm(MLP, inputs))


def test_kernel_used_on_two_devices_gets_a_symbol_per_device():
    inputs = random_inputs(TwoAdds)
    lowered = lower_to_graph(TwoAdds, lambda info: info.index, num_devices=2)
    assert [(n.func_name, n.device) for n in kernel_nodes(lowered)] == [("add", 0), ("add_dev1", 1)]
    assert lowered.kernel_devices == {"add": 0, "add_dev1": 1}
    assert_close(run_lowered(lowered, inputs), run_vm(TwoAdds, inputs))
    # On one device the two adds fuse into one kernel.
    assert len(kernel_nodes(lower_to_graph(TwoAdds, None, 2))) == 1


def test_params_become_named_null_nodes_with_values():
    inputs = random_inputs(MLP)
    weights = {k: inputs[k] for k in ("w1", "b1", "w2")}
    lowered = lower_to_graph(MLP, {"matmul": 1}, num_devices=2, params=weights)
    assert lowered.input_names == ["x"]
    assert sorted(lowered.params) == ["b1", "w1", "w2"]
    assert_close(run_lowered(lowered, inputs), run_vm(MLP, inputs))
    with pytest.raises(LoweringError, match="w3"):
        lower_to_graph(MLP, None, 1, params={"w3": inputs["w1"]})
    with pytest.raises(LoweringError, match="w1"):
        lower_to_graph(MLP, None, 1, params={"w1": inputs["w2"]})


# ---- (b) an ONNX model ----------------------------------------------------------------------


def conv_relu_gemm_model():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype("float32"), name)

    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Split", ["r"], ["s1", "s2"], axis=1, num_outputs=2),
        helper.make_node("Add", ["s1", "s2"], ["a"]),
        helper.make_node("Concat", ["a", "s1"], ["cc"], axis=1),
        helper.make_node("Flatten", ["cc"], ["f"]),
        helper.make_node("Gemm", ["f", "G", "GB"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_relu_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 5])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5]),
            helper.make_tensor_value_info("s2", TensorProto.FLOAT, [2, 2, 5, 5]),
        ],
        [weight("W", (4, 3, 3, 3)), weight("B", (4,)), weight("G", (5, 100)), weight("GB", (5,))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def onnx_case():
    model = conv_relu_gemm_model()
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype("float32")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model, x, session.run(None, {"x": x})


@pytest.mark.parametrize("keep_params", [False, True])
def test_onnx_model_with_random_placement_matches_onnxruntime(onnx_case, keep_params):
    from tvm.relax.frontend.onnx import from_onnx

    model, x, expected = onnx_case
    mod = from_onnx(model, keep_params_in_input=keep_params)
    for seed in range(3):
        devices = np.random.default_rng(seed).integers(0, 3, size=100)
        # Unfolded, so every constant is a parameter of its own (folding: test_fold_constants.py).
        lowered = lower_to_graph(mod, lambda info, d=devices: int(d[info.index]), num_devices=3, fold=False)
        assert_well_formed(lowered)
        assert lowered.input_names == ["x"]
        assert sorted(lowered.params) == (
            ["B", "G", "GB", "W"] if keep_params else [f"const_{i}" for i in range(4)]
        )
        assert_close(run_lowered(lowered, {"x": x}), expected)


def test_onnx_model_placed_by_op_name_never_mixes_devices_in_a_kernel(onnx_case):
    from tvm.relax.frontend.onnx import from_onnx

    model, x, expected = onnx_case
    mod = from_onnx(model)
    op_names = sorted({info.op for info, _ in lower_to_graph(mod, None, 1).op_placement})
    for seed in range(4):
        rng = np.random.default_rng(seed)
        by_name = {name: int(rng.integers(0, 2)) for name in op_names}
        lowered = lower_to_graph(mod, by_name, num_devices=2)
        for node in kernel_nodes(lowered):
            assert {by_name[op] for op in node.relax_ops} == {node.device}, node
        assert_close(run_lowered(lowered, {"x": x}), expected)


# ---- (c) placement policies -----------------------------------------------------------------


def info(op: str, index: int = 0) -> OpInfo:
    return OpInfo(
        op=op, index=index, name=f"v{index}", input_shapes=[(1,)], output_shape=(1,), dtype="float32"
    )


def test_dict_placement_accepts_long_and_short_names():
    place = resolve_placement({"nn.conv2d": 1, "relax.matmul": 2, "relu": 1, "add": 2}, 3)
    assert place(info("relax.nn.conv2d")) == 1
    assert place(info("relax.matmul")) == 2
    assert place(info("relax.nn.relu")) == 1
    assert place(info("relax.add")) == 2
    assert place(info("relax.multiply")) == 0
    # A longer key wins over a shorter one.
    assert resolve_placement({"relax.nn.relu": 1, "relu": 0}, 2)(info("relax.nn.relu")) == 1
    with pytest.raises(ValueError, match="conv9d"):
        resolve_placement({"conv9d": 1}, 2)


def test_callable_placement_sees_op_info_in_binding_order():
    seen: list[OpInfo] = []

    def record(op_info: OpInfo) -> int:
        seen.append(op_info)
        return 0

    lower_to_graph(MLP, record, 1)
    assert [(i.op, i.index, i.name) for i in seen] == [
        ("relax.matmul", 0, "h"),
        ("relax.add", 1, "h2"),
        ("relax.nn.relu", 2, "h3"),
        ("relax.matmul", 3, "o"),
    ]
    assert seen[0].input_shapes == [(4, 8), (8, 16)] and seen[0].output_shape == (4, 16)
    assert seen[1].input_shapes == [(4, 16), (16,)]
    assert seen[3].output_shape == (4, 4) and {i.dtype for i in seen} == {"float32"}
    assert all(i.annotated_device is None for i in seen)


def test_callable_sees_tuple_outputs_and_non_tensor_inputs():
    @I.ir_module
    class Reshape:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                y = R.reshape(x, (2, 16))
                R.output(y)
            return y

    seen: dict[str, OpInfo] = {}

    def record(op_info: OpInfo) -> int:
        seen[op_info.name] = op_info
        return 0

    lower_to_graph(SplitTuple, record, 1)
    assert seen["a"].op == "relax.split" and seen["a"].output_shape == ((4, 4), (4, 4))
    assert seen["a"].input_shapes == [(4, 8)] and seen["a"].dtype == "float32"
    lower_to_graph(Reshape, record, 1)
    assert seen["y"].input_shapes == [(4, 8), None] and seen["y"].output_shape == (2, 16)


def test_capabilities_fall_back_to_device_0_loudly():
    inputs = random_inputs(MLP)
    with pytest.warns(RuntimeWarning) as warned:
        lowered = lower_to_graph(MLP, Capabilities({1: {"relax.matmul"}}), 2)
    assert [str(w.message) for w in warned] == [
        "no device supports relax.add 'h2' (op #1); it falls back to device 0",
        "no device supports relax.nn.relu 'h3' (op #2); it falls back to device 0",
    ]
    assert [(f.op, f.name, f.device) for f in lowered.fallbacks] == [
        ("relax.add", "h2", 0),
        ("relax.nn.relu", "h3", 0),
    ]
    assert [d for _, d in lowered.op_placement] == [1, 0, 0, 1]
    assert_close(run_lowered(lowered, inputs), run_vm(MLP, inputs))


def test_capabilities_take_predicates_and_prefer_the_first_device():
    caps = Capabilities({2: lambda i: i.output_shape == (4, 4), 1: {"matmul", "add", "nn.relu"}})
    lowered = lower_to_graph(MLP, caps, 3)
    assert [d for _, d in lowered.op_placement] == [1, 1, 1, 2]
    assert lowered.fallbacks == []


@pytest.mark.parametrize("placement", [{"relu": 5}, lambda i: 5 if i.op == "relax.nn.relu" else 0])
def test_device_index_out_of_range_names_the_op(placement):
    with pytest.raises(ValueError, match=r"relax\.nn\.relu 'h3'.*device 5"):
        lower_to_graph(MLP, placement, 2)


def test_no_placement_follows_hint_on_device():
    inputs = random_inputs(Hinted)
    lowered = lower_to_graph(Hinted, None, 2)
    assert [(i.op, i.annotated_device, d) for i, d in lowered.op_placement] == [
        ("relax.add", 1, 1),
        ("relax.matmul", 1, 1),
    ]
    # The VM cannot run an unrealized hint; numpy can.
    assert_close(run_lowered(lowered, inputs), [(inputs["x"] + inputs["x"]) @ inputs["w"]])
    with pytest.raises(ValueError, match="relax.add 'a'.*device 1"):
        lower_to_graph(Hinted, None, 1)


# ---- (d) multi-output kernels and tuple results ---------------------------------------------


@pytest.mark.parametrize("placement", [None, {"split": 1}, {"add": 1, "relu": 1}, {"multiply": 1}])
def test_split_and_nested_tuple_result(placement):
    inputs = random_inputs(SplitTuple)
    lowered = lower_to_graph(SplitTuple, placement, 2)
    assert_well_formed(lowered)
    graph = lowered.graph
    split = next(n for n in graph.nodes if n.relax_ops[:1] == ["relax.split"])
    assert split.num_outputs == 2 and split.device == (1 if placement == {"split": 1} else 0)
    assert len(graph.heads) == 5
    assert graph.nodes[graph.heads[2].node].name == "x"
    assert [graph.heads[3], graph.heads[4]] == [(graph.nodes.index(split), 0), (graph.nodes.index(split), 1)]
    assert list(lowered.params) == ["const_0"]
    assert_close(run_lowered(lowered, inputs), run_vm(SplitTuple, inputs))


# ---- errors ---------------------------------------------------------------------------------


def test_target_that_cannot_compile_names_the_op_and_device():
    lowered = lower_to_graph(MLP, {"relu": 1}, 2)
    with pytest.raises(RuntimeError, match=r"relax\.nn\.relu.*device 1"):
        compile_kernels(lowered, ["llvm", "vulkan"])  # the wheel has no Vulkan code generator
    with pytest.raises(ValueError, match="2 devices"):
        compile_kernels(lowered, ["llvm"])


def test_dynamic_shapes_control_flow_and_external_calls_are_refused_by_name():
    @I.ir_module
    class Dynamic:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                a = R.add(x, x)
                b = R.nonzero(a)
                R.output(b)
            return b

    @I.ir_module
    class Branchy:
        @R.function
        def main(x: R.Tensor((4,), "float32"), c: R.Tensor((), "bool")):
            if c:
                y = R.add(x, x)
            else:
                y = R.multiply(x, x)
            return y

    @I.ir_module
    class External:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                a = R.add(x, x)
                b = R.call_dps_packed("my_ext", (a,), out_ty=R.Tensor((4,), "float32"))
                R.output(b)
            return b

    with pytest.raises(LoweringError, match="relax.call_dps_packed 'b' has no TIR lowering"):
        lower_to_graph(External, None, 1)
    with pytest.raises(LoweringError, match="relax.nonzero 'b'.*dynamic"):
        lower_to_graph(Dynamic, None, 1)
    with pytest.raises(LoweringError, match="control flow"):
        lower_to_graph(Branchy, None, 1)
