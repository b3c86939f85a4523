"""Constant folding: in Relax before partitioning (ir/fold_constant_ops.py) and in lowering
(compiler/fold_constants.py): what folds, what does not, what the report says, and outputs."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
import tvm
import tvm_hetero
from onnx import numpy_helper
from test_byoc import needs_dnnl
from test_lower import assert_close, assert_well_formed, conv_relu_gemm_model, run_lowered
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_hetero.compiler.lower import lower_to_graph
from tvm_hetero.ir.fold_constant_ops import FoldConstantOps, computed_weight_notes

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 8)).astype("float32")  # stored (out, in), as ONNX Gemm with transB
SMALL = RNG.standard_normal((1, 8)).astype("float32")
TWO_CPUS = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]


@I.ir_module
class Dense:
    """x @ W.T + broadcast(SMALL): the transpose reads only a constant, the broadcast grows it 64x."""

    @R.function
    def main(x: R.Tensor((64, 8), "float32")) -> R.Tensor((64, 16), "float32"):
        with R.dataflow():
            wt = R.permute_dims(R.const(W), axes=[1, 0])
            y = R.matmul(x, wt)
            big = R.broadcast_to(R.const(SMALL), R.shape([64, 8]))
            z = R.add(x, big)
            o = R.add(y, R.matmul(z, wt))
            R.output(o)
        return o


@I.ir_module
class DenseParam:
    """The same transpose of a weight given as a function parameter (``params=``)."""

    @R.function
    def main(x: R.Tensor((64, 8), "float32"), w: R.Tensor((16, 8), "float32")) -> R.Tensor(
        (64, 16), "float32"
    ):
        with R.dataflow():
            wt = R.permute_dims(w, axes=[1, 0])
            o = R.matmul(x, wt)
            R.output(o)
        return o


def expected(x: np.ndarray) -> np.ndarray:
    return x @ W.T + (x + SMALL) @ W.T


def kernel_ops(lowered) -> list[list[str]]:
    return [n.relax_ops for n in lowered.graph.nodes if not n.is_input]


def test_transpose_of_a_constant_runs_at_build_time_and_becomes_a_param() -> None:
    plain = lower_to_graph(Dense, None, 1, fold=False)
    folded = lower_to_graph(Dense, None, 1)
    assert any("relax.permute_dims" in ops for ops in kernel_ops(plain))
    assert not any("relax.permute_dims" in ops for ops in kernel_ops(folded))
    transposed = [v for v in folded.params.values() if v.shape == (8, 16)]
    assert len(transposed) == 1
    np.testing.assert_array_equal(transposed[0], W.T)
    assert not any(v.shape == (16, 8) for v in folded.params.values())  # the untransposed W is dropped
    # The broadcast would make a 64x larger parameter: it keeps running per inference.
    assert any("relax.broadcast_to" in ops for ops in kernel_ops(folded))
    assert not any(v.shape == (64, 8) for v in folded.params.values())


def test_folded_model_gives_the_same_outputs_on_every_placement() -> None:
    x = RNG.standard_normal((64, 8)).astype("float32")
    for placement in (None, lambda info: info.index % 2, {"matmul": 1}):
        module = tvm_hetero.build(Dense, TWO_CPUS, placement=placement).create()
        module.run(x=x)
        np.testing.assert_allclose(module.get_output(0).numpy(), expected(x), rtol=1e-5, atol=1e-5)


def test_folding_keeps_the_placement_of_the_consumers() -> None:
    plain = lower_to_graph(Dense, {"matmul": 1}, 2, fold=False)
    folded = lower_to_graph(Dense, {"matmul": 1}, 2)
    assert plain.op_placement == folded.op_placement
    devices = sorted((n.relax_ops, n.device) for n in folded.graph.nodes if not n.is_input)
    assert [d for ops, d in devices if ops == ["relax.matmul"]] == [1, 1]


def test_values_given_as_params_are_not_folded() -> None:
    # set_params may replace them after the build; a folded transpose would then be stale.
    lowered = lower_to_graph(DenseParam, None, 1, params={"w": W})
    assert any("relax.permute_dims" in ops for ops in kernel_ops(lowered))
    module = tvm_hetero.build(DenseParam, [TWO_CPUS[0]], params={"w": W}).create()
    x = RNG.standard_normal((64, 8)).astype("float32")
    module.set_params({"w": 2 * W})
    module.run(x=x)
    np.testing.assert_allclose(module.get_output(0).numpy(), x @ (2 * W).T, rtol=1e-5, atol=1e-5)


def test_onnx_model_folded_under_random_placements_matches_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    from tvm.relax.frontend.onnx import from_onnx

    model = conv_relu_gemm_model()
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype("float32")
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    mod = from_onnx(model, keep_params_in_input=False)
    for seed in range(3):
        devices = np.random.default_rng(seed).integers(0, 3, size=100)
        lowered = lower_to_graph(mod, lambda info, d=devices: int(d[info.index]), num_devices=3)
        assert_well_formed(lowered)
        # The Gemm weight G (5, 100) is stored transposed at build time.
        assert any(v.shape == (100, 5) for v in lowered.params.values())
        assert not any(v.shape == (5, 100) for v in lowered.params.values())
        assert_close(run_lowered(lowered, {"x": x}), expected)


@I.ir_module
class ScalarConstant:
    """A kernel that reads only a 0-d constant (as ONNX's expanded NLLLoss takes a shape element)."""

    @R.function
    def main(x: R.Tensor((4,), "int64")) -> R.Tensor((4,), "int64"):
        with R.dataflow():
            s = R.negative(R.const(3, "int64"))
            y = R.add(x, s)
            R.output(y)
        return y


def test_a_kernel_reading_a_scalar_constant_is_folded_with_its_rank() -> None:
    # On two devices the fence keeps the negation apart from the add, so it reads only the 0-d
    # constant; folding must call it with a 0-d tensor, not a (1,) one.
    lowered = lower_to_graph(ScalarConstant, {"negative": 1, "add": 0}, 2)
    assert not any("relax.negative" in ops for ops in kernel_ops(lowered))
    assert [v.shape for v in lowered.params.values()] == [()]
    module = tvm_hetero.build(ScalarConstant, TWO_CPUS, placement={"negative": 1}).create()
    module.run(x=np.arange(4, dtype="int64"))
    np.testing.assert_array_equal(module.get_output(0).numpy(), np.arange(4) - 3)


def test_onnx_nllloss_with_weight_builds_under_a_random_split() -> None:
    pytest.importorskip("onnx")
    from tvm_hetero.testing.onnx_node_cases import iter_cases, random_placement, run_case_ours

    name = "test_nllloss_NCd1d2_with_weight_reduction_mean_expanded"
    case = next(iter_cases([name]))
    result = run_case_ours(case, random_placement(name))
    assert result.passed, str(result)


# ---- FoldConstantOps: constant subgraphs folded in Relax, before the backends look ------------
SCALAR = np.array([0.25], "float32")  # as the light models' ConstantOfShape holds a weight's value
BIAS = RNG.standard_normal(4).astype("float32")


@I.ir_module
class ComputedWeight:
    """A conv whose weight is broadcast from a scalar and whose bias is reshaped, as ONNX's light
    models and exporters write them."""

    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32")) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            w = R.broadcast_to(R.const(SCALAR), R.shape([4, 3, 3, 3]))
            b = R.reshape(R.const(BIAS), R.shape([1, 4, 1, 1]))
            c = R.nn.conv2d(x, w, padding=1)
            y = R.nn.relu(R.add(c, b))
            R.output(y)
        return y


def bindings(mod: tvm.IRModule) -> dict[str, object]:
    return {b.var.name: b.value for block in mod["main"].body.blocks for b in block.bindings}


def op_names(mod: tvm.IRModule) -> list[str]:
    return [v.op.name for v in bindings(mod).values() if isinstance(v, tvm.relax.Call)
            and isinstance(v.op, tvm.ir.Op)]


def test_a_weight_computed_from_constants_becomes_a_constant() -> None:
    folded = FoldConstantOps()(ComputedWeight)
    assert "relax.broadcast_to" not in op_names(folded) and "relax.reshape" not in op_names(folded)
    conv = bindings(folded)["c"]
    assert isinstance(conv.args[1], tvm.ir.Constant)
    np.testing.assert_array_equal(conv.args[1].value.numpy(), np.full((4, 3, 3, 3), 0.25, "float32"))
    x = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    outputs = []
    for mod in (ComputedWeight, folded):
        runtime = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], backends=()).create()
        runtime.run(x=x)
        outputs.append(runtime.get_output(0).numpy())
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-6, atol=1e-6)


