"""A Qualcomm HTP through QNN (emulated by onnxruntime-qnn's x86 libQnnHtp.so): capability asked of
QNN, verified offload, QDQ units, concurrency, export/load, and the failures a user meets."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero.qnn import ep as qnn_ep

pytestmark = pytest.mark.skipif(not qnn_ep.available(),
                                reason="onnxruntime-qnn is not installed (pip install 'tvm-hetero[qnn]')")

CPU = (tvm.cpu(0), "llvm")


def _onnx_model(nodes, inputs, outputs, initializers=()):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _tensor(name, shape):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _conv_weight(name, cout, cin, seed):
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.2).astype("float32"), name)


def conv_unary_conv(unary: str):
    """conv -> relu -> UNARY -> conv: QNN may refuse the middle op, which then splits the HTP graphs."""
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node(unary, ["r1"], ["u"]),
             helper.make_node("Conv", ["u", "w2"], ["y"], pads=[1, 1, 1, 1])]
    return _onnx_model(nodes, [_tensor("x", [1, 4, 8, 8])], [_tensor("y", None)],
                       [_conv_weight("w1", 8, 4, 1), _conv_weight("w2", 4, 8, 2)])


def _relax(model):
    from tvm.relax.frontend.onnx import from_onnx

    return from_onnx(model, keep_params_in_input=False)


def _reference(model, inputs):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0]


def _run(art, inputs, **kw):
    rt = art.create(**kw)
    for name, value in inputs.items():
        rt.set_input(name, value)
    rt.run()
    out = rt.get_output(0).numpy()
    return rt, out


X = {"x": np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype("float32")}


def test_capability_is_asked_of_qnn_and_refused_ops_split_the_graphs() -> None:
    model = conv_unary_conv("Asin")
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])  # every accepted op on the HTP by default
    htp = art.build_report.offload
    refused = {r.op: r.reason for r in htp.refused}
    # QNN's own validation said no (the exporter has an ONNX Asin): the reason is QNN's.
    assert "relax.asin" in refused and "backendValidateOpConfig" in refused["relax.asin"], refused
    assert len(htp.regions) == 2 and htp.graph_executions == 2
    report = art.report()
    assert "relax.asin" in report and "QNN graphs" in report
    rt, y = _run(art, {"x": X["x"] * 0.3})
    assert rt.stats()["accelerator_graph_executions"] == 2
    ref = _reference(model, {"x": X["x"] * 0.3})
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()


def test_a_group_under_the_opt_in_flop_floor_stays_on_the_cpu() -> None:
    art = tvm_hetero.build(_relax(conv_unary_conv("Asin")), [CPU, "qnn-htp"], offload_min_group_flops=10e6)
    htp = art.build_report.offload
    assert htp.graph_executions == 1
    assert any(reason.startswith("gate:") for reason in htp.excluded.values())
    assert "not worth a QNN graph call" in art.report()


def test_whole_model_is_one_qnn_graph_within_fp16_error() -> None:
    model = conv_unary_conv("Relu")
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])
    assert art.build_report.offload.graph_executions == 1
    assert art.build_report.offload.verification.regions[0].ok
    _rt, y = _run(art, X)
    ref = _reference(model, X)
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()


def test_verification_moves_an_overflowing_region_back_to_the_cpu() -> None:
    """conv(x)**4 overflows fp16 (65504) on the HTP; the CPU computes it in fp32."""
    from onnx import helper, numpy_helper

    weight = _conv_weight("w1", 4, 4, 5)
    weight = numpy_helper.from_array(numpy_helper.to_array(weight) * 60, "w1")
    small = numpy_helper.from_array(np.array(1e-6, "float32"), "small")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "c1"], ["m1"]), helper.make_node("Mul", ["m1", "m1"], ["m2"]),
             helper.make_node("Mul", ["m2", "small"], ["y"])]
    model = _onnx_model(nodes, [_tensor("x", [1, 4, 8, 8])], [_tensor("y", None)], [weight, small])
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])
    htp = art.build_report.offload
    assert htp.excluded, "the bad region was not moved back"
    assert any("verification" in reason for reason in htp.excluded.values())
    assert "moved back" in art.report()
    _rt, y = _run(art, X)
    ref = _reference(model, X)
    assert np.isfinite(y).all() and np.abs(y - ref).max() <= 1e-3 * np.abs(ref).max()


def test_concurrent_execution_is_bit_identical_to_serial() -> None:
    """An HTP branch (convs) beside a host branch (an op QNN refuses), joined by an add."""
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a1"], ["a2"]),
             helper.make_node("Conv", ["a2", "w2"], ["a3"], pads=[1, 1, 1, 1]),
             helper.make_node("Sin", ["x"], ["b1"]), helper.make_node("Cos", ["b1"], ["b2"]),
             helper.make_node("Add", ["a3", "b2"], ["y"])]
    model = _onnx_model(nodes, [_tensor("x", [1, 4, 8, 8])], [_tensor("y", None)],
                        [_conv_weight("w1", 8, 4, 7), _conv_weight("w2", 4, 8, 8)])
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])
    _rt, serial = _run(art, X, execution="serial")
    rt, concurrent = _run(art, X, execution="concurrent")
    for _ in range(3):
        rt.run()
        assert np.array_equal(rt.get_output(0).numpy(), serial)
    assert np.array_equal(concurrent, serial)


def test_export_and_load_skip_graph_finalization(tmp_path) -> None:
    model = conv_unary_conv("Relu")
    start = time.perf_counter()
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])
    build_seconds = time.perf_counter() - start
    _rt, y = _run(art, X)
    art.export(tmp_path / "a")
    start = time.perf_counter()
    loaded = tvm_hetero.load(tmp_path / "a")
    _rt2, y2 = _run(loaded, X)
    load_seconds = time.perf_counter() - start
    assert np.array_equal(y, y2)
    assert loaded.build_report.offload.graph_executions == 1
    assert load_seconds < build_seconds


def test_an_htp_error_mid_run_names_the_region_and_device_and_the_runtime_recovers() -> None:
    from tvm_hetero.ep_offload import region_runner as qnn_runner

    model = conv_unary_conv("Sin")
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])
    rt, first = _run(art, X)
    region = art.build_report.offload.regions[0].name
    qnn_runner.FAIL_NEXT.add(region)
    with pytest.raises(Exception, match=r"qnn-htp:0.*" + region + "|" + region + r".*qnn-htp:0") as err:
        rt.run()
    assert "graph execution failed" in str(err.value)
    rt.run()  # usable again
    assert np.array_equal(rt.get_output(0).numpy(), first)


def test_missing_onnxruntime_qnn_is_one_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)
    with pytest.raises(qnn_ep.QnnUnavailable, match=r"pip install 'tvm-hetero\[qnn\]'"):
        tvm_hetero.build(_relax(conv_unary_conv("Relu")), [CPU, "qnn-htp"])


def _qdq_copy(model, shape):
    """``quantize_static`` in QDQ format (uint8 activations, int8 weights), four seeded batches."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(11)
            self.batches = iter([{"x": rng.standard_normal(shape).astype("float32")} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, src)
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        qdq = onnx.load(dst)
    qdq.ir_version = 9
    return qdq


def test_qdq_units_run_quantized_within_the_quantization_step() -> None:
    qdq = _qdq_copy(conv_unary_conv("Relu"), (1, 4, 8, 8))
    art = tvm_hetero.build(_relax(qdq), [CPU, "qnn-htp"])
    htp = art.build_report.offload
    ops = {r.op for r in htp.refused}
    assert "relax.nn.conv2d" not in ops and htp.graph_executions == 1
    # Both units whole on the HTP (weight dequantize, conv, quantize; the activation's dequantize):
    # QNN sees DQ -> conv -> Q and runs it quantized.
    assert sum(r.ops for r in htp.regions) >= 8
    _rt, y = _run(art, X)
    ref = _reference(qdq, X)
    step = np.abs(ref).max() / 127  # one output quantization step, at most
    assert np.abs(y - ref).max() <= 2 * step


def conv_bn_lrn_dropout():
    """What quantize_static leaves that QNN must still see whole: a batch norm it does not fold
    (a QuantizeLinear sits between it and the conv), an LRN (a decomposition of seven Relax ops
    inside one QDQ unit), and a Dropout, which leaves a DequantizeLinear -> QuantizeLinear pair."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(5)
    channel = lambda lo, hi: numpy_helper.from_array(rng.uniform(lo, hi, 8).astype("float32"))
    norm = [channel(0.5, 1.5), channel(-0.2, 0.2), channel(-0.1, 0.1), channel(0.5, 2.0)]
    for tensor, name in zip(norm, ("gamma", "beta", "mean", "var")):
        tensor.name = name
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["b1"]),
             helper.make_node("Relu", ["b1"], ["r1"]),
             helper.make_node("LRN", ["r1"], ["l1"], size=3, alpha=1e-4, beta=0.75, bias=1.0),
             helper.make_node("Dropout", ["l1"], ["d1"]),
             helper.make_node("Conv", ["d1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    return _onnx_model(nodes, [_tensor("x", [1, 4, 8, 8])], [_tensor("y", None)],
                       [_conv_weight("w1", 8, 4, 1), _conv_weight("w2", 4, 8, 2), *norm])


def test_a_qdq_model_with_batch_norm_lrn_and_dropout_is_one_qnn_graph() -> None:
    qdq = _qdq_copy(conv_bn_lrn_dropout(), (1, 4, 8, 8))
    art = tvm_hetero.build(_relax(qdq), [CPU, "qnn-htp"])
    htp = art.build_report.offload
    # Only the model's edges stay on the CPU: its input's quantize and its output's dequantize,
    # which QNN does not take alone (ONNX Runtime runs them on its CPU EP too).
    assert sorted(r.op for r in htp.refused if "folded" not in r.reason) == [
        "relax.dequantize", "relax.quantize"]
    assert htp.graph_executions == 1 and not htp.excluded
    assert "QDQ units quantized" in art.report()
    _rt, y = _run(art, X)
    ref = _reference(qdq, X)
    step = np.abs(ref).max() / 127
    assert np.abs(y - ref).max() <= 2 * step


def test_one_qnn_graph_takes_several_values_the_host_makes() -> None:
    """Two branches the host starts (Asin, which QNN refuses) joined on the HTP: one QNN graph that
    waits for both host values, not one graph per branch (each call costs ~0.16 ms on a phone)."""
    from onnx import helper

    nodes = [helper.make_node("Asin", ["x"], ["a"]),
             helper.make_node("Asin", ["z"], ["b"]),
             helper.make_node("Conv", ["a", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "w2"], ["d"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "d"], ["y"])]
    model = _onnx_model(nodes, [_tensor("x", [1, 4, 8, 8]), _tensor("z", [1, 4, 8, 8])], [_tensor("y", None)],
                        [_conv_weight("w1", 8, 4, 1), _conv_weight("w2", 8, 4, 2)])
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"], offload_min_group_flops=0)
    htp = art.build_report.offload
    assert [r.op for r in htp.refused if r.op == "relax.asin"] == ["relax.asin"] * 2
    assert htp.graph_executions == 1 and htp.regions[0].ops == 3
    inputs = {"x": X["x"] * 0.3, "z": X["x"][:, ::-1] * 0.2}
    rt, y = _run(art, inputs)
    assert rt.stats()["accelerator_graph_executions"] == 1
    ref = _reference(model, inputs)
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()


def _wide_conv_model():
    """Two 3x3 convolutions of 32 channels over 56x56 (0.23 GFLOP): worth an HTP call."""
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    return _onnx_model(nodes, [_tensor("x", [1, 32, 56, 56])], [_tensor("y", None)],
                       [_conv_weight("w1", 32, 32, 1), _conv_weight("w2", 32, 32, 2)])


def test_automatic_placement_weighs_each_htp_group_against_the_host(tmp_path, monkeypatch) -> None:
    from tvm_hetero.cli import main
    from tvm_hetero.placement_judgement import MEASURED, MEASURED_ON_A_DEVICE, MODELED
    from tvm_hetero.qnn import costs as htp_costs

    monkeypatch.setenv("TVM_HETERO_CACHE", str(tmp_path))  # an empty device cost table
    # Each group: modeled from QNN's cycles, measured on the host, the faster side chosen. (Which
    # side wins is the machine's: on a loaded host even a tiny group can take milliseconds.)
    tiny = tvm_hetero.build(_relax(conv_unary_conv("Relu")), [CPU, "qnn-htp"], placement="auto")
    (row,) = tiny.build_report.offload.auto
    device, host = row.verdict.candidate, row.verdict.baseline
    assert device.source == MODELED and device.seconds > 0.16e-3 and host.source == MEASURED and host.seconds > 0
    assert row.on_device == (device.seconds < host.seconds)
    assert tiny.build_report.offload.graph_executions == int(row.on_device)
    assert ("stays on the HTP" if row.on_device else "moved to the host") in tiny.report()
    model = _wide_conv_model()
    wide = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"], placement="auto")
    (row,) = wide.build_report.offload.auto
    device, host = row.verdict.candidate, row.verdict.baseline
    assert device.source == MODELED and row.on_device == (device.seconds < host.seconds)
    assert wide.build_report.offload.graph_executions == int(row.on_device)
    # Costs measured on a device override the model, both ways.
    costs = tmp_path / "costs.json"
    for seconds, on_htp in ((1e-6, True), (0.5, False)):
        costs.write_text(f'{{"{row.key}": {seconds}}}')
        assert main(["qnn-costs", str(costs)]) == 0
        assert htp_costs.device_table()[row.key]["seconds"] == seconds
        again = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"], placement="auto")
        (measured,) = again.build_report.offload.auto
        assert measured.key == row.key and measured.verdict.candidate.source == MEASURED_ON_A_DEVICE
        assert measured.on_device is on_htp and again.build_report.offload.graph_executions == int(on_htp)
    x = {"x": np.random.default_rng(1).standard_normal((1, 32, 56, 56)).astype("float32")}
    _rt, y = _run(again, x)
    ref = _reference(model, x)
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()


def test_bad_device_costs_are_clear_errors(tmp_path, monkeypatch) -> None:
    from tvm_hetero.qnn import costs as htp_costs

    monkeypatch.setenv("TVM_HETERO_CACHE", str(tmp_path))
    bad = tmp_path / "bad.json"
    bad.write_text('{"abc": 0.001}')
    with pytest.raises(ValueError, match="not a graph key"):
        htp_costs.import_costs(str(bad))
    bad.write_text('{"%s": -1}' % ("0" * 64))
    with pytest.raises(ValueError, match="not a positive number of seconds"):
        htp_costs.import_costs(str(bad))


def test_an_htp_in_a_separate_process_turns_a_vendor_crash_into_an_error() -> None:
    from tvm_hetero.ep_offload import vendor_process as htp_process

    model = conv_unary_conv("Relu")
    same = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])
    separate = tvm_hetero.build(_relax(model), [CPU, {"kind": "qnn-htp", "process": "separate"}])
    _rt, expected = _run(same, X)
    rt, y = _run(separate, X)
    np.testing.assert_array_equal(y, expected)  # the same QNN graph, run over there
    assert rt.stats()["accelerator_graph_executions"] == 1
    (region,) = [r.name for r in separate.build_report.offload.regions]
    htp_process.CRASH_NEXT.add(region)  # QNN dies with SIGSEGV in the HTP's process
    with pytest.raises(RuntimeError, match=rf"HTP region {region}: the device's process died \(signal 11, SIGSEGV\)"):
        rt.run()
    rt.run()  # the host lives on; the next call starts a new HTP process
    np.testing.assert_array_equal(rt.get_output(0).numpy(), expected)


def test_a_vendor_crash_while_building_for_a_separate_htp_keeps_the_region_on_the_cpu() -> None:
    """With ``process="separate"`` the build's own QNN calls run in the HTP's process too: QNN dying
    while it finalizes a graph leaves that graph's ops on the CPU with the reason, and the build
    (this process) goes on."""
    import os

    from tvm_hetero.ep_offload import vendor_process as htp_process

    model = conv_unary_conv("Relu")
    host = os.getpid()
    htp_process.CRASH_NEXT_CALL.add("finalize")
    art = tvm_hetero.build(_relax(model), [CPU, {"kind": "qnn-htp", "process": "separate"}])
    assert os.getpid() == host and "finalize" not in htp_process.CRASH_NEXT_CALL
    htp = art.build_report.offload
    reasons = set(htp.excluded.values())
    assert any("QNN crashed finalizing its graph in the HTP process (signal 11, SIGSEGV)" in r for r in reasons), reasons
    assert not htp.regions and "QNN crashed finalizing" in art.report()
    _rt, y = _run(art, X)
    ref = _reference(model, X)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()  # all on the CPU, in fp32


def test_a_separate_htp_works_from_a_script_without_a_main_guard(tmp_path) -> None:
    """The HTP's process is a fresh interpreter that never imports the user's script again (as
    multiprocessing's spawn does, which failed such a script with a bootstrapping error)."""
    import subprocess

    script = tmp_path / "user_script.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import test_qnn_htp as t, tvm_hetero\n"
        "art = tvm_hetero.build(t._relax(t.conv_unary_conv('Relu')), [t.CPU, {'kind': 'qnn-htp', 'process': 'separate'}])\n"
        "rt, y = t._run(art, t.X)\n"
        "print('graphs', art.build_report.offload.graph_executions, 'runs', rt.stats()['accelerator_graph_executions'])\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "graphs 1 runs 1" in done.stdout


def test_an_unknown_process_choice_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="process 'other': expected 'same' or 'separate'"):
        tvm_hetero.build(_relax(conv_unary_conv("Relu")), [CPU, {"kind": "qnn-htp", "process": "other"}])


def test_a_qnn_graph_never_waits_for_a_long_host_branch_beside_it() -> None:
    """An HTP tower and a host tower (Sin, which QNN has no builder for) joined by an add: the add
    does not join the tower's QNN graph, which would then wait for the whole host tower instead of
    running beside it."""
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1])]
    host = "x"
    for k in range(8):  # 8 x 100k elements of host work
        nodes.append(helper.make_node("Sin", [host], [f"s{k}"]))
        host = f"s{k}"
    nodes.append(helper.make_node("Add", ["c2", host], ["y"]))
    model = _onnx_model(nodes, [_tensor("x", [1, 32, 56, 56])], [_tensor("y", None)],
                        [_conv_weight("w1", 32, 32, 1), _conv_weight("w2", 32, 32, 2)])
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"], offload_min_group_flops=0)
    htp = art.build_report.offload
    tower = max(htp.regions, key=lambda r: r.ops)
    assert tower.ops == 3 and htp.graph_executions == 2  # the tower, and the add on its own
    x = {"x": np.random.default_rng(2).standard_normal((1, 32, 56, 56)).astype("float32")}
    _rt, y = _run(art, x)
    ref = _reference(model, x)
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()


