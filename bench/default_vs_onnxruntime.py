"""The DEFAULT build (``tvm_hetero.build`` without ``backends=``) against onnxruntime, side by side.

    PYTHONPATH=python python bench/default_vs_onnxruntime.py --threads 1 [--models resnet50 ...]

One thread count per process: TVM's pool (TVM_NUM_THREADS) and oneDNN's OpenMP (OMP_NUM_THREADS)
read theirs once, so they are set before anything loads; onnxruntime gets
``intra_op_num_threads`` (and one inter-op thread). Every output is checked against onnxruntime
before timing. Timing is interleaved: each round times ``--runs`` calls of onnxruntime, then the
same of the default build, and keeps the median of each; the ratio reported is the median over
rounds of the per-round ratio, so that load from other processes on a shared machine hits both
sides alike. The geometric mean is over the models given. ``--unmerged`` also times, in the same
rounds, the default build with oneDNN blocks off (one region per composite: what merging gains).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

LIGHT_SIX = ["resnet50", "densenet121", "inception_v1", "squeezenet", "shufflenet", "vgg19"]


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def geomean(ratios: list[float]) -> float:
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=LIGHT_SIX)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5, help="calls per side per round")
    parser.add_argument("--unmerged", action="store_true", help="also time oneDNN without blocks")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import onnxruntime as ort
    import tvm
    import tvm_hetero
    from tvm_hetero import models
    from tvm_hetero.backends import DnnlBackend, dnnl

    if dnnl.info().get("available"):
        dnnl.set_num_threads(args.threads)
    print(f"threads {args.threads}; oneDNN {dnnl.info()}; {args.rounds} rounds x {args.runs} runs per side")
    header = f"{'model':<13} {'default':>9} {'onnxrt':>9} {'ratio':>7} {'min..max':>11}  backend"
    if args.unmerged:
        header += "; no blocks: ratio"
    print(header)
    print("-" * len(header))
    ratios = []
    for name in args.models:
        model = models.light_model(name)
        inputs = models.model_inputs(model)
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        expected = session.run(None, inputs)[0]

        builds = {"default": tvm_hetero.build(models.relax_module(model), [(tvm.cpu(0), "llvm")])}
        if args.unmerged:
            no_blocks = [DnnlBackend(device=None, devices=[0], merge=False)]
            builds["unmerged"] = tvm_hetero.build(models.relax_module(model), [(tvm.cpu(0), "llvm")], backends=no_blocks)
        runtimes = {}
        for label, built in builds.items():
            runtimes[label] = built.create()
            runtimes[label].run(**inputs)
            got = runtimes[label].get_output(0).numpy()
            err = float(np.abs(got - expected).max()) / (float(np.abs(expected).max()) or 1.0)
            if err > 1e-4:
                print(f"{name} ({label}): output differs from onnxruntime (max rel. error {err:.2e})", file=sys.stderr)
                return 1
        art, rt = builds["default"], runtimes["default"]

        run_ort = lambda s=session, x=inputs: s.run(None, x)
        run_ort()
        ours, theirs, per_round, unmerged = [], [], [], []
        for _ in range(args.rounds):
            o = median_ms(run_ort, args.runs)
            t = median_ms(rt.run, args.runs)
            ours.append(t)
            theirs.append(o)
            per_round.append(t / o)
            if args.unmerged:
                unmerged.append(median_ms(runtimes["unmerged"].run, args.runs) / o)
        ratio = statistics.median(per_round)
        ratios.append(ratio)
        regions = sum(n for _b, _d, n, _ops in art.build_report.backend_regions)
        kernels = sum(art.build_report.kernels_per_device)
        print(
            f"{name:<13} {statistics.median(ours):7.1f}ms {statistics.median(theirs):7.1f}ms {ratio:6.2f}x "
            f"{min(per_round):5.2f}..{max(per_round):4.2f}  {regions} oneDNN regions, {kernels} TVM kernels"
            + (f"; no blocks: {statistics.median(unmerged):.2f}x" if unmerged else ""),
            flush=True,
        )
    print(f"geomean {geomean(ratios):.2f}x over {len(ratios)} models; worst {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
