"""The ops of a decoder's graphs in ONNX (what an accelerator reached through an ONNX Runtime EP is
asked about): RMSNorm, SiLU and constant slices compute on ONNX Runtime's CPU EP what TVM computes,
and a split read through its items becomes slices with the same values."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_hetero.ep_offload.onnx_regions import Unexportable, assemble, describe
from tvm_hetero.ep_offload.split_as_slices import SplitAsSlices

pytest.importorskip("onnxruntime")

X_SHAPE = (1, 3, 8)


def _one_op_function(make) -> relax.Function:
    """``main(x [1, 3, 8], w [8])`` returning ``make(x, w)``."""
    x = relax.Var("x", relax.TensorType(X_SHAPE, "float32"))
    w = relax.Var("w", relax.TensorType((X_SHAPE[-1],), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, w]):
        with builder.dataflow():
            out = builder.emit_output(make(x, w))
        builder.emit_func_output(out)
    return builder.get()["main"]


def _tvm_value(func: relax.Function, *values: np.ndarray) -> np.ndarray:
    mod = relax.transform.LegalizeOps()(tvm.IRModule({"main": func}))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(v) for v in values))
    return out.numpy()


def _onnx_value(func: relax.Function, *values: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    model, bound, output = assemble(describe(func), {}, "op")
    feeds = {f"in{position}": values[position] for position in bound}
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run([output], feeds)[0]


CASES = {
    "rms_norm": lambda x, w: relax.op.nn.rms_norm(x, w, axes=[-1], epsilon=1e-5),
    "silu": lambda x, w: relax.op.multiply(relax.op.nn.silu(x), w),
    "gelu_tanh": lambda x, w: relax.op.nn.gelu_tanh(x),
    "strided_slice": lambda x, w: relax.op.strided_slice(x, axes=[2], begin=[2], end=[6]),
    "strided_slice_strides": lambda x, w: relax.op.strided_slice(x, axes=[1, 2], begin=[0, 1], end=[3, 8],
                                                                 strides=[2, 3]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_decoder_op_in_onnx_computes_what_tvm_computes(name) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(X_SHAPE).astype("float32")
    w = rng.uniform(0.5, 1.5, X_SHAPE[-1]).astype("float32")
    func = _one_op_function(CASES[name])
    np.testing.assert_allclose(_onnx_value(func, x, w), _tvm_value(func, x, w), rtol=1e-5, atol=1e-6)


def test_an_rms_norm_over_axes_that_do_not_end_the_shape_has_no_onnx_form() -> None:
    func = _one_op_function(lambda x, w: relax.op.nn.rms_norm(
        x, relax.const(np.ones(3, "float32")), axes=[1]))
    with pytest.raises(Unexportable, match="rms_norm"):
        describe(func)


def _split_function() -> relax.Function:
    """A fused projection split three ways, each part scaled differently, added back up."""
    return _one_op_function(lambda x, w: _split_body(x))


def _split_body(x: relax.Expr) -> relax.Expr:
    parts = relax.op.split(x, [2, 5], axis=2)
    q, k, v = (relax.TupleGetItem(parts, i) for i in range(3))
    return relax.op.concat([relax.op.multiply(q, relax.const(2.0)), k, relax.op.negative(v)], axis=2)


def test_a_split_read_by_item_becomes_slices_with_the_same_values() -> None:
    mod = tvm.IRModule({"main": _split_function()})
    mod = relax.transform.Normalize()(mod)
    sliced = SplitAsSlices("main")(mod)
    ops = {b.value.op.name for blk in sliced["main"].body.blocks for b in blk.bindings
           if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}
    assert "relax.split" not in ops and "relax.strided_slice" in ops
    x = np.random.default_rng(1).standard_normal(X_SHAPE).astype("float32")
    w = np.ones(X_SHAPE[-1], "float32")
    np.testing.assert_array_equal(_tvm_value(sliced["main"], x, w), _tvm_value(mod["main"], x, w))


def test_a_split_returned_whole_stays_a_split() -> None:
    func = _one_op_function(lambda x, w: relax.op.split(x, 2, axis=2))
    mod = tvm.IRModule({"main": func})
    assert SplitAsSlices("main")(mod).same_as(mod)


def test_random_inputs_index_a_gather_within_its_axis_even_of_a_value_the_graph_makes() -> None:
    """A decode graph gathers its one logit row from a value it computes ([1, 1, hidden]): the
    capability probe's random indices must stay in [0, 1) there, and in a graph input's axis."""
    from onnx import TensorProto, helper
    from tvm_hetero.ep_offload.capability_probe import sample_feeds

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Gather", ["r", "row"], ["y"], axis=1),
             helper.make_node("Gather", ["table", "ids"], ["z"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4]),
                                           helper.make_tensor_value_info("row", TensorProto.INT32, [1]),
                                           helper.make_tensor_value_info("table", TensorProto.FLOAT, [3, 4]),
                                           helper.make_tensor_value_info("ids", TensorProto.INT32, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    for seed in range(4):
        feeds = sample_feeds(model, seed)
        assert feeds["row"].tolist() == [0]
        assert 0 <= feeds["ids"].min() and feeds["ids"].max() < 3
