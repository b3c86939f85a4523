"""Constants of every kind Relax has (tensors of any dtype and rank, prim values, shapes, strings,
data types, tuples of them) read by the HTP backend through one helper; real models whose
constants are prim values (MobileNetV3's hardswish clips, BERT's position-id slice) build for the
HTP and match."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm import relax
from tvm_hetero.ep_offload.constant_chains import fold_constant_chains
from tvm_hetero.ep_offload.onnx_regions import assemble, describe
from tvm_hetero.ir.constant_values import (
    NotConstant,
    constant_bytes,
    is_literal,
    is_tensor_constant,
    literal_value,
    scalar_value,
    tensor_value,
)
from tvm_hetero.qnn import ep as qnn_ep

CPU = (tvm.cpu(0), "llvm")
#: The fp16 tolerance the HTP tests use (relative to the largest reference value).
FP16_TOLERANCE = 1e-2


def _kinds() -> dict[str, object]:
    dtype_const = relax.op.builtin.alloc_tensor(relax.ShapeExpr([2]), "float32", 0).args[1]
    return {
        "tensor int64 0-d": relax.const(3, "int64"),
        "tensor float16 2x3": relax.const(np.full((2, 3), 0.5, "float16")),
        "tensor bool 1-d": relax.const(np.array([True, False])),
        "prim int": relax.prim_value(7),
        "prim float": relax.prim_value(tvm.tirx.FloatImm("float32", 1.5)),
        "prim bool": tvm.tirx.IntImm("bool", 1),
        "string": tvm.ir.StringImm("global"),
        "data type": dtype_const,
        "static shape": relax.ShapeExpr([1, 2]),
        "tuple of ints": relax.Tuple([relax.prim_value(0), relax.prim_value(8)]),
    }


def test_every_kind_of_constant_has_a_value_and_nothing_raises() -> None:
    kinds = _kinds()
    tensors = {name: tensor_value(expr) for name, expr in kinds.items()}
    assert tensors["tensor int64 0-d"].dtype == np.int64 and tensors["tensor int64 0-d"].shape == ()
    assert tensors["tensor float16 2x3"].dtype == np.float16 and tensors["tensor float16 2x3"].shape == (2, 3)
    assert tensors["prim int"].tolist() == 7 and tensors["prim int"].dtype == np.int64
    assert tensors["prim float"].dtype == np.float32 and tensors["prim float"].tolist() == 1.5
    assert tensors["static shape"].tolist() == [1, 2]
    assert tensors["tuple of ints"].tolist() == [0, 8]
    assert tensors["string"] is None and tensors["data type"] is None
    assert literal_value(kinds["string"]) == "global" and str(literal_value(kinds["data type"])) == "float32"
    assert literal_value(kinds["prim bool"]) is True
    assert [scalar_value(kinds[k]) for k in ("tensor int64 0-d", "prim int", "prim float", "tensor float16 2x3")] == [
        3.0, 7.0, 1.5, None]
    # Only tensors are operands with data of their own; every kind is a literal.
    assert {k for k, e in kinds.items() if is_tensor_constant(e)} == {
        "tensor int64 0-d", "tensor float16 2x3", "tensor bool 1-d"}
    assert all(is_literal(e) for e in kinds.values())
    assert constant_bytes(kinds["tensor float16 2x3"]) == 12 and constant_bytes(kinds["prim int"]) == 0


def test_what_is_not_a_constant_says_so() -> None:
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    symbolic = relax.ShapeExpr([2, tvm.tirx.Var("n", "int64")])
    for expr in (x, symbolic, relax.Tuple([x])):
        assert tensor_value(expr) is None and scalar_value(expr) is None and not is_literal(expr)
        with pytest.raises(NotConstant):
            literal_value(expr)


def _function(params: list[relax.Var], build) -> relax.Function:
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb))
        bb.emit_func_output(out)
    return bb.get()["main"]


def test_a_clip_with_prim_value_bounds_is_exported_and_computes_the_same() -> None:
    """MobileNetV3's hardswish: add(x, 3) -> clip(., 0, 6) (prim-value bounds) -> divide by 6 -> x * ."""
    x = relax.Var("x", relax.TensorType((1, 4, 3, 3), "float32"))

    def body(bb):
        shifted = bb.emit(relax.op.add(x, relax.const(3.0, "float32")))
        clipped = bb.emit(relax.op.clip(shifted, relax.prim_value(0), relax.prim_value(6)))
        return relax.op.multiply(x, bb.emit(relax.op.divide(clipped, relax.const(6.0, "float32"))))

    func = _function([x], body)
    spec = describe(func)
    assert [n["op"] for n in spec["nodes"]] == ["Add", "Clip", "Div", "Mul"]
    model, _bound, output = assemble(spec, {}, "hardswish")
    import onnxruntime as ort

    values = np.linspace(-5, 5, 36, dtype="float32").reshape(1, 4, 3, 3)
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run([output], {"in0": values})[0]
    np.testing.assert_allclose(got, values * np.clip(values + 3, 0, 6) / 6, rtol=1e-6, atol=1e-6)


