"""tvm-hetero on cpu + an emulated Qualcomm HTP, side by side with ONNX Runtime + QNN EP.

    python bench/qnn.py --out qnn.json [--models squeezenet ...] [--variants fp16 qdq] [--concurrency]

Per model and variant (``fp16``: the float model in fp16 on the HTP; ``qdq``: a QDQ copy from
``quantize_static``, uint8 activations, int8 weights), both sides on the same emulator and options
(soc 60, HTP v73): Relax ops and conv/matmul FLOPs on the HTP, QNN graph executions per inference
(ours) against the peer's QNN partitions, the error against ONNX Runtime's CPU EP in fp32 (largest
``|x - reference|`` over largest ``|reference|``; for ``qdq`` also against the CPU EP running the same
QDQ model), wall time per inference on this machine (interleaved: ours, peer, ours, ...; the
emulator's time, hundreds of times a real HTP's, is context, never a cost), the build time and the
time from ``load()`` of the exported artifact to its first inference (no QNN finalization). The
peer runs in a child process, so a crash in the vendor library is recorded, not fatal.

``--concurrency``: a model with an HTP branch and an independent host branch, serial against
concurrent execution, the HTP executor on core 1 and the host's on core 0 (one thread each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import tvm
import tvm_hetero
from tvm_hetero.importers import from_onnx
from tvm_hetero.qnn import peer

sys.path.insert(0, os.path.dirname(__file__))
from qnn_peer import MODELS, load, qdq_copy

CPU = (tvm.cpu(0), "llvm")
#: Sin/Cos ops of the host tower (fused into one TVM kernel): about as long as the HTP tower here.
HOST_OPS = 600


def _relative(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype("float64") - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def _ours(model, inputs: dict, repeat: int) -> dict:
    start = time.perf_counter()
    art = tvm_hetero.build(from_onnx(model), [CPU, "qnn-htp"])
    build_s = time.perf_counter() - start
    htp = art.build_report.offload
    rt = art.create()
    for name, value in inputs.items():
        rt.set_input(name, value)
    rt.run()
    out = rt.get_output(0).numpy()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        rt.run()
        times.append(time.perf_counter() - t)
    stats = rt.stats()
    rt.close()
    with tempfile.TemporaryDirectory() as tmp:
        art.export(tmp)
        t = time.perf_counter()
        loaded = tvm_hetero.load(tmp).create()
        for name, value in inputs.items():
            loaded.set_input(name, value)
        loaded.run()
        load_s = time.perf_counter() - t
        same = bool(np.array_equal(loaded.get_output(0).numpy(), out))
        loaded.close()
    ops_htp = sum(r.ops for r in htp.regions)
    return {"out": out, "seconds": statistics.median(times), "build_seconds": build_s, "load_to_first_seconds": load_s,
            "load_output_identical": same, "graph_executions": stats["accelerator_graph_executions"],
            "ops_on_htp": ops_htp, "ops_asked": htp.asked, "flops_share": htp.flops_on_device / max(htp.flops, 1),
            "moved_back": len(htp.excluded),
            "verification": [(v.region, v.relative_error, v.ok)
                             for v in (htp.verification.regions if htp.verification else [])],
            "modeled_seconds": htp.modeled.seconds if htp.modeled else None}


def rejected_in_the_middle():
    """Two conv towers with an op QNN rejects (Asin) between them: both sides need two groups."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes, inits, a = [], [], "x"
    for i in range(6):
        inits.append(numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.05).astype("float32"), f"w{i}"))
        nodes.append(helper.make_node("Conv", [a, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        a = f"c{i}"
        if i == 2:
            nodes.append(helper.make_node("Tanh", [a], ["t"]))  # |x| < 1: Asin's domain
            nodes.append(helper.make_node("Asin", ["t"], ["s"]))
            a = "s"
    graph = helper.make_graph(nodes, "rejected_middle", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                        [1, 32, 56, 56])],
                              [helper.make_tensor_value_info(a, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    make = lambda seed: {"x": np.random.default_rng(seed).standard_normal((1, 32, 56, 56)).astype("float32")}
    return model, make(1), [make(10 + i) for i in range(4)]


def run_model(name: str, variant: str, repeat: int) -> dict:
    model, inputs, batches = rejected_in_the_middle() if name == "rejected_middle" else load(name)
    reference = peer.cpu_reference(model, inputs)[0]
    if variant == "qdq":
        model = qdq_copy(model, batches)
    same_model = peer.cpu_reference(model, inputs)[0]
    row: dict = {"model": name, "variant": variant}
    try:
        ours = _ours(model, inputs, repeat)
        row.update({k: v for k, v in ours.items() if k != "out"})
        row["error"] = _relative(ours["out"], reference)
        row["error_vs_same_model"] = _relative(ours["out"], same_model)
    except Exception as err:  # noqa: BLE001 (reported in the table)
        row["failure"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    result = peer.run_peer(model, inputs, repeat=repeat, isolated=True)
    row["peer"] = {"ran": result.ran, "partitions": result.partitions, "nodes_qnn": result.nodes_qnn,
                   "nodes_cpu": result.nodes_cpu, "seconds": result.seconds, "error": result.error,
                   "exit_signal": result.exit_signal}
    if result.ran and result.outputs:
        row["peer"]["relative_error"] = _relative(result.outputs[0], reference)
        row["peer"]["error_vs_same_model"] = _relative(result.outputs[0], same_model)
    return row


def concurrency(repeat: int) -> dict:
    """An HTP tower (convs) beside an independent host tower (ops QNN refuses), serial vs concurrent."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, a = [], [], "x"
    for i in range(4):
        w = numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.05).astype("float32"), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [a, f"w{i}"], [f"a{i}"], pads=[1, 1, 1, 1]))
        a = f"a{i}"
    b = "x"
    for i in range(HOST_OPS):  # Sin/Cos: QNN has no op builder for them here, so they run on the host
        nodes.append(helper.make_node("Sin" if i % 2 == 0 else "Cos", [b], [f"b{i}"]))
        b = f"b{i}"
    nodes.append(helper.make_node("Add", [a, b], ["y"]))
    graph = helper.make_graph(nodes, "towers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 56, 56])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    art = tvm_hetero.build(from_onnx(model), [CPU, "qnn-htp"], backends=())
    x = rng.standard_normal((1, 32, 56, 56)).astype("float32")
    options = [{"cores": [0], "num_threads": 1}, {"cores": [1], "num_threads": 1}]
    runtimes = {mode: art.create(execution=mode, device_options=options) for mode in ("serial", "concurrent")}
    outs, times = {}, {mode: [] for mode in runtimes}
    for rt in runtimes.values():
        rt.set_input("x", x)
        rt.run()
    for _ in range(repeat):  # interleaved
        for mode, rt in runtimes.items():
            t = time.perf_counter()
            rt.run()
            times[mode].append(time.perf_counter() - t)
            outs[mode] = rt.get_output(0).numpy()
    timeline = runtimes["concurrent"].timeline()
    for rt in runtimes.values():
        rt.close()
    serial, concurrent = statistics.median(times["serial"]), statistics.median(times["concurrent"])
    return {"serial_seconds": serial, "concurrent_seconds": concurrent, "speedup": serial / concurrent,
            "bit_identical": bool(np.array_equal(outs["serial"], outs["concurrent"])),
            "groups": art.build_report.offload.graph_executions, "timeline": timeline.get("devices") if isinstance(
                timeline, dict) else None, "load_average": os.getloadavg()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["rejected_middle", *MODELS])
    parser.add_argument("--variants", nargs="*", default=["fp16", "qdq"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    report: dict = {"load_average_start": os.getloadavg(), "rows": rows}
    if args.concurrency:
        report["concurrency"] = concurrency(max(args.repeat, 5))
        print(json.dumps(report["concurrency"], indent=1, default=str), flush=True)
    for name in args.models:
        for variant in args.variants:
            row = run_model(name, variant, args.repeat)
            rows.append(row)
            p = row["peer"]
            print(f"{name:13s} {variant:5s} ours: {row.get('graph_executions', '-')} graphs, "
                  f"{row.get('ops_on_htp', '-')}/{row.get('ops_asked', '-')} ops, flops {row.get('flops_share', 0):.1%}, "
                  f"err {row.get('error', float('nan')):.2e}, {row.get('seconds', float('nan')) * 1e3:.0f} ms "
                  f"{row.get('failure', '')}| peer: {p['partitions']} partitions, "
                  f"err {p.get('relative_error', float('nan')):.2e}, {p['seconds'] * 1e3:.0f} ms {p['error'] or ''}",
                  flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(report, f, indent=1, default=str)
    report["load_average_end"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
