"""Automatic placement by measured cost against hand placements, setup A: two CPU clusters.

    PYTHONPATH=python python bench/autoplace.py [--models squeezenet inception_v1] [--rounds 7]

Setup A: cpu:0 pinned to core 0 and cpu:1 pinned to core 1, one TVM thread each
(``device_options``), ``execution="concurrent"``. Per model (light ONNX models, seeded random
weights), every placement is built, its output checked against all-on-primary, and timed
round-robin (``--rounds`` rounds, medians, after a warm-up):

- ``auto``: ``placement="auto"`` (kernels timed on each pinned core, solver on the concurrent
  schedule model);
- ``all on cpu:0`` / ``all on cpu:1``: one device, one thread (the best of these is the "best
  one-thread single device");
- ``alternate``: Relax op i on device i % 2; ``halves``: the first half of the ops on cpu:0, the
  rest on cpu:1; ``capability``: bench/placement.py's table (conv2d, relu, add on cpu:1).

Printed per placement: measured latency, its ratio to auto, and the latency the schedule model
predicts for it from the same measurements (predicted / measured shows the model's error). Build
times: auto with a cold cache, auto again (warm cache), and the all-on-primary hand placement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

MODELS = ("squeezenet", "inception_v1")
CAPABLE = {"relax.nn.conv2d", "relax.nn.relu", "relax.add"}
ONE_THREAD_EACH = [{"cores": [0], "num_threads": 1}, {"cores": [1], "num_threads": 1}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="no device supports")  # the capability table's fallbacks

    import numpy as np
    import tvm
    import tvm_hetero
    from tvm_hetero.compiler.autoplace.cost_cache import CostCache
    from tvm_hetero.compiler.autoplace.measured import choose_placement
    from tvm_hetero.compiler.build import shares_memory_between
    from tvm_hetero.compiler.schedule_model import predicted_latency
    from tvm_hetero.models import light_model, model_inputs, relax_module
    from tvm_hetero.runtime.autoplace_measure import RuntimeMeasurer

    targets = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
    tvm_targets = [tvm.target.Target("llvm")] * 2
    devices = [tvm.cpu(0), tvm.cpu(1)]
    cache_dir = Path(tempfile.mkdtemp(prefix="autoplace-bench-"))
    for name in args.models:
        model = light_model(name)
        mod = relax_module(model)
        inputs = model_inputs(model)
        cache_file = cache_dir / f"{name}.sqlite"

        t = time.perf_counter()
        auto_art = tvm_hetero.build(mod, targets, placement="auto", device_options=ONE_THREAD_EACH,
                                    cost_cache=cache_file)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        tvm_hetero.build(mod, targets, placement="auto", device_options=ONE_THREAD_EACH, cost_cache=cache_file)
        warm = time.perf_counter() - t
        t = time.perf_counter()
        tvm_hetero.build(mod, targets, placement=None)
        hand = time.perf_counter() - t
        # the same measurements (warm cache) to predict the hand placements
        cache = CostCache(cache_file)
        auto = choose_placement(mod, devices, tvm_targets, shares_memory_between(devices, tvm_targets),
                                RuntimeMeasurer(), cache, device_options=ONE_THREAD_EACH)
        cache.close()
        num_ops = len(auto.ops)
        placements = {
            "all on cpu:0": lambda info: 0,
            "all on cpu:1": lambda info: 1,
            "alternate": lambda info: info.index % 2,
            "halves": lambda info, n=num_ops: 0 if info.index < n // 2 else 1,
            "capability": tvm_hetero.Capabilities({1: CAPABLE}),
        }
        arts = {"auto": auto_art}
        predicted = {"auto": auto_art.build_report.autoplace["predicted_seconds"]}
        for label, placement in placements.items():
            arts[label] = tvm_hetero.build(mod, targets, placement=placement)
            if callable(placement):
                predicted[label] = predicted_latency(auto.model, auto.kernel_assignment(placement))
        runtimes = {}
        reference = None
        for label, art in arts.items():
            rt = art.create(execution="concurrent", device_options=ONE_THREAD_EACH)
            rt.set_input(**inputs)
            rt.run()
            out = rt.get_output(0).numpy()
            if reference is None:
                reference = out
            error = float(np.abs(out - reference).max() / max(np.abs(reference).max(), 1e-12))
            if error > 1e-4:
                print(f"{name} {label}: output differs from auto (relative error {error:.2e})")
                return 1
            runtimes[label] = rt
        times: dict[str, list[float]] = {label: [] for label in runtimes}
        for _ in range(args.rounds):
            for label, rt in runtimes.items():
                start = time.perf_counter()
                rt.run()
                times[label].append(time.perf_counter() - start)
        median = {label: statistics.median(ts) for label, ts in times.items()}
        print(f"\n{name}: setup A (core 0 | core 1, one thread each), concurrent, median of {args.rounds}")
        print(f"  {'placement':<14} {'measured ms':>12} {'x auto':>8} {'predicted ms':>13} {'pred/meas':>10}")
        for label in runtimes:
            pred = predicted.get(label)
            pred_text = f"{pred * 1e3:13.1f} {pred / median[label]:10.2f}" if pred is not None else f"{'-':>13} {'-':>10}"
            print(f"  {label:<14} {median[label] * 1e3:12.1f} {median[label] / median['auto']:8.2f} {pred_text}")
        best_single = min(median["all on cpu:0"], median["all on cpu:1"])
        best_baseline = min(v for k, v in median.items() if k != "auto")
        print(f"  auto vs best one-thread single device: {best_single / median['auto']:.2f}x faster; "
              f"auto / best baseline: {median['auto'] / best_baseline:.2f}")
        print(f"  build: auto cold cache {cold:.1f} s ({auto_art.build_report.autoplace['kernels_measured']} kernel "
              f"timings), auto warm cache {warm:.1f} s, hand placement {hand:.1f} s (warm / hand {warm / hand:.2f})")
        print("\n".join("  " + line.strip() for line in auto_art.report().splitlines() if "decision" in line
                        or "kernel fused" in line or "alternative" in line or "latency predicted" in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
