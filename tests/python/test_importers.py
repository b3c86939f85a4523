"""Importing the ONNX models users export (importers.from_onnx, onnx_prepare.py): transformers' GPT-2,
BERT and MobileNetV2 import, build and match ONNX Runtime; input shapes; one-line errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
import tvm_hetero
from onnx import TensorProto, helper, numpy_helper
from tvm_hetero import cli
from tvm_hetero.importers import OnnxImportError, from_onnx
from tvm_hetero.ir.relax_helpers import LoweringError
from tvm_hetero.onnx_prepare import prepare_onnx
from tvm_hetero.testing import export_models
from tvm_hetero.testing.models import onnxruntime_outputs

CPU = [(tvm.cpu(0), "llvm")]
TOKENS = {"input_ids": (1, export_models.BERT_SEQUENCE), "attention_mask": (1, export_models.BERT_SEQUENCE)}
EXPORTERS = {
    "gpt2": export_models.transformers_gpt2_onnx,
    "bert": export_models.transformers_bert_onnx,
    "mobilenet_v2": export_models.transformers_mobilenet_v2_onnx,
}


@pytest.fixture(scope="module", params=sorted(EXPORTERS))
def exported(request) -> tuple[str, onnx.ModelProto]:
    return request.param, EXPORTERS[request.param]()


def run_built(mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> np.ndarray:
    runtime = tvm_hetero.build(mod, CPU).create()
    runtime.run(**inputs)
    return runtime.get_output(0).numpy()


def test_transformers_model_imports_builds_and_matches_onnxruntime(exported) -> None:
    name, model = exported
    inputs = export_models.sample_inputs(model)
    expected = onnxruntime_outputs(model, inputs)[0]
    out = run_built(from_onnx(model), inputs)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()),
                               err_msg=name)


def test_transformers_model_needs_the_preparation(exported) -> None:
    """TVM's frontend alone rejects each of them (ConstantOfShape of a 0-d shape, dynamic pads): the
    preparation is what makes them import, and the error names the node it stopped at."""
    name, model = exported
    with pytest.raises(OnnxImportError, match=r"^ONNX node '[^']+' \((ConstantOfShape|Pad)\): ") as info:
        from_onnx(model, prepare=False)
    assert "\n" not in str(info.value), name


def test_preparation_folds_shape_arithmetic_into_initializers(exported) -> None:
    name, model = exported
    prepared = prepare_onnx(model)
    left = {node.op_type for node in prepared.graph.node}
    assert not left & {"Shape", "ConstantOfShape", "Constant", "Range"}, (name, left)
    assert len(prepared.graph.node) < len(model.graph.node)
    inputs = export_models.sample_inputs(model)
    np.testing.assert_allclose(onnxruntime_outputs(prepared, inputs)[0],
                               onnxruntime_outputs(model, inputs)[0], rtol=1e-5, atol=1e-5)


# ---- symbolic dims and input shapes ----------------------------------------------------------
@pytest.fixture(scope="module")
def dynamic_gpt2() -> onnx.ModelProto:
    return export_models.transformers_gpt2_onnx(dynamic=True)


def token_inputs(batch: int, sequence: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    mask = np.ones((batch, sequence), dtype=np.int64)
    mask[:, -2:] = 0
    return {"input_ids": rng.integers(0, export_models.BERT_VOCAB, (batch, sequence), dtype=np.int64),
            "attention_mask": mask}


def test_dynamic_gpt2_builds_for_the_shapes_given(dynamic_gpt2) -> None:
    dims = dynamic_gpt2.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["batch", "sequence"]
    inputs = token_inputs(2, 12)
    mod = from_onnx(dynamic_gpt2, input_shapes={"input_ids": (2, 12), "attention_mask": (2, 12)})
    expected = onnxruntime_outputs(dynamic_gpt2, inputs)[0]
    np.testing.assert_allclose(run_built(mod, inputs), expected, rtol=1e-4,
                               atol=1e-4 * float(np.abs(expected).max()))


def test_what_the_frontend_cannot_take_is_one_line_naming_the_node(dynamic_gpt2) -> None:
    """With its dims left symbolic GPT-2 takes apart a shape TVM's frontend does not know the rank of,
    which it cannot convert: the error is the node's name and op type and the frontend's reason, on
    one line."""
    with pytest.raises(OnnxImportError) as info:
        from_onnx(dynamic_gpt2)
    message = str(info.value)
    assert "\n" not in message
    node = message.split("'")[1]
    op_type = {n.name: n.op_type for n in dynamic_gpt2.graph.node}[node]
    assert message.startswith(f"ONNX node '{node}' ({op_type}): ")
    reason = message.split("): ", 1)[1]
    assert "Traceback" not in reason and "shape" in reason  # the frontend's reason (a shape it cannot take)
    # The likely fix, too.
    assert "input_ids (batch, sequence)" in message and "--input-shape input_ids=" in message


def test_an_op_the_frontend_lacks_is_named_with_its_node() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="first"),
         helper.make_node("Det", ["r"], ["y"], name="det_node")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError, match=r"^ONNX node 'det_node' \(Det\): .*Det"):
        from_onnx(model)


def conv_model(batch: int | str = "batch") -> onnx.ModelProto:
    """A conv + relu on float32[batch, 3, 8, 8] (``batch`` symbolic by default)."""
    values = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    weight = numpy_helper.from_array(values, "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["data", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")],
        "g", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = export_models.IR_VERSION
    return model


def test_symbolic_dims_survive_import_and_the_build_names_the_input_and_the_flag() -> None:
    mod = from_onnx(conv_model())
    assert str(mod["main"].params[0].ty.shape.values[0]) == "batch"  # kept for BindSymbolicVars
    with pytest.raises(LoweringError) as info:
        tvm_hetero.build(mod, CPU)
    message = str(info.value)
    assert "input 'data'" in message and "(batch, 3, 8, 8)" in message
    assert "--input-shape data=" in message and "input_shapes=" in message


def test_a_symbolic_import_specialised_afterwards_builds() -> None:
    model = conv_model()
    mod = tvm.relax.transform.BindSymbolicVars({"batch": 3})(from_onnx(model))
    x = np.random.default_rng(1).standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run_built(mod, {"data": x}), onnxruntime_outputs(model, {"data": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_input_shapes_make_a_symbolic_model_buildable() -> None:
    model = conv_model()
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    out = run_built(from_onnx(model, input_shapes={"data": (2, 3, 8, 8)}), {"data": x})
    np.testing.assert_allclose(out, onnxruntime_outputs(model, {"data": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shapes, message", [
    ({"image": (1, 3, 8, 8)}, "no input 'image' (inputs: data)"),
    ({"data": (1, 3, 8)}, "3 dims given, the input has 4 (batch, 3, 8, 8)"),
    ({"data": (1, 4, 8, 8)}, "dim 1 is 4, but the model fixes it to 3"),
    ({"data": (0, 3, 8, 8)}, "dim 0 is 0; dims must be positive"),
])
def test_bad_input_shapes_name_the_input(shapes, message) -> None:
    with pytest.raises(ValueError, match="^input_shapes") as info:
        from_onnx(conv_model(), input_shapes=shapes)
    assert message in str(info.value)


def test_cli_compile_takes_input_shapes(tmp_path, capsys) -> None:
    path = tmp_path / "conv.onnx"
    onnx.save(conv_model(), str(path))
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "out"), "--input-shape", "data=2,3,8,8",
                     "--backend", "none"]) == 0
    artifact = tvm_hetero.load(str(tmp_path / "out"))
    runtime = artifact.create()
    x = np.ones((2, 3, 8, 8), np.float32)
    runtime.run(data=x)
    assert runtime.get_output(0).numpy().shape == (2, 4, 8, 8)
    capsys.readouterr()
    # Without it, one line naming the input and the flag.
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "again")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "input 'data'" in err and "--input-shape data=" in err


@pytest.mark.parametrize("spec", ["data", "data=", "data=1,x", "data=1,0,8,8", "=1,2"])
def test_cli_rejects_a_malformed_input_shape(tmp_path, capsys, spec) -> None:
    path = tmp_path / "conv.onnx"
    onnx.save(conv_model(), str(path))
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "out"), "--input-shape", spec]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--input-shape" in err and "NAME=D0,D1" in err


def test_preparation_folds_constant_generators_but_keeps_quantized_weights() -> None:
    """A weight made by ConstantOfShape becomes an initializer; a DequantizeLinear of an int8 weight
    stays (the backends' QDQ units read it), and so does the MatMul reading it."""
    shape = numpy_helper.from_array(np.array([4, 4], np.int64), "shape")
    q = numpy_helper.from_array(np.arange(16, dtype=np.int8).reshape(4, 4), "q")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["ones"], name="fill",
                          value=numpy_helper.from_array(np.ones(1, np.float32))),
         helper.make_node("DequantizeLinear", ["q", "scale"], ["w"], name="dq"),
         helper.make_node("MatMul", ["x", "ones"], ["a"], name="mm_ones"),
         helper.make_node("MatMul", ["a", "w"], ["y"], name="mm_w")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [shape, q, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = export_models.IR_VERSION
    prepared = prepare_onnx(model)
    assert [n.name for n in prepared.graph.node] == ["dq", "mm_ones", "mm_w"]
    ones = {t.name: numpy_helper.to_array(t) for t in prepared.graph.initializer}["ones"]
    np.testing.assert_array_equal(ones, np.ones((4, 4), np.float32))
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_outputs(prepared, {"x": x})[0],
                               onnxruntime_outputs(model, {"x": x})[0], rtol=1e-6)


