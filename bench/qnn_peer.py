"""ONNX Runtime + QNN EP on the emulated HTP (the peer): placement, accuracy and time per model.

    PYTHONPATH=python python bench/qnn_peer.py --out qnn_peer.json [--models squeezenet ...] [--no-probes]

For each model, two variants run on the peer (``tvm_hetero.qnn.peer``), each in a
child process so that a crash in the vendor library is recorded, not fatal:

- ``fp16``: the float model with ``enable_htp_fp16_precision=1``;
- ``qdq``: a QDQ copy made with ONNX Runtime's ``quantize_static`` (uint8 activations, int8
  symmetric weights per tensor, min-max over 4 seeded calibration batches).

Recorded per variant: whether it ran (or the signal / error), QNN partitions, nodes of ORT's
optimized graph on QNN and on the CPU EP (ORT's layout Transposes included), the error against
ONNX Runtime's CPU EP in fp32 (largest ``|peer - reference|`` over largest ``|reference|``), for
``qdq`` also against the CPU EP running the same QDQ model (the peer's own error, without the
quantization's), and the median wall time per inference (the emulator's, hundreds of times a real
HTP's: it says what the peer costs on this machine, not on a phone). For ``fp16``, the largest
intermediate value on the CPU is recorded too: beyond 65504 fp16 overflows, and the fixtures'
random weights reach that in some light models.

The probes are small graphs of shapes that the whole-model runs pointed at (a QNN-refused op
between supported ones; the AveragePool with asymmetric padding that Inception-v1 ends with).

Models run lightest first; DenseNet-121 is last (about 8 s per inference on the emulator here).

What it showed with onnxruntime 1.31.1, onnxruntime-qnn 2.7.0 (QNN 2.40), soc 60 / v73, fp16:
Inception-v1 comes back wrong by about 1000x the largest logit, without a warning, and differently
from run to run. Its last AveragePool (7x7, stride 1, pads 0,0,1,1, count_include_pad=0, over a
6x6 map) is the cause: alone, that pool is wrong by about 50% at 32-128 channels and kills the
process (SIGSEGV in graph execution) at 256 channels and more; symmetric pads or
count_include_pad=1 are right. ResNet-50's error is ten times the others' (0.7%) because the
fixture's activations pass fp16's 65504 (88551): halving the input brings it back to 6e-4.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from tvm_hetero.qnn import peer as qnn
from tvm_hetero.testing import export_models
from tvm_hetero.testing.models import light_model, model_inputs

MODELS = ["squeezenet", "mobilenet_v2", "small_bert", "resnet50", "inception_v1", "densenet121"]
FP16_TOLERANCE = 1e-2  # fp16 through a whole network: a few 1e-4 is what good runs show
QDQ_TOLERANCE = 5e-2  # the peer against the CPU EP on the same QDQ model: a few quantization steps
FP16_MAX = 65504.0
CALIBRATION_BATCHES = 4


def load(name: str):
    """(model, inputs, calibration batches) for a bench model name."""
    if name == "mobilenet_v2":
        model = export_models.mobilenet_v2_onnx(seed=0)
        make = export_models.sample_inputs
    elif name == "small_bert":
        model = export_models.small_bert_onnx(seed=0)
        make = export_models.sample_inputs
    else:
        model = light_model(name, seed=0)
        make = model_inputs
    batches = [make(model, seed=10 + i) for i in range(CALIBRATION_BATCHES)]
    return model, make(model, seed=1), batches


def qdq_copy(model, batches: list[dict[str, np.ndarray]]):
    """``quantize_static`` in QDQ format: uint8 activations, int8 symmetric weights per tensor, min-max
    calibration on ``batches``; IR version kept at most 10 for ONNX Runtime."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = iter(batches)

        def get_next(self):
            return next(self._batches, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "qdq.onnx")
        onnx.save(model, src)
        quantize_static(src, dst, Batches(), quant_format=QuantFormat.QDQ, per_channel=False,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        quantized = onnx.load(dst)
    quantized.ir_version = min(quantized.ir_version, 10)
    return quantized


def largest_intermediate(model, inputs: dict[str, np.ndarray]) -> float:
    """The largest ``|value|`` of any float tensor the model computes, on ORT's CPU EP (no graph
    optimizations, so every ONNX node's output exists)."""
    import onnx
    import onnxruntime as ort

    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {v.name: v for v in inferred.graph.value_info}
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    graph_outputs = {o.name for o in model.graph.output}
    exposed.graph.output.extend(typed[o] for n in model.graph.node for o in n.output
                                if o in typed and o not in graph_outputs)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(exposed.SerializeToString(), options, providers=[qnn.CPU_EP])
    values = session.run(None, inputs)
    return max((float(np.max(np.abs(v))) for v in values if v.dtype == np.float32 and v.size), default=0.0)


def cpu_ms(model, inputs: dict[str, np.ndarray], runs: int = 5) -> float:
    """Median ms per inference on ORT's CPU EP (its default threads)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=[qnn.CPU_EP])
    session.run(None, inputs)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def peer_row(model_name: str, variant: str, result: qnn.PeerResult, error: float, own_error: float | None,
             tolerance: float, cpu: float) -> dict:
    """One table row (also the JSON record)."""
    row = {"model": model_name, "variant": variant, "ran": result.ran, "error": result.error,
           "exit_signal": result.exit_signal, "partitions": result.partitions, "nodes_qnn": result.nodes_qnn,
           "nodes_cpu": result.nodes_cpu, "cpu_ops": result.cpu_ops, "partition_sizes": result.partition_sizes,
           "refusals": result.refusals[:10], "rel_error_vs_fp32": error, "rel_error_vs_cpu_same_model": own_error,
           "peer_ms": result.seconds * 1e3, "peer_times_s": result.times, "session_s": result.session_seconds,
           "cpu_ms": cpu}
    judged = own_error if own_error is not None else error
    row["wrong"] = bool(result.ran and not judged <= tolerance)
    return row


def bench_model(name: str, repeat: int, timeout: float) -> list[dict]:
    model, inputs, batches = load(name)
    reference = qnn.cpu_reference(model, inputs)
    rows = []

    fp16 = qnn.run_peer(model, inputs, repeat=repeat, isolated=True, timeout=timeout)
    row = peer_row(name, "fp16", fp16, qnn.relative_error(fp16.outputs, reference), None, FP16_TOLERANCE,
                   cpu_ms(model, inputs))
    row["largest_intermediate"] = largest_intermediate(model, inputs)
    row["fp16_range_exceeded"] = row["largest_intermediate"] > FP16_MAX
    rows.append(row)
    print_row(row)

    quantized = qdq_copy(model, batches)
    cpu_quantized = qnn.cpu_reference(quantized, inputs)
    qdq = qnn.run_peer(quantized, inputs, repeat=repeat, isolated=True, timeout=timeout)
    row = peer_row(name, "qdq", qdq, qnn.relative_error(qdq.outputs, reference),
                   qnn.relative_error(qdq.outputs, cpu_quantized) if qdq.ran else None, QDQ_TOLERANCE,
                   cpu_ms(quantized, inputs))
    row["cpu_qdq_rel_error_vs_fp32"] = qnn.relative_error(cpu_quantized, reference)
    rows.append(row)
    print_row(row)
    return rows


# ---- probes: small graphs of the shapes that matter -------------------------------------------
def refused_between_convs(op_type: str, channels: int = 8):
    """conv3x3 -> ``op_type`` -> conv3x3 on float32[1, channels, 16, 16] (inputs kept in [-0.9, 0.9]
    after the first conv's scaling so Asin and friends stay defined)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) / (9 * channels)).astype(np.float32),
                                       f"w{i}") for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1])]
    if op_type == "Mod":
        weights.append(numpy_helper.from_array(np.array(0.25, dtype=np.float32), "divisor"))
        nodes.append(helper.make_node("Mod", ["a", "divisor"], ["b"], fmod=1))
    elif op_type == "Hardmax":
        nodes.append(helper.make_node("Hardmax", ["a"], ["b"], axis=1))
    else:
        nodes.append(helper.make_node(op_type, ["a"], ["b"]))
    nodes.append(helper.make_node("Conv", ["b", "w1"], ["y"], pads=[1, 1, 1, 1]))
    shape = [1, channels, 16, 16]
    return _model(nodes, shape, shape, weights, f"{op_type} between convs")


