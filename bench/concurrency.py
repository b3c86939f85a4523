"""Concurrent execution of one inference across two CPU clusters: latency against serial execution,
the critical-path bound, one device with one and two threads, and onnxruntime with two threads.

    PYTHONPATH=python python bench/concurrency.py [--models two_tower,inception_v1,squeezenet,resnet50]
        [--backend dnnl] [--rounds 7]

Setup A: cpu:0 pinned to core 0 and cpu:1 pinned to core 1, one TVM (and oneDNN/OpenMP) thread
each. Setup B (``--setup B``): the host on core 0 and a local RPC server (a real second process)
pinned to core 1 as an "NPU" with a capability placement (conv2d, relu, pooling, add, concat on the
server): remote calls, round trips per inference, and latency against serial remote execution. Placement: the bench's own rule for putting parallel branches on different devices: it
estimates every Relax op's cost from its shapes (multiply-adds), and the placement solver
(``tvm_hetero.compiler.autoplace.solver``) splits the op DAG over two equal devices to minimise the
latency the schedule model predicts. (Measured automatic placement is a separate feature.)

Configurations, measured round-robin (``--rounds`` rounds, medians), outputs checked first:
- ``concurrent``: the split graph, ``execution="concurrent"``, each device on its own core;
- ``serial``: the same graph and kernels, ``execution="serial"``, on the calling thread pinned to
  core 0 with one thread (the runtime before concurrency);
- ``one device, 1 thread`` / ``2 threads``: everything on cpu:0;
- ``onnxruntime 2 threads``: ``intra_op_num_threads=2``;
- ``bound``: the critical-path lower bound of the split graph from its profiled per-step times
  (max of the longest dependency path and the busiest device), the best any schedule can do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

MODELS = ("two_tower", "inception_v1", "squeezenet", "resnet50")


TOWER_WIDTH = 512


def two_tower():
    """Two independent chains of equal cost (6 x matmul TOWER_WIDTH + relu each) joined by an add."""
    import numpy as np
    from tvm_hetero.testing import models

    mod, params = models.two_towers(batch=64, width=TOWER_WIDTH, depth=6, weight_scale=float(TOWER_WIDTH) ** 0.5)
    inputs = {"x": np.random.default_rng(0).standard_normal((64, TOWER_WIDTH)).astype("float32")}
    return mod, params, inputs, None


def light(name: str):
    from tvm_hetero.testing import models

    model = models.light_model(name)
    return models.relax_module(model), None, models.model_inputs(model), model


def op_cost(info) -> float:
    """Multiply-adds of a Relax op from its shapes (elementwise ops: one per output element)."""
    import numpy as np

    out = info.output_shape if isinstance(info.output_shape, tuple) and all(
        isinstance(d, int) for d in info.output_shape) else None
    out_elems = float(np.prod(out)) if out else 1.0
    shapes = [s for s in info.input_shapes if s]
    if "conv2d" in info.op and len(shapes) >= 2:
        weight = shapes[1]
        return out_elems * float(np.prod(weight[1:]))
    if "matmul" in info.op or "dense" in info.op:
        return out_elems * float(shapes[0][-1]) if shapes else out_elems
    return out_elems


def branch_placement(mod, params, backends):
    """Ops split over two devices by the placement solver on estimated costs (see the docstring)."""
    from tvm_hetero.compiler.autoplace.solver import solve
    from tvm_hetero.compiler.lower import lower_to_graph
    from tvm_hetero.compiler.schedule_model import CostModel

    # The ops are listed before any backend partitions them; the placement then answers by the op's
    # variable name, which the backends' first placement pass (before partitioning) also asks with.
    infos = []
    lower_to_graph(mod, lambda info: infos.append(info) or 0, 2, params, "main", ())
    index_of_var = {info.name: info.index for info in infos}
    func = mod["main"]
    value_of = {b.var.name: b.value for block in func.body.blocks for b in block.bindings}

    def producers(expr, seen) -> set[int]:
        from tvm import relax

        found: set[int] = set()
        stack = [expr]
        while stack:
            e = stack.pop()
            if isinstance(e, relax.Var):
                if e.name in seen:
                    continue
                seen.add(e.name)
                if e.name in index_of_var:
                    found.add(index_of_var[e.name])
                elif e.name in value_of:
                    stack.append(value_of[e.name])
            elif isinstance(e, relax.Tuple):
                stack.extend(e.fields)
            elif isinstance(e, relax.TupleGetItem):
                stack.append(e.tuple_value)
            elif isinstance(e, relax.Call):
                stack.extend(e.args)
        return found

    preds = [sorted(p for p in producers(info.call, set()) if p < info.index) for info in infos]
    cost = [op_cost(info) for info in infos]
    # A cross-device edge costs a wait (a hand-off between spinning executors, microseconds):
    # charged as a fixed "copy" of 0.1% of the model's work so that the split does not ping-pong.
    wait = 0.001 * sum(cost)
    model = CostModel(kernel_cost=[[c, c] for c in cost], preds=preds, out_bytes=[0] * len(infos),
                      copy_latency=[[0.0, wait], [wait, 0.0]], shares_memory=[[True, False], [False, True]])
    placement = solve(model, max_window=4, pair_limit=0).placement
    device_of = {info.name: placement[info.index] for info in infos}
    return lambda info: device_of.get(info.name, 0)


def pin(cores: list[int], threads: int) -> None:
    """The calling thread as a device executor sets itself up: cores, TVM pool and OpenMP team."""
    import tvm_ffi

    tvm_ffi.get_global_func("tvm_hetero.support.configure_current_thread")(cores, threads, False)


def in_thread(fn, cores: list[int], threads: int):
    """Run ``fn`` in a new thread pinned to ``cores`` with its own thread pool; returns its result."""
    result: dict = {}

    def body():
        try:
            pin(cores, threads)
            result["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - reported to the caller
            result["error"] = err

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def timed(run, iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    return (time.perf_counter() - start) / iterations


def critical_path_bound(rt, graph: dict) -> float:
    """Seconds: max(longest dependency path, busiest device) over profiled per-step times."""
    # Per step, the least of five single-run profiles: an outlier (the machine is shared) would
    # otherwise raise the bound above what a run achieves.
    time_of: dict[int, float] = {}
    for _ in range(5):
        for n in rt.profile(repeat=1)["nodes"]:
            time_of[n["node_id"]] = min(time_of.get(n["node_id"], float("inf")), n["time_us"] * 1e-6)
    finish: dict[int, float] = {}
    busy = [0.0, 0.0]
    for nid, node in enumerate(graph["nodes"]):
        ready = max((finish.get(src[0], 0.0) for src in node["inputs"]), default=0.0)
        finish[nid] = ready + time_of.get(nid, 0.0)
        if nid in time_of:
            busy[graph["attrs"]["device_index"][1][nid]] += time_of[nid]
    return max(max(finish.values()), max(busy))


def same_as_serial(name: str, concurrent, serial, inputs: dict) -> bool:
    """Set ``inputs`` on both runtimes and check the concurrent output bit for bit against serial."""
    import numpy as np

    for rt in (concurrent, serial):
        rt.set_input(**inputs)
    reference = in_thread(lambda: (serial.run(), serial.get_output(0).numpy())[1], [0], 1)
    concurrent.run()
    if np.array_equal(concurrent.get_output(0).numpy(), reference):
        return True
    print(f"{name}: concurrent output differs from serial", file=sys.stderr)
    return False


def other_load() -> float:
    return os.getloadavg()[0]


def bench_model(name: str, args: argparse.Namespace) -> bool:
    """Measure one model (a table row); False if its concurrent output differs from serial."""
    import tvm
    import tvm_hetero

    # "dnnl": the default build, oneDNN regions on every CPU, each on its anchor op's device.
    backends = () if args.backend == "none" else None
    two = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    one = [(tvm.cpu(0), "llvm")]
    clusters = [{"cores": [0], "num_threads": 1}, {"cores": [1], "num_threads": 1}]
    mod, params, inputs, onnx_model = two_tower() if name == "two_tower" else light(name)
    placement = branch_placement(mod, params, backends)
    split = tvm_hetero.build(mod, two, placement=placement, params=params, backends=backends)
    overlap = tvm_hetero.build(mod, two, placement=placement, params=params, backends=backends, reorder="overlap")
    single = tvm_hetero.build(mod, one, params=params, backends=backends)
    concurrent = split.create(execution="concurrent", device_options=clusters)
    overlapped = overlap.create(execution="concurrent", device_options=clusters)
    serial = split.create(execution="serial")
    single_rt = single.create()
    for rt in (overlapped, single_rt):
        rt.set_input(**inputs)
    if not same_as_serial(name, concurrent, serial, inputs):
        return False
    bound = in_thread(lambda: critical_path_bound(serial, split.graph), [0], 1)
    ort = None
    if onnx_model is not None:
        import onnxruntime as ort_lib

        options = ort_lib.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
        ort = ort_lib.InferenceSession(onnx_model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    one_iter = max(1, int(args.seconds / max(timed(concurrent.run, 2), 1e-6)))
    configs = {
        "concurrent": lambda: timed(concurrent.run, one_iter),
        "overlap order": lambda: timed(overlapped.run, one_iter),
        "serial": lambda: in_thread(lambda: timed(serial.run, one_iter), [0], 1),
        "1dev 1thr": lambda: in_thread(lambda: timed(single_rt.run, one_iter), [0], 1),
        "1dev 2thr": lambda: in_thread(lambda: timed(single_rt.run, one_iter), [0, 1], 2),
    }
    if ort is not None:
        configs["ort 2thr"] = lambda: timed(lambda: ort.run(None, inputs), one_iter)
    samples: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(args.rounds):
        for key, measure in configs.items():
            samples[key].append(measure())
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    ort_ms = med.get("ort 2thr", float("nan"))
    print(f"{name:<13} {med['concurrent']:9.2f}ms {med['serial']:7.2f}ms {bound * 1e3:7.2f}ms "
          f"{med['1dev 1thr']:8.2f}ms {med['1dev 2thr']:8.2f}ms {ort_ms:7.2f}ms | "
          f"{med['serial'] / med['concurrent']:10.2f}x {med['concurrent'] / (bound * 1e3):9.2f}x "
          f"{med['1dev 1thr'] / med['concurrent']:8.2f}x {ort_ms / med['concurrent']:7.2f}x")
    print(f"{'':13} overlap order (critical path first inside runs): {med['overlap order']:.2f}ms, "
          f"{med['concurrent'] / med['overlap order']:.2f}x the switch-minimal order")
    stats = concurrent.stats()
    print(f"{'':13} ops per device {split.build_report.ops_per_device}, groups {stats['num_groups']}, "
          f"cross-device waits {stats['cross_device_waits']}, read in place {stats['shared_edges']}, "
          f"bytes copied {stats['bytes_copied']}; load average {other_load():.2f}")
    return True


NPU_OPS = {"relax.nn.conv2d", "relax.nn.relu", "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.add",
           "relax.concat"}


def bench_remote(name: str, args: argparse.Namespace) -> bool:
    """Setup B: one model offloaded NPU-style to a pinned RPC server; a table row."""
    import tvm
    import tvm_hetero
    from tvm_hetero.rpc import start_local_server

    mod, params, inputs, _ = two_tower() if name == "two_tower" else light(name)
    caps = tvm_hetero.Capabilities({1: NPU_OPS, 0: lambda info: True})
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], placement=caps, params=params)
    with start_local_server(threads=1) as server:
        os.sched_setaffinity(server.process.pid, [1])  # the session's worker process inherits it
        session = server.connect()
        devices = [tvm.cpu(0), session.cpu(0)]
        concurrent = art.create(devices, device_options=[{"cores": [0], "num_threads": 1}, None])
        serial = art.create(devices, execution="serial")
        if not same_as_serial(name, concurrent, serial, inputs):
            return False
        iterations = max(1, int(args.seconds / max(timed(concurrent.run, 2), 1e-6)))
        samples: dict[str, list[float]] = {"concurrent": [], "serial": []}
        for _ in range(args.rounds):
            samples["concurrent"].append(timed(concurrent.run, iterations))
            samples["serial"].append(in_thread(lambda: timed(serial.run, iterations), [0], 1))
        conc, ser = (statistics.median(samples[k]) * 1e3 for k in ("concurrent", "serial"))
        stats = concurrent.stats()
        print(f"{name:<13} concurrent {conc:8.2f}ms  serial {ser:8.2f}ms  serial/concurrent {ser / conc:5.2f}x | "
              f"remote groups {stats['offload_segments']}, remote compute calls {stats['remote_compute_calls']}, "
              f"copy round trips {stats['remote_copies']}, round trips per inference "
              f"{stats['cross_process_calls']}; load average {other_load():.2f}")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backend", default="dnnl", choices=["none", "dnnl"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.4, help="time per configuration per round")
    parser.add_argument("--setup", default="A", choices=["A", "B"])
    parser.add_argument("--tower-width", type=int, default=TOWER_WIDTH,
                        help="two-tower matmul width (256 gives ~0.05 ms matmuls with oneDNN: hand-offs dominate)")
    args = parser.parse_args()
    globals()["TOWER_WIDTH"] = args.tower_width
    os.environ["OMP_NUM_THREADS"] = "1"
    if len(os.sched_getaffinity(0)) < 2:
        print("needs two CPU cores", file=sys.stderr)
        return 1
    if args.setup == "B":
        print(f"setup B: host on core 0, RPC server ('NPU': {', '.join(sorted(NPU_OPS))}) on core 1; "
              f"load average at start {other_load():.2f}")
        return 0 if all(bench_remote(name, args) for name in args.models.split(",")) else 1
    print(f"setup A: cpu:0 on core 0, cpu:1 on core 1, one thread each; backend {args.backend}; "
          f"load average at start {other_load():.2f}")
    print(f"{'model':<13} {'concurrent':>11} {'serial':>9} {'bound':>9} {'1dev 1thr':>10} {'1dev 2thr':>10} "
          f"{'ort 2thr':>9} | {'serial/conc':>11} {'conc/bound':>10} {'1thr/conc':>9} {'ort/conc':>8}")
    for name in args.models.split(","):
        if not bench_model(name, args):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
