"""Constant folding in lowering (compiler/fold_constants.py): what folds, what does not, and outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_hetero
from test_lower import assert_close, assert_well_formed, conv_relu_gemm_model, run_lowered
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_hetero.compiler.lower import lower_to_graph

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