def test_a_value_over_the_limit_stays_an_op_and_what_it_reads_folds() -> None:
    @I.ir_module
    class Grown:
        @R.function
        def main(x: R.Tensor((4, 3, 3, 3), "float32")) -> R.Tensor((4, 3, 3, 3), "float32"):
            with R.dataflow():
                column = R.reshape(R.const(BIAS), R.shape([4, 1, 1, 1]))
                grown = R.broadcast_to(column, R.shape([4, 3, 3, 3]))  # 432 bytes from 16
                y = R.add(x, grown)
                R.output(y)
            return y

    kept = FoldConstantOps(limit_bytes=100)(Grown)
    assert op_names(kept) == ["relax.broadcast_to", "relax.add"]
    np.testing.assert_array_equal(bindings(kept)["grown"].args[0].value.numpy(), BIAS.reshape(4, 1, 1, 1))
    assert op_names(FoldConstantOps(limit_bytes=432)(Grown)) == ["relax.add"]


def test_parameters_and_quantized_weights_are_not_folded() -> None:
    @I.ir_module
    class Kept:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"),
                 w: R.Tensor((16, 8), "float32")) -> R.Tensor((2, 16), "float32"):
            with R.dataflow():
                wt = R.permute_dims(w, axes=[1, 0])  # a parameter: set_params may replace it
                q = R.dequantize(R.const(np.ones((8, 16), "int8")), R.const(0.5, "float32"),
                                 R.const(0, "int8"))
                y = R.add(R.matmul(x, wt), R.matmul(x, q))
                R.output(y)
            return y

    assert FoldConstantOps()(Kept).same_as(Kept)  # nothing to fold: the module itself


