"""What the HTP section of the build report says: QNN's acceptance apart from what the build placed
on the HTP (and why the rest moved back), fp16 underflow named with a hint as overflow is."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero.qnn import ep as qnn_ep
from tvm_hetero.testing import models

pytestmark = pytest.mark.skipif(not qnn_ep.available(),
                                reason="onnxruntime-qnn is not installed (pip install 'tvm-hetero[qnn]')")

CPU = (tvm.cpu(0), "llvm")


def _build(model, **kwargs):
    from tvm_hetero.importers import from_onnx

    return tvm_hetero.build(from_onnx(model), [CPU, "qnn-htp"], **kwargs)


@pytest.mark.slow
def test_ops_qnn_accepts_but_the_cost_choice_moves_back_are_reported_as_accepted(monkeypatch) -> None:
    from tvm_hetero.placement_judgement import MEASURED_ON_A_DEVICE, Cost
    from tvm_hetero.qnn import costs as htp_costs

    # A device cost table that makes every HTP graph call slower than the host.
    monkeypatch.setattr(htp_costs, "graph_seconds", lambda key, cycles, options: Cost(1.0, MEASURED_ON_A_DEVICE))
    art = _build(models.conv_relu_conv(), placement="auto")
    htp = art.build_report.offload
    assert htp.graph_executions == 0 and not htp.regions
    assert htp.accepted == htp.asked == 3, htp
    report = art.report()
    assert "3 of 3 Relax ops accepted by QNN, 0 placed on the HTP (3 moved back to the CPU, below)" in report, report
    assert "3 ops: auto: the HTP 1000.000 ms (measured on a device) against the host " in report, report
    assert "the HTP not faster: the host kept" in report and "refused by QNN" not in report


@pytest.mark.slow
def test_fp16_underflow_in_verification_is_named_with_a_hint() -> None:
    """Activations near 1e-25 (fine in fp32) are zeros in fp16: relative error 1, and the report says why."""
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32") * 1e-25
    art = _build(models.conv_relu_conv(), calibration=[{"x": x}])
    htp = art.build_report.offload
    reasons = set(htp.excluded.values())
    assert reasons and all("fp16 underflow" in r and "at most" in r and "scale the model's inputs" in r
                           for r in reasons), reasons
    assert htp.graph_executions == 0  # every step underflows: all of it moved back, each saying why
    assert "ops: verification: fp16 underflow: the CPU's values are at most" in art.report()


@pytest.mark.slow
def test_fp16_underflow_in_qnn_s_answer_is_named_with_a_hint(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TVM_HETERO_CACHE", str(tmp_path))  # QNN asked afresh
    art = _build(models.conv_relu_conv(scale=1e-9))
    refused = {r.op: r.reason for r in art.build_report.offload.refused}
    assert "relax.nn.conv2d" in refused and refused["relax.nn.conv2d"].startswith("fp16 underflow"), refused


def test_a_quantized_output_is_judged_in_quantization_steps_whatever_its_width() -> None:
    from tvm_hetero.ep_offload.capability_probe import judge

    small = np.array([0, 3, 20, 40], "uint8")  # 3 steps off where the largest value is 40: 7.5% of it
    assert judge(small, small + np.array([3, 0, 0, 0], "uint8")) == ""
    wide = np.array([0, 3000, 30000], "int16")  # 100 steps off, 0.3% of the largest value: still wrong
    reason = judge(wide, wide + np.array([0, 100, 0], "int16"), vendor="QNN")
    assert reason.startswith("QNN computes it wrongly: 100 quantization steps off the CPU (more than 4)"), reason


def test_a_float_output_below_fp16_s_range_is_an_underflow_not_a_wrong_op() -> None:
    from tvm_hetero.ep_offload.capability_probe import judge

    tiny = np.full(8, 3e-25, "float32")
    assert judge(tiny, np.zeros(8, "float32")).startswith("fp16 underflow: the CPU's values are at most 3.0e-25")
    assert judge(tiny, np.zeros(8, "float32"), precision="quantized", vendor="QNN").startswith("QNN computes it wrongly")
    assert judge(np.ones(4, "float32"), np.ones(4, "float32") * 1.02, vendor="QNN").startswith("QNN computes it wrongly: relative")


@pytest.mark.slow
def test_an_accepted_op_no_htp_pattern_takes_is_reported(monkeypatch) -> None:
    """A clip whose pattern had the wrong arity stayed on the CPU, accepted and unreported (MobileNetV3)."""
    from onnx import helper
    from tvm_hetero.ep_offload import backend as qnn

    model = models.conv_relu_conv()
    model.graph.node[1].CopyFrom(helper.make_node("HardSwish", ["c1"], ["r1"]))  # add, clip, divide, multiply
    monkeypatch.delitem(qnn._ARITY, "relax.clip")  # as it was: a pattern of one argument for clip's three
    art = _build(model)
    htp = art.build_report.offload
    assert [r.op for r in htp.unplaced] == ["relax.clip"], htp.unplaced
    assert "1 ops QNN accepts are in no HTP graph" in art.report() and "1 x relax.clip" in art.report()