def test_a_folded_value_read_only_inside_a_branch_stays() -> None:
    """An If's branches read the outer graph's values by name: a folded value they read is kept."""
    shape = numpy_helper.from_array(np.array([2], np.int64), "shape")
    branch = helper.make_graph([helper.make_node("Add", ["x", "twos"], ["out"])], "then", [],
                               [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["out2"])], "else", [],
                              [helper.make_tensor_value_info("out2", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["twos"],
                          value=numpy_helper.from_array(np.full(1, 2.0, np.float32))),
         helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = export_models.IR_VERSION
    prepared = prepare_onnx(model)
    assert [n.op_type for n in prepared.graph.node] == ["If"]
    feeds = {"x": np.array([1.0, 3.0], np.float32), "c": np.array(True)}
    np.testing.assert_array_equal(onnxruntime_outputs(prepared, feeds)[0], [3.0, 5.0])


def test_static_dims_picked_out_of_a_partly_symbolic_shape_fold() -> None:
    """Pads computed from the static height and width of an input whose batch is symbolic (a
    "same" padding as exporters write it): the picked dims fold, so the pads are constants, the
    batch stays symbolic, and the model builds once the batch is bound."""
    const = {name: numpy_helper.from_array(np.array(value, np.int64), name) for name, value in
             {"two": [2], "four": [4], "six": [6, 6], "zeros": [0, 0]}.items()}
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Slice", ["shape", "two", "four"], ["hw"]),
         helper.make_node("Sub", ["six", "hw"], ["after"]),
         helper.make_node("Concat", ["zeros", "zeros", "zeros", "after"], ["pads"], axis=0),
         helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1, 6, 6])], list(const.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = export_models.IR_VERSION
    prepared = prepare_onnx(model)
    assert [n.op_type for n in prepared.graph.node] == ["Pad"]
    mod = from_onnx(model)
    assert str(mod["main"].params[0].ty.shape.values[0]) == "batch"
    x = np.random.default_rng(4).standard_normal((2, 1, 5, 5)).astype(np.float32)
    out = run_built(tvm.relax.transform.BindSymbolicVars({"batch": 2})(mod), {"x": x})
    np.testing.assert_array_equal(out, onnxruntime_outputs(model, {"x": x})[0])


def test_mobilenet_v2_of_symbolic_batch_imports_symbolic_and_builds_once_bound() -> None:
    model = export_models.transformers_mobilenet_v2_onnx(dynamic_batch=True)
    mod = from_onnx(model)
    assert str(mod["main"].params[0].ty.shape.values[0]) == "batch"
    x = np.random.default_rng(5).standard_normal((2, 3, 96, 96)).astype(np.float32)
    expected = onnxruntime_outputs(model, {"pixel_values": x})[0]
    out = run_built(tvm.relax.transform.BindSymbolicVars({"batch": 2})(mod), {"pixel_values": x})
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))
