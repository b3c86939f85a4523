"""A float region as the QDQ model the HTP runs in precision "a16w8" (qnn/ep.py ``quantize``): an
additive mask's masked entries land below every real score (ep_offload/region_quantization.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm_hetero.ep_offload.region_quantization import MASK_MARGIN, mask_ranges
from tvm_hetero.ep_offload.sdk import cpu_session
from tvm_hetero.qnn import ep as qnn_ep

A16W8 = {"precision": "a16w8", "soc_model": 60, "htp_arch": 73}


def _model(nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray]) -> bytes:
    graph = helper.make_graph(nodes, "region", inputs, outputs,
                              [numpy_helper.from_array(w, name) for name, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def _float(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


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
