"""Offload to a processor of another instruction set: an x86 host driving an emulated aarch64 board.

The board (scripts/board.sh start) runs TVM's RPC server under QEMU user-mode emulation with the
board-side libtvm_hetero; its kernels are compiled for ``llvm -mtriple=aarch64-linux-gnu`` and linked
with aarch64-linux-gnu-g++. The placement is NPU-style: convolutions, pooling and elementwise ops on
the board, the rest on the host. Per model, in one run:

  per_op:   every board kernel is its own RPC call (TVM <= 0.19's behaviour)
  grouped:  one RPC call per board group (tvm-hetero's offload runner on the board)

Emulation makes the board's kernels slow, so read the calls, the round trips (compute calls plus
copies, each one request/response over the socket) and the latency ratio between the two modes on
the same board; not the absolute times.

    scripts/board.sh start && python bench/board.py [--models cnn squeezenet] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import tvm
import tvm_hetero
from timing import median_run_seconds
from tvm_hetero import graph_runtime
from tvm_hetero.testing import models
from tvm_hetero.testing.board import AARCH64_TARGET, connect_board

BOARD_OPS = {"conv2d", "max_pool2d", "avg_pool2d", "add", "multiply", "subtract", "divide", "relu", "clip",
             "sigmoid", "tanh", "sqrt", "rsqrt", "power"}


def npu_placement(info) -> int:
    return 1 if info.op.split(".")[-1] in BOARD_OPS else 0


def npu_concat_placement(info) -> int:
    """The same, for an NPU that also concatenates (SqueezeNet's fire modules then stay on the board)."""
    return 1 if info.op.split(".")[-1] in BOARD_OPS | {"concat"} else 0


def load_model(name: str):
    """``(IRModule, params, inputs)``."""
    if name == "cnn":
        mod, params = models.small_cnn()
        return mod, params, {"x": np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype("float32")}
    model = models.light_model(name)
    return models.relax_module(model), None, models.model_inputs(model)


def bench_model(name: str, repeat: int, with_concat: bool = False) -> dict:
    mod, params, inputs = load_model(name)
    host = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], params=params).create()
    host.set_input(**inputs)
    host_ms = median_run_seconds(host, repeat) * 1e3
    reference = host.get_output(0).numpy()
    placement = npu_concat_placement if with_concat else npu_placement
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), AARCH64_TARGET)], placement=placement,
                           params=params)
    result = {"model": name + ("+concat" if with_concat else ""), "host_only_ms": host_ms,
              "board_ops": art.build_report.ops_per_device[1], "host_ops": art.build_report.ops_per_device[0]}
    for mode in ("per_op", "group"):
        session = connect_board()  # the board's server serves one session at a time
        rt = graph_runtime.create(art.graph_json, art.lib, [tvm.cpu(0), session.cpu(0)], offload=mode,
                                  device_libs=art.device_libs)
        rt.load_params(tvm.runtime.save_param_dict(art.params))
        rt.set_input(**inputs)
        seconds = median_run_seconds(rt, repeat)
        out = rt.get_output(0).numpy()
        stats = rt.stats()
        result[mode] = {
            "ms": seconds * 1e3,
            "remote_compute_calls": stats["remote_compute_calls"],
            "remote_copies": stats["remote_copies"],
            "round_trips": stats["remote_compute_calls"] + stats["remote_copies"],
            "remote_groups": stats["group_devices"].count(1),
            "max_abs_error": float(np.abs(out - reference).max()),
            "max_rel_error": float(np.abs(out - reference).max() / np.abs(reference).max()),
        }
        del rt, session
    per_op, grouped = result["per_op"], result["group"]
    result["calls_per_op_vs_grouped"] = per_op["remote_compute_calls"] / grouped["remote_compute_calls"]
    result["round_trips_per_op_vs_grouped"] = per_op["round_trips"] / grouped["round_trips"]
    result["latency_per_op_vs_grouped"] = per_op["ms"] / grouped["ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["cnn", "squeezenet"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--with-concat", action="store_true", help="also place concat on the board")
    args = parser.parse_args()
    results = [bench_model(name, args.repeat, args.with_concat) for name in args.models]
    print(f"{'model':<18} {'mode':<7} {'remote calls':>12} {'copies':>7} {'round trips':>11} {'groups':>7} "
          f"{'ms':>9}  max rel.err")
    for r in results:
        for mode in ("per_op", "group"):
            v = r[mode]
            print(f"{r['model']:<18} {mode:<7} {v['remote_compute_calls']:>12} {v['remote_copies']:>7} "
                  f"{v['round_trips']:>11} {v['remote_groups']:>7} {v['ms']:>9.1f}  {v['max_rel_error']:.1e}")
        print(f"{'':<18} ops host/board {r['host_ops']}/{r['board_ops']}; host only {r['host_only_ms']:.1f} ms; "
              f"per-op/grouped: calls {r['calls_per_op_vs_grouped']:.1f}x, round trips "
              f"{r['round_trips_per_op_vs_grouped']:.1f}x, latency {r['latency_per_op_vs_grouped']:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