def test_a_quantized_bert_takes_no_more_qnn_graphs_than_the_peer_and_all_its_flops() -> None:
    """The small BERT in QDQ: QNN refuses its LayerNorms and Erfs (ours and ONNX Runtime + QNN EP
    alike), which cut the graph. Its position ids and quantized scalars are constant chains (folded),
    its K Transpose is refused alone but taken before its MatMul (asked in context), each layer's
    attention reads the shared mask (copied per graph) and its LayerNorm output twice (one
    dequantize per unit). Before those, the same model took 10 QNN graphs against the peer's 7."""
    from tvm_hetero.qnn import peer
    from tvm_hetero.testing.export_models import sample_inputs, small_bert_onnx
    from tvm_hetero.testing.quantized import qdq_model

    qdq = qdq_model(small_bert_onnx(seed=0), per_channel=False)
    qdq.ir_version = 9
    inputs = sample_inputs(qdq, seed=1)
    art = tvm_hetero.build(_relax(qdq), [CPU, "qnn-htp"])
    htp = art.build_report.offload
    theirs = peer.run_peer(qdq, inputs, repeat=1, isolated=True)
    assert theirs.ran, theirs.error
    assert htp.graph_executions <= theirs.partitions, (htp.graph_executions, theirs.partitions)
    assert htp.flops_on_device >= 0.9 * htp.flops > 0
    # Only the default gate keeps anything off: the embedding lookup, a group with no conv/matmul work.
    assert all("no conv/matmul work" in reason for reason in htp.excluded.values()), htp.excluded
    assert htp.in_context > 0 and "asked in context" in art.report()
    rt, y = _run(art, inputs)
    assert rt.stats()["accelerator_graph_executions"] == htp.graph_executions
    ref = _reference(qdq, inputs)  # ONNX Runtime's CPU EP on the same QDQ model
    err = np.abs(y - ref).max() / np.abs(ref).max()
    peer_err = np.abs(theirs.outputs[0] - ref).max() / np.abs(ref).max()
    assert err <= max(2 * peer_err, 5e-2), (err, peer_err)