@needs_dnnl
def test_the_report_names_a_conv_left_with_a_computed_weight_and_why() -> None:
    unfolded = lower_to_graph(ComputedWeight, None, 1, backends=["dnnl"])
    assert unfolded.declined == [("dnnl: nn.conv2d #1 'c' not taken: weight 'w' is computed, not constant "
                                  "(constant folding did not run on it)")]
    over = FoldConstantOps(limit_bytes=100)(ComputedWeight)
    assert computed_weight_notes(over["main"], ["dnnl"], limit_bytes=100) == [(
        "dnnl: nn.conv2d #1 'c' not taken: weight 'w' is computed, not constant (folding it would make "
        "432 B from 4 B, over the limit of 100 B)")]
    # build folds first: the conv is a oneDNN region and the report has no such line.
    artifact = tvm_hetero.build(ComputedWeight, [(tvm.cpu(0), "llvm")], backends=["dnnl"])
    assert artifact.build_report.backend_declined == []
    assert "NOT TAKEN" not in artifact.report()
    assert artifact.build_report.backend_regions[0][3] >= 3  # conv, bias add and relu in oneDNN


def prebound_light_model(path) -> onnx.ModelProto:
    """The light model at ``path`` with each ConstantOfShape weight written as the initializer it
    computes: the same model, its weights pre-bound."""
    model = onnx.load(str(path))
    initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    kept = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in initial:
            fill = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"),
                        np.zeros(1, "float32"))
            shape = tuple(int(d) for d in initial[node.input[0]])
            weight = np.full(shape, fill.reshape(-1)[0])
            model.graph.initializer.append(numpy_helper.from_array(weight, node.output[0]))
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


