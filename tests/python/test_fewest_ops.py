"""Verification moves back the fewest ops (ep_offload/fewest_ops.py): the rules on hand-made step
errors, and on the emulated HTP a conv net where one op loses fp16 accuracy: only that op moves back,
the rest stays on the HTP, and every graph of the result is verified."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero.ep_offload.fewest_ops import StepError, choose
from tvm_hetero.ep_offload.offload_report import OffloadReport
from tvm_hetero.qnn import ep as qnn_ep

CPU = (tvm.cpu(0), "llvm")
TOL = 1e-2


def _errors(*rows) -> list[StepError]:
    """Steps 0.. from (ops, own, inherited[, finite])."""
    return [StepError(i, list(row[0]), row[1], row[2], *(row[3:] or (True,))) for i, row in enumerate(rows)]


# ---- the rules, on hand-made errors (no device) -------------------------------------------------
def test_every_step_that_fails_alone_moves_back_and_nothing_else() -> None:
    errors = _errors((["Conv"], 5e-4, 5e-4), (["Softmax"], 3e-2, 3e-2), (["Conv"], 6e-4, 4e-2),
                     (["ReduceSum"], 0.0, 0.5, False), (["Sigmoid"], 8e-3, 5e-1))
    chosen = choose(errors, TOL, attempt=1, movable={0, 1, 2, 3, 4})
    assert chosen.rule == "culprits" and chosen.steps == [1, 3]
    assert "3.00e-02" in chosen.reasons[1] and "non-finite" in chosen.reasons[3]


def test_build_up_moves_the_worst_step_without_flops_before_the_error_passes_the_tolerance() -> None:
    # No step fails alone; the chain passes the tolerance at step 3. Steps after it are not candidates,
    # the convs are kept for their FLOPs.
    errors = _errors((["Conv"], 9e-3, 9e-3), (["Sigmoid", "Mul"], 2e-3, 8e-3), (["Add"], 4e-3, 9e-3),
                     (["Conv"], 1e-3, 1.2e-2), (["Relu"], 9e-3, 1.3e-2))
    chosen = choose(errors, TOL, attempt=1, movable={0, 1, 2, 3, 4})
    assert chosen.rule == "build-up" and chosen.steps == [2]
    assert "step 3 inherits 1.20e-02" in chosen.reasons[2]


def test_build_up_doubles_the_steps_it_moves_each_attempt_so_a_long_chain_is_cut_in_few_rounds() -> None:
    errors = _errors(*[(["Mul"], 1e-3 * (i + 1), 2e-3 * (i + 1)) for i in range(10)])
    assert len(choose(errors, TOL, attempt=1, movable=set(range(10))).steps) == 1
    # The chain passes the tolerance at step 5 (1.2e-2): the third attempt takes the 4 worst of steps 0-5.
    assert choose(errors, TOL, attempt=3, movable=set(range(10))).steps == [5, 4, 3, 2]


def test_a_graph_of_convs_only_still_moves_one_step_back() -> None:
    errors = _errors((["Conv"], 2e-3, 2e-3), (["Conv"], 3e-3, 6e-3), (["Conv"], 1e-3, 1.1e-2))
    assert choose(errors, TOL, attempt=1, movable={0, 1, 2}).steps == [1]


def test_when_no_value_passes_the_tolerance_with_every_value_an_output_any_step_is_a_candidate() -> None:
    # The graph failed, yet run with every value as an output (less fused) no step's value is off.
    errors = _errors((["Conv"], 1e-3, 1e-3), (["Mul"], 2e-3, 2e-3), (["Conv"], 1e-3, 3e-3), (["Add"], 3e-3, 4e-3))
    chosen = choose(errors, TOL, attempt=1, movable={0, 1, 2, 3})
    assert chosen.steps == [3] and "no step's value passes" in chosen.reasons[3]


def test_steps_already_off_the_device_are_never_chosen_and_nothing_movable_names_nothing() -> None:
    errors = _errors((["Softmax"], 5e-2, 5e-2), (["Add"], 1e-3, 2e-2))
    assert choose(errors, TOL, attempt=1, movable={1}).steps == [1]
    assert choose(errors, TOL, attempt=1, movable=set()).steps == []


# ---- on the emulated HTP --------------------------------------------------------------------------
needs_qnn = pytest.mark.skipif(not qnn_ep.available(),
                               reason="onnxruntime-qnn is not installed (pip install 'tvm-hetero[qnn]')")


def _conv_net(middle: list, out: str, extra_inits=(), channels: int = 8):
    """x -> conv -> relu -> conv -> relu -> conv -> MIDDLE nodes -> ``out`` (8 channels, 16x16)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)

    def weight(name, cout, cin):
        return numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.2).astype("float32"), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1]), *middle]
    inits = [weight("w1", channels, 4), weight("w2", channels, channels), weight("w3", channels, channels), *extra_inits]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _build(model, **kw):
    from tvm.relax.frontend.onnx import from_onnx

    return tvm_hetero.build(from_onnx(model, keep_params_in_input=False), [CPU, "qnn-htp"], **kw)


