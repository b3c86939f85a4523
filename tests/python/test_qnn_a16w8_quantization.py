"""A float region as the QDQ model the HTP runs in precision "a16w8" (qnn/ep.py ``quantize``): the
weights QNN takes per channel get a symmetric scale per output channel (qnn/per_channel_weights.py),
and an additive mask's masked entries land below every real score (ep_offload/region_quantization.py).

The quantized models run on ONNX Runtime's CPU EP here; the tests marked ``htp`` hand them to the
emulated HTP (onnxruntime-qnn's x86 libQnnHtp.so) and are skipped without it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm_hetero.ep_offload.region_quantization import MASK_MARGIN, mask_ranges
from tvm_hetero.ep_offload.sdk import cpu_session
from tvm_hetero.qnn import ep as qnn_ep
from tvm_hetero.qnn.per_channel_weights import per_channel_weights

A16W8 = {"precision": "a16w8", "soc_model": 60, "htp_arch": 73}
ROWS, IN, OUT = 8, 32, 24

htp = pytest.mark.skipif(not qnn_ep.available(),
                         reason="onnxruntime-qnn is not installed (pip install 'tvm-hetero[qnn]')")


def _model(nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray]) -> bytes:
    graph = helper.make_graph(nodes, "region", inputs, outputs,
                              [numpy_helper.from_array(w, name) for name, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def _float(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _weight(rng: np.random.Generator, rows: int, columns: int) -> np.ndarray:
    """Columns of very different sizes (0.01 to 1): one scale for all of them leaves the small ones
    a few steps."""
    return (rng.normal(size=(rows, columns)) * np.logspace(-2, 0, columns)[None, :]).astype(np.float32)


def _three_forms(rng: np.random.Generator) -> bytes:
    """x -> MatMul (in, out) -> Gemm (transB) -> Conv 1x1 (as NCHW with H = 1): the three forms."""
    nodes = [helper.make_node("MatMul", ["x", "w_matmul"], ["a"], name="matmul"),
             helper.make_node("Gemm", ["a", "w_gemm", "b_gemm"], ["b"], name="gemm", transB=1),
             helper.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]),
             helper.make_node("Reshape", ["bt", "nchw"], ["c"]),
             helper.make_node("Conv", ["c", "w_conv"], ["y"], name="conv", kernel_shape=[1, 1])]
    weights = {"w_matmul": _weight(rng, IN, OUT), "w_gemm": np.ascontiguousarray(_weight(rng, OUT, OUT).T),
               "b_gemm": rng.normal(size=OUT).astype(np.float32),
               "nchw": np.array([1, OUT, 1, ROWS], np.int64),
               "w_conv": np.ascontiguousarray(_weight(rng, OUT, OUT).T).reshape(OUT, OUT, 1, 1)}
    return _model(nodes, [_float("x", [ROWS, IN])], [_float("y", [1, OUT, 1, ROWS])], weights)


def _feeds(rng: np.random.Generator, count: int = 8) -> list[dict]:
    return [{"x": rng.normal(size=(ROWS, IN)).astype(np.float32)} for _ in range(count)]


def _weight_dequantizes(model: bytes) -> dict[str, tuple[int, int, tuple, set]]:
    """Per op reading a dequantized weight: (weight dtype, axis or -1, scale shape, zero points)."""
    proto = onnx.load_from_string(model)
    inits = {i.name: i for i in proto.graph.initializer}
    made_by = {out: node for node in proto.graph.node for out in node.output}
    found = {}
    for node in proto.graph.node:
        for name in node.input:
            dq = made_by.get(name)
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits or node.name in found:
                continue
            axis = next((a.i for a in dq.attribute if a.name == "axis"), -1)
            scale = numpy_helper.to_array(inits[dq.input[1]])
            zero_points = set(numpy_helper.to_array(inits[dq.input[2]]).ravel().tolist())
            found[node.name] = (inits[dq.input[0]].data_type, axis if scale.size > 1 else -1, scale.shape, zero_points)
    return found


def _relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def test_each_weight_qnn_takes_per_channel_gets_a_symmetric_uint8_scale_per_output_channel() -> None:
    rng = np.random.default_rng(0)
    model, feeds = _three_forms(rng), _feeds(rng)
    quantized = qnn_ep.quantize(model, A16W8, feeds)
    weights = _weight_dequantizes(quantized)
    uint8, symmetric = TensorProto.UINT8, {128}
    assert weights["matmul"] == (uint8, 1, (OUT,), symmetric)  # (in, out): a scale per column
    assert weights["gemm"] == (uint8, 0, (OUT,), symmetric)  # transB: (out, in), a scale per row
    assert weights["conv"] == (uint8, 0, (OUT,), symmetric)  # (out, in, 1, 1)


def test_a_scale_per_channel_keeps_the_small_columns_that_one_scale_for_all_loses() -> None:
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")]
    model = _model(nodes, [_float("x", [ROWS, IN])], [_float("y", [ROWS, OUT])], {"w": _weight(rng, IN, OUT)})
    feeds = _feeds(rng)
    reference = cpu_session(model).run(None, feeds[0])[0]

    def worst_column(quantized: bytes) -> float:
        got = cpu_session(quantized).run(None, feeds[0])[0]
        return float((np.abs(got - reference).max(0) / np.abs(reference).max(0)).max())

    per_channel = worst_column(qnn_ep.quantize(model, A16W8, feeds))
    per_tensor = worst_column(_by_qnn_configuration(model, feeds))
    assert per_channel < 0.05 < per_tensor, (per_channel, per_tensor)


def _by_qnn_configuration(model: bytes, feeds: list[dict], weights: dict | None = None) -> bytes:
    """The region through ONNX Runtime's QNN configuration with ``weights`` as the only weight
    overrides (none: one scale per weight, as QNN's configuration makes it)."""
    import os
    import tempfile

    import onnxruntime.quantization as ortq
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
    from tvm_hetero.ep_offload.region_quantization import feed_reader, prepare

    proto, overrides = prepare(model, feeds)
    config = get_qnn_qdq_config(proto, feed_reader(feeds), activation_type=ortq.QuantType.QUInt16,
                                weight_type=ortq.QuantType.QUInt8, init_overrides={**overrides, **(weights or {})})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "region_qdq.onnx")
        ortq.quantize(proto, path, config)
        with open(path, "rb") as f:
            return f.read()


