"""QDQ (quantize-dequantize) versions of ONNX models, made with ONNX Runtime's own tool.

:func:`qdq_model` is what a user would do to get an int8 model: ``quantize_static`` in QDQ format,
uint8 activations, int8 weights (symmetric), calibrated on a few seeded random batches. Tests and
benches use it to compare our int8 execution with ONNX Runtime's on the same quantized model.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from .export_models import sample_inputs


def qdq_model(model, per_channel: bool, calibration_batches: int = 4, seed: int = 0):
    """A QDQ copy of the ONNX ``model``: ``quantize_static`` (QDQ format, uint8 activations with zero
    points, int8 symmetric weights, per output channel when ``per_channel``), calibrated with the
    min-max method on ``calibration_batches`` seeded batches of :func:`.export_models.sample_inputs`
    (standard normal floats, token ids and attention masks for a BERT)."""
    import onnx
    import onnx.version_converter
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class _Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = iter([sample_inputs(model, seed=seed + i) for i in range(calibration_batches)])

        def get_next(self):
            return next(self._batches, None)

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 13:  # per-channel DequantizeLinear (its axis) needs opset 13
        model = onnx.version_converter.convert_version(model, 13)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "qdq.onnx")
        onnx.save(model, src)
        quantize_static(src, dst, _Batches(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        return onnx.load(dst)


def quantization_step(model) -> float:
    """The largest scale of the QuantizeLinear nodes feeding the graph's outputs: one step of the
    output's quantization (outputs compare within it). 0.0 when no output is quantized."""
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producers = {}
    for node in model.graph.node:
        for out in node.output:
            producers[out] = node
    steps = []
    for out in model.graph.output:
        node = producers.get(out.name)
        if node is not None and node.op_type == "DequantizeLinear":
            scale = inits.get(node.input[1])
            if scale is not None:
                steps.append(float(np.max(scale)))
    return max(steps, default=0.0)


def small_qdq_float_model(seed: int = 0):
    """A float ONNX model with one of each unit kind the int8 path handles, on float32[1, 3, 16, 16]:
    conv3x3+bias+relu -> maxpool -> conv1x1+bias -> Add (residual) -> relu -> concat (with the
    pool's output) -> AveragePool -> GlobalAveragePool -> flatten -> Gemm (transB) -> logits[1, 10].
    Quantize it with :func:`qdq_model`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def init(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [init("w1", (8, 3, 3, 3), 0.3), init("b1", (8,), 0.1), init("w2", (8, 8, 1, 1), 0.3),
             init("b2", (8,), 0.1), init("w3", (10, 16), 0.3), init("b3", (10,), 0.1),
             numpy_helper.from_array(np.array([1, 16], np.int64), "shape")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"]),
        helper.make_node("Add", ["c2", "p1"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Concat", ["r2", "p1"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["ap"], ["gap"]),
        helper.make_node("Reshape", ["gap", "shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "small_qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


__all__ = ["qdq_model", "quantization_step", "small_qdq_float_model"]