def test_inception_s_whole_map_average_pool_stays_in_the_graph_and_is_right() -> None:
    """Inception-v1's last AveragePool (7x7 over a 6x6 map, padded bottom-right, padding not counted)
    is computed wrongly by QNN as a pool (ONNX Runtime + QNN EP returns it ~50% off), so it used to
    go back to the host and cut the graph in two; as the mean it is, it stays in the one graph."""
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("AveragePool", ["r1"], ["p"], kernel_shape=[7, 7], pads=[0, 0, 1, 1],
                              count_include_pad=0),
             helper.make_node("Conv", ["p", "w2"], ["y"], pads=[1, 1, 1, 1])]
    model = _onnx_model(nodes, [_tensor("x", [1, 4, 6, 6])], [_tensor("y", None)],
                        [_conv_weight("w1", 64, 4, 1), _conv_weight("w2", 8, 64, 2)])
    x = {"x": np.random.default_rng(4).standard_normal((1, 4, 6, 6)).astype("float32")}
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])
    htp = art.build_report.offload
    assert htp.graph_executions == 1 and not htp.excluded, htp.excluded
    _rt, y = _run(art, x)
    ref = _reference(model, x)
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()


def _conv_asin_elementwise(channels: int, side: int):
    """conv -> Asin (QNN refuses it: the host) -> three element-wise ops: a second group with no
    conv/matmul work, of 3 x channels x side x side elements."""
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Asin", ["c1"], ["u"]),
             helper.make_node("Mul", ["u", "u"], ["m"]),
             helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Add", ["r", "u"], ["y"])]
    return _onnx_model(nodes, [_tensor("x", [1, 4, side, side])], [_tensor("y", None)],
                       [_conv_weight("w1", channels, 4, 1)])


@pytest.mark.parametrize(("side", "on_htp"), [(8, False), (64, True)])
def test_a_group_without_matmul_work_goes_to_the_htp_only_when_worth_a_call(side, on_htp) -> None:
    """By default a group with no conv/matmul work stays on the host unless its ops make at least a
    QNN call's worth of elements (8x8: 3 x 2k elements, host; 64x64: 3 x 131k, HTP)."""
    model = _conv_asin_elementwise(32, side)
    x = {"x": (np.random.default_rng(6).standard_normal((1, 4, side, side)) * 0.05).astype("float32")}
    art = tvm_hetero.build(_relax(model), [CPU, "qnn-htp"])
    htp = art.build_report.offload
    gated = [r for r in htp.excluded.values() if "no conv/matmul work" in r]
    assert htp.graph_executions == (2 if on_htp else 1) and bool(gated) != on_htp, htp.excluded
    _rt, y = _run(art, x)
    ref = _reference(model, x)
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()