def test_a_table_read_by_a_gather_and_a_matmul_gets_a_copy_of_its_own_for_the_matmul() -> None:
    """A tied embedding: QNN refuses a per-channel table under a Gather, so the output projection
    reads a per-channel copy and the Gather keeps the table, quantized per tensor."""
    rng = np.random.default_rng(1)
    vocab, hidden = 40, 16
    table = (rng.normal(size=(hidden, vocab)) * 0.5).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=1),
             helper.make_node("Transpose", ["e"], ["rows"], perm=[1, 0]),
             helper.make_node("MatMul", ["rows", "table"], ["logits"], name="project")]
    model = _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT32, [4])],
                   [_float("logits", [4, vocab])], {"table": table})
    proto = onnx.load_from_string(model)
    overrides = per_channel_weights(proto)
    (copy,) = overrides
    assert copy != "table" and overrides[copy][0]["axis"] == 1
    readers = {node.name: list(node.input) for node in proto.graph.node}
    assert readers["embed"][0] == "table" and readers["project"][1] == copy
    assert {i.name for i in proto.graph.initializer} == {"table", copy}

    feeds = [{"ids": rng.integers(0, vocab, size=4).astype(np.int32)} for _ in range(4)]
    quantized = qnn_ep.quantize(model, A16W8, feeds)
    weights = _weight_dequantizes(quantized)
    assert weights["project"][1:3] == (1, (vocab,))
    assert weights["embed"][1] == -1  # per tensor
    assert _relative_error(cpu_session(quantized).run(None, feeds[0])[0],
                           cpu_session(model).run(None, feeds[0])[0]) < 2e-2


def test_the_masks_floor_lies_below_every_real_score_by_the_margin_plus_the_scores_span() -> None:
    # the mask's own values are 0; the scores it is added to reach -40 and 50
    ranges = mask_ranges({"mask", "scores"}, {"mask": 0.0, "scores": -40.0}, {"mask": 0.0, "scores": 50.0})
    floor = -40.0 - 50.0 - MASK_MARGIN
    assert ranges == {"mask": [{"rmin": np.float32(floor), "rmax": np.float32(0.0)}],
                      "scores": [{"rmin": np.float32(floor), "rmax": np.float32(50.0)}]}


def test_a_masked_score_lands_below_every_real_score_of_its_row() -> None:
    """A mask is quantized before it is added: a masked entry of the mask must stay below a real
    score even when the score it masks is the highest of the row. (The floor of the mask's own
    lowest value minus 64 made 50 - 64 = -14 of a masked 50, above a real -40: the row's softmax
    picked the masked entry.)"""
    nodes = [helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1)]
    model = _model(nodes, [_float("scores", [2, 2]), _float("mask", [2, 2])], [_float("p", [2, 2])], {})
    scores = np.array([[50.0, -40.0], [10.0, 20.0]], np.float32)
    mask = np.array([[-1e30, 0.0], [0.0, 0.0]], np.float32)
    feeds = [{"scores": scores, "mask": mask}]
    quantized = qnn_ep.quantize(model, A16W8, feeds)
    p = cpu_session(quantized).run(None, feeds[0])[0]
    expected = cpu_session(model).run(None, feeds[0])[0]
    assert expected[0, 1] == pytest.approx(1.0)
    assert np.abs(p - expected).max() < 1e-3, p


@htp
def test_the_htp_takes_the_per_channel_forms_and_computes_them() -> None:
    """QNN compiles every per-channel weight (nothing left for the CPU: the session refuses any
    fallback) and its result is the QDQ model's, with the scales per channel honoured."""
    rng = np.random.default_rng(2)
    model, feeds = _three_forms(rng), _feeds(rng)
    quantized = qnn_ep.quantize(model, A16W8, feeds)
    got = qnn_ep.accelerator_session(quantized, A16W8).run(None, feeds[0])[0]
    qdq_on_cpu = cpu_session(quantized).run(None, feeds[0])[0]
    assert _relative_error(got, qdq_on_cpu) < 2e-3
    assert _relative_error(got, cpu_session(model).run(None, feeds[0])[0]) < 3e-2


@htp
def test_the_htp_refuses_asymmetric_per_channel_weights() -> None:
    """Why the scales are symmetric: QNN's validation refuses a FullyConnected whose per-channel
    weight has zero points other than the middle of the range."""
    from onnxruntime.quantization import QuantType

    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")]
    model = _model(nodes, [_float("x", [ROWS, IN])], [_float("y", [ROWS, OUT])],
                   {"w": _weight(rng, IN, OUT) + np.float32(0.3)})
    asymmetric = _by_qnn_configuration(model, _feeds(rng, 4),
                                       {"w": [{"axis": 1, "quant_type": QuantType.QUInt8, "symmetric": False}]})
    assert len(_weight_dequantizes(asymmetric)["matmul"][3]) > 1  # zero points per channel
    ok, reason = qnn_ep.accepts(asymmetric, A16W8)
    assert not ok and "FullyConnected" in reason, reason
