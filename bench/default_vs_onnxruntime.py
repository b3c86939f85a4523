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


def bench_args(description: str) -> argparse.Namespace:
    """The options both side-by-side benches take (``--models`` defaults to None: every model)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5, help="calls per side per round")
    parser.add_argument("--unmerged", action="store_true", help="also time oneDNN without blocks")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="seconds before each side's calls, so the other side's threads stop spinning")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read once, when OpenMP / TVM's pool load
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    return args


def interleaved(
    peer, ours: dict, rounds: int, runs: int, settle: float = 0.0
) -> tuple[float, dict[str, list[float]]]:
    """Each round times ``runs`` calls of ``peer``, then of each of ``ours`` (label -> function);
    returns the peer's median time and, per label, the per-round ratios to the peer. ``settle``
    seconds pass before each side's calls: both runtimes' thread pools spin for a while after a
    call (onnxruntime's by default, libgomp's by default), and with more than one thread a side
    that starts while the other's threads still spin runs on cores it does not have."""
    peer_ms, ratios = [], {label: [] for label in ours}
    for _ in range(rounds):
        time.sleep(settle)
        p = median_ms(peer, runs)
        peer_ms.append(p)
        for label, fn in ours.items():
            time.sleep(settle)
            ratios[label].append(median_ms(fn, runs) / p)
    return statistics.median(peer_ms), ratios


def report_row(name: str, art, peer_ms: float, per_round: list[float], extra: str = "") -> float:
    """Print one model's line (ours: the median ratio times the peer's median time; the peer; the
    median ratio and its range; what ran it); returns the ratio."""
    ratio = statistics.median(per_round)
    regions = sum(n for _b, _d, n, _ops in art.build_report.backend_regions)
    kernels = sum(art.build_report.kernels_per_device)
    print(
        f"{name:<26} {ratio * peer_ms:7.1f}ms {peer_ms:7.1f}ms {ratio:6.2f}x "
        f"{min(per_round):5.2f}..{max(per_round):4.2f}  {regions} oneDNN regions, {kernels} TVM kernels{extra}",
        flush=True,
    )
    return ratio


def geomean(ratios: list[float]) -> float:
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def main() -> int:
    args = bench_args(__doc__)

    import numpy as np
    import tvm
    import tvm_hetero
    from tvm_hetero.backends import DnnlBackend, dnnl
    from tvm_hetero.testing import models

    if dnnl.info().get("available"):
        dnnl.set_num_threads(args.threads)
    print(f"threads {args.threads}; oneDNN {dnnl.info()}; {args.rounds} rounds x {args.runs} runs per side")
    header = f"{'model':<26} {'default':>9} {'onnxrt':>9} {'ratio':>7} {'min..max':>11}  backend"
    if args.unmerged:
        header += "; no blocks: ratio"
    print(header)
    print("-" * len(header))
    ratios = []
    for name in args.models or LIGHT_SIX:
        model = models.light_model(name)
        inputs = models.model_inputs(model)
        session = models.onnxruntime_session(model, args.threads)
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
        art = builds["default"]

        run_ort = lambda s=session, x=inputs: s.run(None, x)
        run_ort()
        peer_ms, per_round = interleaved(run_ort, {k: r.run for k, r in runtimes.items()}, args.rounds, args.runs,
                                       args.settle)
        extra = f"; no blocks: {statistics.median(per_round['unmerged']):.2f}x" if args.unmerged else ""
        ratios.append(report_row(name, art, peer_ms, per_round["default"], extra))
    print(f"geomean {geomean(ratios):.2f}x over {len(ratios)} models; worst {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