def test_a_constant_chain_sliced_by_integer_constants_folds() -> None:
    """BERT's position ids: a constant table sliced with prim-value begin/end, then read by a take."""
    table = relax.Var("table", relax.TensorType((32, 4), "float32"))
    positions = np.arange(32, dtype="int64").reshape(1, 32)

    def body(bb):
        ids = bb.emit(relax.op.strided_slice(relax.const(positions), axes=[1], begin=[0], end=[8]))
        return relax.op.take(table, ids, axis=0)

    func = _function([table], body)
    folded = fold_constant_chains(func)
    assert folded is not func
    taken = [b.value for blk in folded.body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.take"]
    assert len(taken) == 1 and is_tensor_constant(taken[0].args[1])
    np.testing.assert_array_equal(tensor_value(taken[0].args[1]), positions[:, :8])


needs_qnn = pytest.mark.skipif(not qnn_ep.available(),
                               reason="onnxruntime-qnn is not installed (pip install 'tvm-hetero[qnn]')")


@needs_qnn
@pytest.mark.slow
def test_mobilenet_v3_small_from_onnx_builds_for_the_htp_as_one_graph_and_matches() -> None:
    import onnxruntime as ort
    import torch
    from tvm_hetero.importers import from_onnx
    from tvm_hetero.testing.torch_models import onnx_export

    torch.manual_seed(0)
    model = onnx_export("mobilenet_v3_small", (torch.randn(1, 3, 96, 96),))
    art = tvm_hetero.build(from_onnx(model), [CPU, "qnn-htp"])
    htp = art.build_report.offload
    # Every op (the hardswish and hardsigmoid clips included) in one QNN graph.
    assert htp.graph_executions == 1 and htp.accepted == htp.asked, art.report()
    x = np.random.default_rng(1).standard_normal((1, 3, 96, 96)).astype("float32")
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input0": x})[0]
    rt = art.create()
    rt.set_input("input0", x)
    rt.run()
    got = rt.get_output(0).numpy()
    assert np.abs(got - expected).max() <= FP16_TOLERANCE * np.abs(expected).max()


@needs_qnn
@pytest.mark.slow
def test_bert_from_torch_builds_for_the_htp_and_matches() -> None:
    import torch
    import transformers as hf
    from tvm_hetero.importers import from_torch

    torch.manual_seed(0)
    config = hf.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=32)
    bert = hf.BertModel(config).eval()
    ids = torch.randint(0, 64, (1, 8))
    mask = torch.ones(1, 8, dtype=torch.int64)
    with torch.no_grad():
        expected = bert(ids, mask).last_hidden_state.numpy()
    art = tvm_hetero.build(from_torch(bert, (ids, mask)), [CPU, "qnn-htp"])
    assert art.build_report.offload.flops_on_device > 0.9 * art.build_report.offload.flops, art.report()
    rt = art.create()
    rt.run(**dict(zip(art.input_names, [ids.numpy(), mask.numpy()])))
    got = rt.get_output(0).numpy()
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= FP16_TOLERANCE * np.abs(expected).max()


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
def test_a_pad_is_exported_and_computes_what_tvm_computes(mode) -> None:
    """Hugging Face's MobileNetV2 pads the TensorFlow way (relax.nn.pad before each strided conv)."""
    import onnxruntime as ort

    x = relax.Var("x", relax.TensorType((1, 2, 4, 5), "float32"))
    func = _function([x], lambda bb: relax.op.nn.pad(x, [0, 0, 0, 0, 1, 2, 0, 1], mode, 1.5))
    model, _bound, output = assemble(describe(func), {}, "pad")
    values = np.arange(40, dtype="float32").reshape(1, 2, 4, 5)
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run([output], {"in0": values})[0]
    mod = relax.transform.LegalizeOps()(tvm.IRModule({"main": func}))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    np.testing.assert_array_equal(got, vm["main"](tvm.runtime.tensor(values)).numpy())
