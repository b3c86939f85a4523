"""QDQ units run as oneDNN int8: each unit kind alone, quantized by onnxruntime's quantize_static,
per tensor and per channel, is within one quantization step of onnxruntime's own int8 result, and
the build report says how its units ran."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import tvm
import tvm_hetero
from onnx import TensorProto, helper, numpy_helper
from test_byoc import HAS_DNNL
from tvm_hetero.testing import models
from tvm_hetero.testing.quantized import qdq_model, quantization_step, small_qdq_float_model

pytestmark = pytest.mark.skipif(not HAS_DNNL, reason="libtvm_hetero was built without oneDNN")
logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on pre-processing

RNG = np.random.default_rng(0)


def _w(name, shape, scale=0.3):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes, inits, out_shape, in_shape=(1, 8, 8, 8)):
    graph = helper.make_graph(nodes, "unit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _conv():
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["c"], ["y"])], [_w("w", (16, 8, 3, 3)), _w("b", (16,))], (1, 16, 8, 8))


def _depthwise():
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], group=8)],
                  [_w("w", (8, 1, 3, 3)), _w("b", (8,))], (1, 8, 8, 8))


def _gemm():
    return _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                  [_w("w", (10, 32)), _w("b", (10,))], (4, 10), in_shape=(4, 32))


def _add():
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("Add", ["c", "x"], ["y"])], [_w("w", (8, 8, 3, 3)), _w("b", (8,))], (1, 8, 8, 8))


def _pool(op):
    return lambda: _model([helper.make_node("Conv", ["x", "w", "b"], ["c"]),
                           helper.make_node(op, ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                          [_w("w", (8, 8, 1, 1)), _w("b", (8,))], (1, 8, 4, 4))


def _concat():
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"]),
                   helper.make_node("Concat", ["c", "x"], ["y"], axis=1)],
                  [_w("w", (8, 8, 1, 1)), _w("b", (8,))], (1, 16, 8, 8))


def _matmul_3d():
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_w("w", (32, 16))], (1, 8, 16), in_shape=(1, 8, 32))


def _global_avg_pool():
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
                   helper.make_node("GlobalAveragePool", ["r"], ["y"])],
                  [_w("w", (8, 8, 1, 1)), _w("b", (8,))], (1, 8, 1, 1))


def _batch_norm():
    # After a ReLU no convolution takes the batch norm: a per-channel affine unit of its own.
    stats = [numpy_helper.from_array(RNG.uniform(0.5, 1.5, 8).astype(np.float32), n) for n in ("g", "v")]
    stats += [numpy_helper.from_array((RNG.standard_normal(8) * 0.1).astype(np.float32), n) for n in ("be", "m")]
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
                   helper.make_node("BatchNormalization", ["r", "g", "be", "m", "v"], ["y"])],
                  [_w("w", (8, 8, 1, 1)), _w("b", (8,)), *stats], (1, 8, 8, 8))


def _mul_channels():
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Mul", ["c", "s"], ["y"])],
                  [_w("w", (8, 8, 1, 1)), _w("b", (8,)), _w("s", (1, 8, 1, 1), 1.0)], (1, 8, 8, 8))


def _channel_shuffle():
    shapes = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s1", [1, 2, 4, 8, 8]), ("s2", [1, 8, 8, 8]))]
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Reshape", ["c", "s1"], ["g"]),
                   helper.make_node("Transpose", ["g"], ["t"], perm=[0, 2, 1, 3, 4]),
                   helper.make_node("Reshape", ["t", "s2"], ["sh"]), helper.make_node("Conv", ["sh", "w2", "b2"], ["y"])],
                  [_w("w", (8, 8, 1, 1)), _w("b", (8,)), _w("w2", (8, 8, 1, 1)), _w("b2", (8,)), *shapes], (1, 8, 8, 8))


UNITS = {"conv2d": _conv, "depthwise": _depthwise, "gemm": _gemm, "add": _add, "max_pool2d": _pool("MaxPool"),
         "avg_pool2d": _pool("AveragePool"), "concat": _concat, "matmul_3d": _matmul_3d,
         "global_avg_pool": _global_avg_pool, "batch_norm": _batch_norm, "mul_channels": _mul_channels,
         "channel_shuffle": _channel_shuffle, "small_model": small_qdq_float_model}


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("unit", list(UNITS))
def test_unit_within_one_step_of_onnxruntime(unit, per_channel):
    model = qdq_model(UNITS[unit](), per_channel=per_channel)
    inputs = models.model_inputs(model)
    expected = models.onnxruntime_outputs(model, inputs)[0]
    art, got = models.build_and_run(model, inputs)
    step = quantization_step(model)
    assert step > 0
    assert np.abs(got - expected).max() <= step * 1.001
    notes = [n for n in art.build_report.backend_notes if n.startswith("QDQ units")]
    assert notes and "int8 in oneDNN 0 " not in notes[0], notes
    assert notes[0].endswith("fallback to TVM kernels 0"), notes  # every unit of these kinds in int8


def test_integer_concat_document_needs_a_scale_and_a_zero_point_per_input():
    doc = {"format": "tvm-hetero-dnnl/1", "regions": [
        {"name": "cat", "op": "concat", "num_inputs": 2, "inputs": [0, 1], "axis": 1,
         "quant": {"dst_type": "u8", "scales": [1.0, 0.5], "src_zero_points": [3]}}]}
    with pytest.raises(Exception, match="region 'cat'.*one scale and one source zero point per input"):
        tvm.get_global_func("tvm_hetero.dnnl.create_module")(json.dumps(doc))


# ---- the rest of the product on a QDQ model: two devices, automatic placement, a pipeline --------
TWO_CPUS = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]


@pytest.fixture(scope="module")
def small_qdq():
    """The small model with every unit kind, quantized per tensor; its inputs, onnxruntime's
    output and one output step."""
    model = qdq_model(small_qdq_float_model(), per_channel=False)
    inputs = models.model_inputs(model)
    return model, inputs, models.onnxruntime_outputs(model, inputs)[0], quantization_step(model)


def _steps_off(got, expected, step) -> float:
    return float(np.abs(np.asarray(got) - expected).max()) / step


def _devices_used(art) -> set[int]:
    devices = art.graph["attrs"]["device_index"][1]
    return {devices[i] for i, n in enumerate(art.graph["nodes"]) if n["op"] != "null"}


def test_qdq_model_split_over_two_devices_keeps_int8_on_both(small_qdq):
    # The first half of the ops on device 0, the rest on device 1: each side's units run as oneDNN
    # int8 regions on their own device, with copies of the values between them.
    model, inputs, expected, step = small_qdq
    mod = models.relax_module(model)
    cut = sum(len(block.bindings) for block in mod["main"].body.blocks) // 2
    art = tvm_hetero.build(mod, TWO_CPUS, placement=lambda info: int(info.index >= cut))
    assert _devices_used(art) == {0, 1}
    assert sorted({d for _b, d, _n, _ops in art.build_report.backend_regions}) == [0, 1]
    runtime = art.create()
    runtime.run(**inputs)
    assert _steps_off(runtime.get_output(0).numpy(), expected, step) <= 1.001
    note = next(n for n in art.build_report.backend_notes if n.startswith("QDQ units"))
    assert "int8 in oneDNN 0 " not in note


def test_qdq_model_with_automatic_placement_matches_onnxruntime(small_qdq):
    model, inputs, expected, step = small_qdq
    art = tvm_hetero.build(models.relax_module(model), TWO_CPUS, placement="auto", cost_cache=False)
    assert art.build_report.autoplace is not None
    runtime = art.create()
    runtime.run(**inputs)
    assert _steps_off(runtime.get_output(0).numpy(), expected, step) <= 1.001
    assert any(n.startswith("QDQ units") for n in art.build_report.backend_notes)


@pytest.mark.parametrize("backends", [(), ("dnnl",)], ids=["tvm_kernels", "dnnl"])
def test_qdq_model_as_a_two_stage_pipeline_matches_onnxruntime(small_qdq, backends):
    from tvm_hetero import pipeline

    model, inputs, expected, step = small_qdq
    art = pipeline.build(models.relax_module(model), ["cpu:0", "cpu:1"], [2], backends=list(backends))
    assert art.num_stages == 2
    batch = [inputs] * 3
    with art.create() as pipe:
        outputs = pipe.run_batch(batch)
    assert len(outputs) == 3
    for got in outputs:
        assert _steps_off(got[0], expected, step) <= 1.001
