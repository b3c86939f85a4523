"""The ORT + QNN peer (emulated HTP) and the exported model fixtures it is compared on."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from tvm_hetero.qnn import peer as qnn

needs_qnn = pytest.mark.skipif(not qnn.available(), reason="onnxruntime-qnn (QNN EP plugin and libQnnHtp.so) is not installed")


def conv_chain(middle: str | None = None, seed: int = 0):
    """``conv3x3 -> [middle] -> conv3x3 -> relu`` on float32[1, 3, 8, 8]; ``middle`` is an
    elementwise op type placed between the convolutions (None: nothing)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w0 = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) / 4).astype(np.float32), "w0")
    w1 = numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) / 4).astype(np.float32), "w1")
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1])]
    if middle is not None:
        nodes.append(helper.make_node(middle, ["a"], ["b"]))
    nodes += [helper.make_node("Conv", [nodes[-1].output[0], "w1"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w0, w1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def conv_inputs(seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)}


@needs_qnn
def test_tiny_conv_runs_wholly_on_the_htp():
    model, inputs = conv_chain(), conv_inputs()
    result = qnn.run_peer(model, inputs, repeat=2)
    assert result.ran, result.error
    assert (result.partitions, result.nodes_cpu) == (1, 0)
    assert len(result.times) == 2 and result.seconds > 0
    assert qnn.relative_error(result.outputs, qnn.cpu_reference(model, inputs)) < 1e-2  # fp16 on the HTP


@needs_qnn
def test_a_refused_op_between_convs_makes_two_partitions():
    result = qnn.run_peer(conv_chain("Erf"), conv_inputs(), repeat=1)
    assert result.ran, result.error
    assert result.partitions == 2
    assert result.cpu_ops == {"Erf": 1}
    assert any("Erf" in reason for reason in result.refusals)


@needs_qnn
def test_disabled_cpu_fallback_is_reported_not_raised():
    result = qnn.run_peer(conv_chain("Erf"), conv_inputs(), disable_cpu_fallback=True)
    assert not result.ran
    assert "fallback" in result.error.lower()
    assert any("Erf" in reason for reason in result.refusals)


@needs_qnn
def test_isolated_run_reports_what_an_in_process_run_does():
    model, inputs = conv_chain("Erf"), conv_inputs()
    here = qnn.run_peer(model, inputs, repeat=1)
    there = qnn.run_peer(model, inputs, repeat=1, isolated=True)
    assert there.ran, there.error
    assert (there.partitions, there.nodes_qnn, there.nodes_cpu) == (here.partitions, here.nodes_qnn, here.nodes_cpu)
    np.testing.assert_array_equal(there.outputs[0], here.outputs[0])


def test_isolated_run_reports_a_crash_of_the_child():
    # The hook aborts the child where the vendor library would run; needs neither QNN nor ORT there.
    result = qnn.run_peer(conv_chain(), conv_inputs(), isolated=True, _test_fault="abort")
    assert not result.ran
    assert result.exit_signal == signal.SIGABRT
    assert "SIGABRT" in result.error


def test_relative_error_is_against_the_largest_reference_value():
    reference = [np.array([10.0, -20.0]), np.array([1.0])]
    assert qnn.relative_error([np.array([10.0, -19.0]), np.array([1.0])], reference) == pytest.approx(0.05)
    assert qnn.relative_error([np.array([np.nan, -20.0]), np.array([1.0])], reference) == float("inf")
    assert qnn.relative_error([np.array([10.0])], reference) == float("inf")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v2_onnx", "small_bert_onnx"])
def test_exported_fixture_imports_into_relax_and_runs_on_onnxruntime(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm.relax.frontend.onnx import from_onnx
    from tvm_hetero.testing import export_models

    model = getattr(export_models, name)(seed=0)
    assert model.ir_version <= 10 and model.opset_import[0].version == export_models.OPSET
    from_onnx(model, keep_params_in_input=False)
    inputs = export_models.sample_inputs(model)
    (out,) = qnn.cpu_reference(model, inputs)
    assert np.all(np.isfinite(out)) and float(np.std(out)) > 1e-3  # seeded weights: outputs differ