@needs_dnnl
def test_raw_light_squeezenet_gets_every_conv_into_onednn_and_runs_like_prebound_weights() -> None:
    """The ONNX wheel's light SqueezeNet as it is (every weight a ConstantOfShape), through TVM's
    frontend alone: the build folds the weights, so all 26 convs are oneDNN's and it runs as fast as
    the same model with its weights pre-bound (measured interleaved)."""
    from tvm_hetero.backends import resolve_backends
    from tvm_hetero.importers import from_onnx
    from tvm_hetero.testing.models import light_model_dir

    path = light_model_dir() / "light_squeezenet.onnx"
    raw = from_onnx(path, prepare=False)  # TVM's frontend only: the weights arrive as broadcasts
    assert sum(op == "relax.broadcast_to" for op in op_names(raw)) == 26
    lowered = lower_to_graph(FoldConstantOps()(raw), None, 1, backends=resolve_backends(["dnnl"]))
    in_regions = [op for r in lowered.regions.values() for op in r.ops]
    assert in_regions.count("relax.nn.conv2d") == 26, in_regions
    assert lowered.declined == []
    assert not [n.name for n in lowered.graph.nodes if "relax.nn.conv2d" in n.relax_ops
                and n.func_name not in lowered.regions]

    cpu = [(tvm.cpu(0), "llvm")]
    built = tvm_hetero.build(raw, cpu).create()
    prebound = tvm_hetero.build(from_onnx(prebound_light_model(path), prepare=False), cpu).create()
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("float32")
    times = {"raw": [], "prebound": []}
    for _ in range(7):  # interleaved, so load on the shared machine hits both alike
        for name, runtime in (("raw", built), ("prebound", prebound)):
            runtime.set_input(data_0=x)
            start = time.perf_counter()
            runtime.run()
            times[name].append(time.perf_counter() - start)
    np.testing.assert_allclose(built.get_output(0).numpy(), prebound.get_output(0).numpy(),
                               rtol=1e-5, atol=1e-6)
    ratio = np.median(times["raw"]) / np.median(times["prebound"])
    print(f"raw / prebound SqueezeNet: {ratio:.2f}x ({np.median(times['raw']) * 1e3:.1f} ms against "
          f"{np.median(times['prebound']) * 1e3:.1f} ms)")
    assert ratio < 2.0


@needs_dnnl
def test_cli_compiles_the_raw_light_squeezenet_with_the_regions_of_prebound_weights(tmp_path, capsys) -> None:
    from tvm_hetero import cli
    from tvm_hetero.importers import from_onnx
    from tvm_hetero.testing.models import light_model_dir

    path = light_model_dir() / "light_squeezenet.onnx"
    prebound = tvm_hetero.build(from_onnx(prebound_light_model(path), prepare=False), [(tvm.cpu(0), "llvm")])
    ((backend, device, regions, ops),) = prebound.build_report.backend_regions
    capsys.readouterr()
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "out"), "--device", "cpu:0=llvm"]) == 0
    report = capsys.readouterr().out
    regions_line = f"backend {backend} on device {device} (cpu:0): {regions} regions holding {ops} relax ops"
    assert regions_line in report
    assert "NOT TAKEN" not in report


def test_shape_arithmetic_on_a_static_input_folds() -> None:
    @I.ir_module
    class ShapeArithmetic:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                dims = R.shape_to_tensor(R.shape_of(x))
                grown = R.add(dims, R.const(np.array([1, 1], "int64"), "int64"))
                y = R.add(x, R.astype(R.sum(grown), "float32"))
                R.output(y)
            return y

    folded = FoldConstantOps()(ShapeArithmetic)
    assert op_names(folded) == ["relax.add"]
    assert float(bindings(folded)["y"].args[1].value.numpy()) == 7.0  # (2 + 1) + (3 + 1)
