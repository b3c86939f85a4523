"""The QDQ unit matcher (backends/qdq.py) on a small model quantized by ONNX Runtime's own tool.

The model has one of each unit kind the int8 path handles (conv with bias, max and average
pooling, a residual add, concat, a global mean, Gemm); each test names what the matcher promises
a partitioner: the kinds, the roles and constants of a unit, and that its bindings keep it whole.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm_hetero.backends.qdq import DEQUANTIZE, QUANTIZE, find_qdq_units, summarize
from tvm_hetero.testing.models import relax_module
from tvm_hetero.testing.quantized import qdq_model, small_qdq_float_model

KINDS = {"add": 1, "avg_pool2d": 1, "concat": 1, "conv2d": 2, "matmul": 1, "max_pool2d": 1, "mean": 1,
         "reshape": 1}


@pytest.fixture(scope="module", params=[False, True], ids=["per_tensor", "per_channel"])
def quantized(request):
    per_channel = request.param
    func = relax_module(qdq_model(small_qdq_float_model(), per_channel=per_channel))["main"]
    return func, per_channel, find_qdq_units(func)


def _values(func):
    return {b.var: b.value for block in func.body.blocks for b in block.bindings}


def test_every_unit_kind_is_found(quantized):
    _, _, units = quantized
    assert summarize(units) == KINDS


def test_conv_unit_roles(quantized):
    _, per_channel, units = quantized
    conv = next(u for u in units if u.kind == "conv2d")
    assert conv.anchor_call.op.name == "relax.nn.conv2d"
    (act,) = conv.activations
    assert act.dtype == "uint8" and not act.is_constant and act.scale.size == 1
    assert act.zero_point is not None and act.zero_point.dtype == np.uint8
    assert conv.weight.dtype == "int8" and conv.weight.is_constant
    assert conv.weight.per_channel == per_channel
    if per_channel:
        assert conv.weight.scale.shape == (8,) and conv.weight.axis == 0
    assert not np.any(conv.weight.zero_point)  # symmetric weights
    assert conv.bias.dtype == "int32"
    assert conv.quantize.dtype == "uint8" and conv.quantize.scale.size == 1
    assert conv.op_names == ("relax.nn.conv2d", "relax.reshape", "relax.add")


def test_gemm_is_a_matmul_with_transposed_weight(quantized):
    _, _, units = quantized
    (mm,) = [u for u in units if u.kind == "matmul"]
    assert mm.weight_transposed and mm.weight.dtype == "int8" and mm.bias.dtype == "int32"
    assert "relax.permute_dims" in mm.op_names


def test_bindings_keep_each_unit_whole(quantized):
    func, _, units = quantized
    values = _values(func)
    seen_ops = set()
    for unit in units:
        bindings = set(unit.bindings)
        assert unit.anchor in bindings and unit.output in bindings
        for op in unit.ops:
            assert op not in seen_ops, "a float op in two units"
            seen_ops.add(op)
            value = values[op]
            args = getattr(value, "args", [])
            for arg in args:
                for v in getattr(arg, "fields", [arg]):
                    if v in values and values[v].op.name == DEQUANTIZE:
                        assert v in bindings, f"{unit.kind}: a dequantize it reads is not in its bindings"
        if unit.quantize is not None:
            assert values[unit.quantize.var].op.name == QUANTIZE
            assert unit.quantize.source.same_as(unit.output)


def test_an_activation_read_by_several_units_is_shared(quantized):
    _, _, units = quantized
    add = next(u for u in units if u.kind == "add")
    pool_out = add.activations[1]  # the residual: the max pool's quantized output, read thrice
    assert pool_out.shared
    readers = [u for u in units if any(a.var.same_as(pool_out.var) for a in u.activations)]
    assert {u.kind for u in readers} == {"conv2d", "add", "concat"}


def test_a_float_model_has_no_units():
    func = relax_module(small_qdq_float_model())["main"]
    assert find_qdq_units(func) == []