def asymmetric_average_pool(channels: int, size: int = 6, kernel: int = 7, count_include_pad: int = 0):
    """Inception-v1's last pool: AveragePool ``kernel`` x ``kernel``, stride 1, pads (0, 0, 1, 1), on
    float32[1, channels, size, size]."""
    from onnx import helper

    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[kernel, kernel], strides=[1, 1],
                            pads=[0, 0, 1, 1], count_include_pad=count_include_pad)
    out = size + 1 - kernel + 1
    return _model([node], [1, channels, size, size], [1, channels, out, out], [],
                  f"AveragePool {kernel}x{kernel} pads 0,0,1,1 count_include_pad={count_include_pad}, "
                  f"{channels}x{size}x{size}")


def _model(nodes, in_shape, out_shape, initializers, name: str):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def probes() -> list:
    cases = [refused_between_convs(op) for op in ("Erf", "Mod", "Hardmax", "Asin")]
    cases += [asymmetric_average_pool(c) for c in (32, 128, 256, 1024)]
    cases += [asymmetric_average_pool(256, count_include_pad=1), asymmetric_average_pool(32, kernel=3)]
    return cases


def bench_probe(model, timeout: float) -> dict:
    inputs = {"x": np.random.default_rng(1).uniform(-1, 1, [d.dim_value for d in
                                                           model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)}
    result = qnn.run_peer(model, inputs, repeat=1, warmup=0, isolated=True, timeout=timeout)
    row = peer_row(model.graph.name, "fp16", result, qnn.relative_error(result.outputs, qnn.cpu_reference(model, inputs)),
                   None, FP16_TOLERANCE, float("nan"))
    print_row(row)
    return row


# ---- output -----------------------------------------------------------------------------------
HEADER = (f"{'model':<58} {'var':<5} {'ran':<10} {'parts':>5} {'QNN':>5} {'CPU':>4} {'err/fp32':>9} "
          f"{'err/same':>9} {'peer ms':>9} {'cpu ms':>8}  note")


def print_row(row: dict) -> None:
    def number(value, fmt):
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)

    ran = "yes" if row["ran"] else ("SIG" + str(row["exit_signal"]) if row["exit_signal"] else "no")
    notes = []
    if row["wrong"]:
        notes.append("WRONG")
    if row.get("fp16_range_exceeded"):
        notes.append(f"max |intermediate| {row['largest_intermediate']:.0f} > fp16")
    if row["cpu_ops"]:
        notes.append("CPU: " + ",".join(f"{op}x{n}" for op, n in sorted(row["cpu_ops"].items())))
    if not row["ran"] and row["error"]:
        notes.append(row["error"][:70])
    print(f"{row['model'][:58]:<58} {row['variant']:<5} {ran:<10} {row['partitions']:>5} {row['nodes_qnn']:>5} "
          f"{row['nodes_cpu']:>4} {number(row['rel_error_vs_fp32'], '9.2e')} "
          f"{number(row['rel_error_vs_cpu_same_model'], '9.2e')} {number(row['peer_ms'], '9.1f')} "
          f"{number(row['cpu_ms'], '8.2f')}  {'; '.join(notes)}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODELS, help=f"any of {', '.join(MODELS)} or a light model")
    parser.add_argument("--repeat", type=int, default=3, help="timed inferences per variant (after one warm-up)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per peer run (child process)")
    parser.add_argument("--no-probes", action="store_true")
    parser.add_argument("--out", default=None, help="write the records as JSON here")
    args = parser.parse_args()
    if not qnn.available():
        print("onnxruntime-qnn is not installed: nothing to measure", file=sys.stderr)
        return 1

    print(HEADER)
    records = {"probes": [], "models": [], "settings": {"provider_options": qnn.DEFAULT_OPTIONS,
                                                         "repeat": args.repeat}}
    if not args.no_probes:
        records["probes"] = [bench_probe(model, args.timeout) for model in probes()]
    for name in args.models:
        records["models"] += bench_model(name, args.repeat, args.timeout)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
