"""Offload over TVM RPC: cross-process calls and latency, per-op vs grouped, original order vs reordered.

Part of the graph (convolutions, matmuls and the elementwise ops around them: the "accelerator's"
ops) runs on a second process behind a local ``tvm.exec.rpc_server``; the rest stays on the host.
Three ways to run the same model, side by side in one run:

  (a) per-op:     every remote kernel is its own RPC call (TVM <= 0.19's behaviour)
  (b) grouped:    one RPC call per remote group, nodes in the original order
  (c) reordered:  one RPC call per remote group, after reordering for fewer device switches

    python bench/offload.py [--models squeezenet resnet50] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import tvm
import tvm_hetero
from timing import median_run_seconds
from tvm_hetero.runtime.rpc import start_local_server
from tvm_hetero.testing import models

# What the offload device supports, as a typical NPU does: convolutions, matmuls, pooling, and the
# elementwise ops around them (ONNX's residual Sum imports as sum(stack(broadcast_to(...)))).
ACCELERATOR_OPS = {"conv2d", "matmul", "dense", "add", "multiply", "subtract", "divide", "relu", "sqrt",
                   "rsqrt", "power", "clip", "sigmoid", "tanh", "batch_norm", "max_pool2d", "avg_pool2d",
                   "sum", "stack", "broadcast_to"}


def offload_placement(info) -> int:
    return 1 if info.op.split(".")[-1] in ACCELERATOR_OPS else 0


SMALL = 16  # matrix size of the small-op model


def two_branch_model(length: int = 100):
    """An overhead-dominated case: two independent chains of small matmuls (which never fuse with
    each other), written interleaved (a1, b1, a2, b2, ...); chain a is the accelerator's."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((SMALL, SMALL), "float32"))
    w = relax.const(np.eye(SMALL, dtype="float32") * 0.5 + 0.5 / SMALL)
    with bb.function("main", [x]):
        with bb.dataflow():
            a, b = x, x
            for _ in range(length):
                a = bb.emit(relax.op.matmul(a, w))
                b = bb.emit(relax.op.matmul(b, w))
            out = bb.emit_output(relax.op.subtract(a, b))
        bb.emit_func_output(out)
    return bb.get()


def branch_placement(info) -> int:
    return 1 if info.index % 2 == 0 else 0  # chain a: the even op positions


def bench_small_ops(session, repeat: int) -> dict:
    mod = two_branch_model()
    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    devices = [tvm.cpu(0), session.cpu(0)]
    x = np.linspace(-1, 1, SMALL * SMALL, dtype="float32").reshape(SMALL, SMALL)
    local = tvm_hetero.build(mod, targets[:1]).create()
    local.run(x=x)
    reference = local.get_output(0).numpy()
    result = {"model": "2x100 matmul16"}
    for label, reorder, mode in (("per_op", False, "per_op"), ("grouped", False, "group"),
                                 ("reordered", True, "group")):
        art = tvm_hetero.build(mod, targets, placement=branch_placement, reorder=reorder)
        rt = tvm_hetero.graph_runtime.create(art.graph_json, art.lib, devices, offload=mode)
        rt.load_params(tvm.runtime.save_param_dict(art.params))
        rt.set_input(x=x)
        seconds = median_run_seconds(rt, repeat * 10)
        stats = rt.stats()
        error = float(np.abs(rt.get_output(0).numpy() - reference).max() / max(np.abs(reference).max(), 1e-6))
        result[label] = {"ms": seconds * 1e3, "remote_compute_calls": stats["remote_compute_calls"],
                         "remote_copies": stats["remote_copies"], "groups": stats["num_groups"],
                         "remote_groups": stats["group_devices"].count(1), "rel_error": error}
    return _ratios(result)


def _ratios(result: dict) -> dict:
    per_op, grouped, reordered = result["per_op"], result["grouped"], result["reordered"]
    result["calls_per_op_vs_reordered"] = per_op["remote_compute_calls"] / max(reordered["remote_compute_calls"], 1)
    result["latency_per_op_vs_reordered"] = per_op["ms"] / reordered["ms"]
    result["latency_grouped_vs_reordered"] = grouped["ms"] / reordered["ms"]
    return result


def bench_model(name: str, session, repeat: int) -> dict:
    model = models.light_model(name)
    inputs = models.model_inputs(model)
    mod = models.relax_module(model)
    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    devices = [tvm.cpu(0), session.cpu(0)]
    variants = {
        "per_op": (tvm_hetero.build(mod, targets, placement=offload_placement, reorder=False), "per_op"),
        "grouped": (tvm_hetero.build(mod, targets, placement=offload_placement, reorder=False), "group"),
        "reordered": (tvm_hetero.build(mod, targets, placement=offload_placement, reorder=True), "group"),
    }
    reference = models.onnxruntime_outputs(model, inputs)[0]
    runtimes = {}
    for label, (art, mode) in variants.items():
        rt = tvm_hetero.graph_runtime.create(art.graph_json, art.lib, devices, offload=mode)
        rt.load_params(tvm.runtime.save_param_dict(art.params))
        rt.set_input(**inputs)
        rt.run()  # warm-up
        runtimes[label] = rt
    # Interleaved: one timed run of each variant per round, so machine load hits all of them alike.
    samples: dict[str, list[float]] = {label: [] for label in runtimes}
    for _ in range(repeat):
        for label, rt in runtimes.items():
            start = time.perf_counter()
            rt.run()
            samples[label].append(time.perf_counter() - start)
    result = {"model": name}
    for label, rt in runtimes.items():
        out = rt.get_output(0).numpy()
        error = float(np.abs(out - reference).max() / np.abs(reference).max())
        stats = rt.stats()
        result[label] = {"ms": statistics.median(samples[label]) * 1e3,
                         "remote_compute_calls": stats["remote_compute_calls"],
                         "remote_copies": stats["remote_copies"], "groups": stats["num_groups"],
                         "remote_groups": stats["group_devices"].count(1), "rel_error": error}
    return _ratios(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["squeezenet", "resnet50"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with start_local_server() as server:
        session = server.connect()
        results = [bench_small_ops(session, args.repeat)]
        results += [bench_model(name, session, args.repeat) for name in args.models]
    print(f"{'model':<16} {'variant':<10} {'remote calls':>12} {'copies':>7} {'groups':>7} {'ms':>9}  rel.err")
    for r in results:
        for label in ("per_op", "grouped", "reordered"):
            v = r[label]
            print(f"{r['model']:<16} {label:<10} {v['remote_compute_calls']:>12} {v['remote_copies']:>7} "
                  f"{v['groups']:>7} {v['ms']:>9.1f}  {v['rel_error']:.1e}")
        print(f"{'':<16} calls per-op/reordered {r['calls_per_op_vs_reordered']:.1f}x, latency per-op/reordered "
              f"{r['latency_per_op_vs_reordered']:.2f}x, grouped/reordered {r['latency_grouped_vs_reordered']:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