def _moved_ops(art) -> list[str]:
    return [op for row in art.build_report.offload.move_back.steps for op in row.ops]


def _assert_verified(htp: dict) -> None:
    checks = htp.verification.regions
    assert checks and all(c.ok and c.relative_error <= htp.verification.tolerance for c in checks)
    assert {c.region for c in checks} == {r.name for r in htp.regions}


@needs_qnn
def test_a_sum_past_fp16s_range_is_the_only_op_moved_back() -> None:
    """conv x3 then a spatial sum of values near 400 (about 1e5, past fp16's 65504): only the sum goes back."""
    from onnx import helper, numpy_helper

    model = _conv_net([helper.make_node("Mul", ["c3", "big"], ["m"]), helper.make_node("ReduceSum", ["m", "axes"], ["y"])],
                      "y", [numpy_helper.from_array(np.array(400.0, "float32"), "big"),
                            numpy_helper.from_array(np.array([2, 3], "int64"), "axes")])
    art = _build(model)
    htp = art.build_report.offload
    assert _moved_ops(art) == ["ReduceSum"]
    assert len(htp.excluded) == 1 and "own error" in next(iter(htp.excluded.values()))
    assert htp.flops_on_device == htp.flops > 0 and len(htp.regions) == 1
    _assert_verified(htp)
    report = art.report()
    assert "step" in report and "(ReduceSum)" in report and "per verification round" in report
    assert OffloadReport.from_dict(json.loads(json.dumps(htp.to_dict()))) == htp  # the artifact manifest's form


@needs_qnn
def test_a_softmax_over_large_logits_in_the_middle_moves_back_alone_and_the_convs_stay() -> None:
    """conv -> x60 -> softmax over channels -> conv: fp16 softmax over logits of a few hundred is
    off by a few percent; the convs on both sides stay on the HTP, in two graphs."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(2)
    w4 = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype("float32"), "w4")
    model = _conv_net([helper.make_node("Mul", ["c3", "scale"], ["m"]), helper.make_node("Softmax", ["m"], ["s"], axis=1),
                       helper.make_node("Conv", ["s", "w4"], ["y"], pads=[1, 1, 1, 1])],
                      "y", [numpy_helper.from_array(np.array(60.0, "float32"), "scale"), w4])
    art = _build(model)
    htp = art.build_report.offload
    assert _moved_ops(art) == ["Softmax"], htp.move_back.steps
    assert htp.flops_on_device == htp.flops > 0 and len(htp.regions) == 2
    _assert_verified(htp)
    rounds = htp.move_back.rounds
    assert rounds[0].bad_graphs == 1 and rounds[-1].bad_graphs == 0


@needs_qnn
def test_the_earlier_first_bad_step_rule_is_still_there_and_a_bad_rule_is_a_clear_error() -> None:
    from onnx import helper, numpy_helper

    model = _conv_net([helper.make_node("Mul", ["c3", "big"], ["m"]), helper.make_node("ReduceSum", ["m", "axes"], ["y"])],
                      "y", [numpy_helper.from_array(np.array(400.0, "float32"), "big"),
                            numpy_helper.from_array(np.array([2, 3], "int64"), "axes")])
    art = _build(model, offload_move_back="first_bad_step")
    htp = art.build_report.offload
    assert htp.move_back.rule == "first_bad_step" and htp.excluded
    _assert_verified(htp)
    with pytest.raises(ValueError, match="offload_move_back='fewest_op'.*first_bad_step"):
        _build(model, offload_move_back="fewest_op")


@needs_qnn
def test_error_building_up_along_a_silu_chain_moves_activations_back_and_keeps_every_conv() -> None:
    """Six conv + SiLU layers at a tolerance of 1e-3: no op fails alone, fp16 rounding builds up.
    The fewest-ops rule cuts the chain at activations, so every conv stays on the HTP; the first-bad-step
    rule moves back whatever step the error first shows in, convs included."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes, inits, previous = [], [], "x"
    for i in range(6):
        nodes += [helper.make_node("Conv", [previous, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Sigmoid", [f"c{i}"], [f"s{i}"]), helper.make_node("Mul", [f"c{i}", f"s{i}"], [f"y{i}"])]
        inits.append(numpy_helper.from_array((rng.standard_normal((8, 8 if i else 4, 3, 3)) * 0.35).astype("float32"),
                                             f"w{i}"))
        previous = f"y{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    fewest = _build(model, offload_tolerance=1e-3).build_report.offload
    first = _build(model, offload_tolerance=1e-3, offload_move_back="first_bad_step").build_report.offload
    _assert_verified(fewest)
    _assert_verified(first)
    assert fewest.flops_on_device == fewest.flops > first.flops_on_device
    assert all("Conv" not in row.ops for row in fewest.move_back.steps)
    assert all(row.rule == "build-up" for row in fewest.move_back.steps)
