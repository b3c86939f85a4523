"""Automatic placement by measured cost (devices and backends) against hand placements.

    PYTHONPATH=python python bench/autoplace.py [--setups A B] [--models squeezenet inception_v1 resnet50 ...]
                                                [--rounds 7] [--builds 3]

Setup A: cpu:0 pinned to core 0 and cpu:1 pinned to core 1, one TVM thread each (``device_options``),
``execution="concurrent"``, oneDNN on both (the default: every region a measured choice for auto,
each region where the placement puts its anchor for the hand placements).
Setup B: the host (cpu:0, core 0, one thread, oneDNN) and a remote "NPU": a CPU in a second
process behind ``tvm_hetero.rpc.start_local_server()`` (one thread), TVM kernels only, allowed
what an NPU runs (conv, matmul, pooling, elementwise: ``NPU_OPS``).

Per model (light ONNX models with seeded random weights, checked against onnxruntime; or
``torch:<name>``, a PyTorch model of tvm_hetero.testing.torch_models through torch.export, checked
against torch), every placement is built, its output checked, and timed round-robin (``--rounds`` rounds, medians, after a warm-up):

- ``auto``: ``placement="auto"`` with its own cost cache (cold the first time);
- A: ``all on cpu:0`` / ``all on cpu:1`` (the best of these is the "best one-thread single
  device"), ``alternate`` (Relax op i on device i % 2), ``halves`` (the first half of the ops on
  cpu:0), ``capability`` (bench/placement.py's table: conv2d, relu, add on cpu:1);
- B: ``all on host``, ``capable on NPU`` (every op the NPU runs there), ``halves`` (the capable
  ops of the second half on the NPU).

Printed per placement: measured latency, its ratio to auto, and the latency predicted for it as
built (its kernels and blocks, from the same measurements; predicted / measured is the model's
error). Build times: auto with a cold cache, then ``--builds`` warm auto builds interleaved with
as many hand-placed builds of two kinds, medians: all on the primary (default backends), and auto's
own choice given by hand (the same graph, plus the backends' prepare a hand build of the original
module runs; the difference is then all that the cache leaves to do).
The load (``os.getloadavg``) is printed before and after each model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

MODELS = ("squeezenet", "inception_v1", "resnet50")
#: Every model the bench knows: the six light ONNX models and two PyTorch models (torch.export).
ALL_MODELS = ("resnet50", "densenet121", "inception_v1", "squeezenet", "shufflenet", "vgg19",
              "torch:resnet18_like", "torch:transformer_encoder_layer")
CAPABLE = {"relax.nn.conv2d", "relax.nn.relu", "relax.add"}
NPU_OPS = {"conv2d", "matmul", "max_pool2d", "avg_pool2d", "add", "multiply", "subtract", "divide", "relu",
           "clip", "sigmoid", "tanh", "concat"}
CORE0 = {"cores": [0], "num_threads": 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setups", nargs="+", default=["A", "B"], choices=["A", "B"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"any of {', '.join(ALL_MODELS)}")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--builds", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="no device supports")  # the capability tables' fallbacks
    cache_dir = Path(tempfile.mkdtemp(prefix="autoplace-bench-"))
    status = 0
    for setup in args.setups:
        for name in args.models:
            status |= bench(setup, name, args.rounds, args.builds, cache_dir)
    return status


def bench(setup: str, name: str, rounds: int, builds: int, cache_dir: Path) -> int:
    import numpy as np
    import tvm
    import tvm_hetero
    from tvm_hetero.backends import default_backends
    from tvm_hetero.compiler.autoplace.backend_choice import prepare
    from tvm_hetero.compiler.autoplace.cost_cache import CostCache
    from tvm_hetero.compiler.autoplace.measured import choose_placement
    from tvm_hetero.compiler.build import lower_as_built, shares_memory_between
    from tvm_hetero.placement_measurer import RuntimeMeasurer
    from tvm_hetero.runtime.rpc import start_local_server
    from tvm_hetero.testing.models import light_model, model_inputs, onnxruntime_outputs, relax_module

    load_before = os.getloadavg()[0]
    if name.startswith("torch:"):  # torch.export of a PyTorch model; torch's output is the reference
        from tvm_hetero.testing.torch_models import imported

        mod, arrays, reference = imported(name.removeprefix("torch:"))
        inputs = {p.name: a for p, a in zip(mod["main"].params, arrays)}
    else:
        model = light_model(name)
        mod = relax_module(model)
        inputs = model_inputs(model)
        reference = onnxruntime_outputs(model, inputs)[0]
    server = None
    if setup == "A":
        devices = [tvm.cpu(0), tvm.cpu(1)]
        options = [CORE0, {"cores": [1], "num_threads": 1}]
        capabilities = None
    else:
        server = start_local_server(threads=1)
        devices = [tvm.cpu(0), server.connect().cpu(0)]
        options = [CORE0, None]
        capabilities = tvm_hetero.Capabilities({1: NPU_OPS})
    targets = [(d, "llvm") for d in devices]
    tvm_targets = [tvm.target.Target("llvm")] * 2
    cache_file = cache_dir / f"{setup}-{name}.sqlite"
    auto_args = {"placement": "auto", "device_options": options, "cost_cache": cache_file,
                 "capabilities": capabilities}

    t = time.perf_counter()
    auto_art = tvm_hetero.build(mod, targets, **auto_args)
    cold = time.perf_counter() - t
    # the same measurements (warm cache): the decision, and predictions of the hand placements
    cache = CostCache(cache_file)
    host = shares_memory_between(devices, tvm_targets)
    backends, _notes = default_backends([d for d in range(2) if host(d, d)])

    def lower(prepared, choose, chosen_backends):
        lowered, graph, _switches = lower_as_built(prepared, choose, devices, tvm_targets, None, "main",
                                                   chosen_backends)
        return lowered, graph

    auto = choose_placement(mod, devices, tvm_targets, host, RuntimeMeasurer(), cache, device_options=options,
                            capabilities=capabilities, backends=backends, lower=lower)
    warm, hand, same = [], [], []
    for _ in range(builds):  # interleaved, so that a passing load weighs on both
        t = time.perf_counter()
        tvm_hetero.build(mod, targets, **auto_args)
        warm.append(time.perf_counter() - t)
        t = time.perf_counter()
        tvm_hetero.build(mod, targets, placement=lambda info: 0)
        hand.append(time.perf_counter() - t)
        t = time.perf_counter()  # auto's own choice given by hand: the same graph, nothing to look up
        prepare(mod, backends, "main")  # what a hand build of the original module does first
        tvm_hetero.build(auto.module, targets, placement=auto.choose, backends=auto.backends)
        same.append(time.perf_counter() - t)
    num_ops = len(auto.ops)

    def npu(info) -> bool:
        return info.op.split(".")[-1] in NPU_OPS

    if setup == "A":
        placements = {
            "all on cpu:0": lambda info: 0,
            "all on cpu:1": lambda info: 1,
            "alternate": lambda info: info.index % 2,
            "halves": lambda info: 0 if info.index < num_ops // 2 else 1,
            "capability": lambda info: 1 if info.op in CAPABLE else 0,
        }
    else:
        placements = {
            "all on host": lambda info: 0,
            "capable on NPU": lambda info: int(npu(info)),
            "halves": lambda info: int(npu(info) and info.index >= num_ops // 2),
        }
    arts = {"auto": auto_art}
    predicted = {"auto": auto_art.build_report.autoplace.predicted_seconds}
    for label, placement in placements.items():
        arts[label] = tvm_hetero.build(mod, targets, placement=placement)
        # as built, with the default backends (each region where the placement puts its anchor)
        predicted[label] = auto.predict(placement, backends, mod).seconds
    cache.close()
    runtimes = {}
    for label, art in arts.items():
        rt = art.create(execution="concurrent", device_options=options)
        rt.set_input(**inputs)
        rt.run()
        out = rt.get_output(0).numpy()
        error = float(np.abs(out - reference).max() / max(np.abs(reference).max(), 1e-12))
        if error > 1e-4:
            print(f"{name} {label}: output differs from onnxruntime (relative error {error:.2e})")
            return 1
        runtimes[label] = rt
    times: dict[str, list[float]] = {label: [] for label in runtimes}
    for _ in range(rounds):
        for label, rt in runtimes.items():
            start = time.perf_counter()
            rt.run()
            times[label].append(time.perf_counter() - start)
    median = {label: statistics.median(ts) for label, ts in times.items()}
    for rt in runtimes.values():
        rt.close()
    if server is not None:
        server.stop()
    what = "core 0 | core 1, one thread each" if setup == "A" else "host core 0 | RPC 'NPU' (conv, matmul, pool, eltwise)"
    print(f"\n{name}: setup {setup} ({what}), concurrent, median of {rounds}; load {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    print(f"  {'placement':<16} {'measured ms':>12} {'x auto':>8} {'predicted ms':>13} {'pred/meas':>10}")
    for label in runtimes:
        pred = predicted[label]
        print(f"  {label:<16} {median[label] * 1e3:12.1f} {median[label] / median['auto']:8.2f} "
              f"{pred * 1e3:13.1f} {pred / median[label]:10.2f}")
    singles = [v for k, v in median.items() if k.startswith("all on")]
    best_baseline = min(v for k, v in median.items() if k != "auto")
    print(f"  auto vs best single device: {min(singles) / median['auto']:.2f}x faster; "
          f"auto / best baseline: {median['auto'] / best_baseline:.2f}")
    report = auto_art.build_report.autoplace
    warm_s, hand_s, same_s = (statistics.median(x) for x in (warm, hand, same))
    print(f"  build: auto cold cache {cold:.1f} s ({report.kernels_measured} kernel timings, "
          f"{report.as_built_measured} for judging as built), auto warm cache {warm_s:.2f} s; by hand: "
          f"all on the primary {hand_s:.2f} s (warm / hand {warm_s / hand_s:.2f}), auto's own placement "
          f"{same_s:.2f} s (warm / same by hand {warm_s / same_s:.2f}); medians of {builds}")
    print("\n".join("  " + line.strip() for line in auto_art.report().splitlines()
                    if "units (" in line or " on cpu:" in line and " vs " in line or "alternative" in line
                    or "latency predicted" in line or "measured against" in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
