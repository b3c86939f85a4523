"""The DEFAULT build (``tvm_hetero.build`` without ``backends=``) against PyTorch eager, side by side.

    PYTHONPATH=python python bench/default_vs_torch.py --threads 1 [--models resnet18_like ...]

The speed goal's models (``tvm_hetero.testing.torch_models.SPEED``: ResNet-18, MobileNetV2, a
TransformerEncoderLayer), exported with torch.export and imported with TVM's Relax frontend
(weights as constants). torch gets ``torch.set_num_threads(N)``, TVM and oneDNN N threads, set
before anything loads. Every output is checked against torch before timing; timing is interleaved
as in bench/default_vs_onnxruntime.py (the median over rounds of the per-round ratio of medians).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from default_vs_onnxruntime import geomean, median_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5, help="calls per side per round")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import torch
    import tvm
    import tvm_hetero
    from tvm_hetero.backends import dnnl
    from tvm_hetero.testing import torch_models

    torch.set_num_threads(args.threads)
    if dnnl.info().get("available"):
        dnnl.set_num_threads(args.threads)
    names = args.models or list(torch_models.SPEED)
    print(f"threads {args.threads}; torch {torch.__version__}; {args.rounds} rounds x {args.runs} runs per side")
    header = f"{'model':<26} {'default':>9} {'torch':>9} {'ratio':>7} {'min..max':>11}  backend"
    print(header)
    print("-" * len(header))
    ratios = []
    for name in names:
        mod, inputs, expected = torch_models.imported(name)
        model, torch_args = torch_models.torch_model(name)
        art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")])
        rt = art.create()
        feeds = dict(zip(art.input_names, inputs))
        rt.run(**feeds)
        got = rt.get_output(0).numpy()
        err = float(np.abs(got - expected).max()) / (float(np.abs(expected).max()) or 1.0)
        if err > 1e-4:
            print(f"{name}: output differs from torch (max rel. error {err:.2e})", file=sys.stderr)
            return 1

        def run_torch(m=model, a=torch_args):
            with torch.no_grad():
                m(*a)

        run_torch()
        ours, theirs, per_round = [], [], []
        for _ in range(args.rounds):
            o = median_ms(run_torch, args.runs)
            t = median_ms(rt.run, args.runs)
            ours.append(t)
            theirs.append(o)
            per_round.append(t / o)
        ratio = statistics.median(per_round)
        ratios.append(ratio)
        regions = sum(n for _b, _d, n, _ops in art.build_report.backend_regions)
        kernels = sum(art.build_report.kernels_per_device)
        print(
            f"{name:<26} {statistics.median(ours):7.1f}ms {statistics.median(theirs):7.1f}ms {ratio:6.2f}x "
            f"{min(per_round):5.2f}..{max(per_round):4.2f}  {regions} oneDNN regions, {kernels} TVM kernels",
            flush=True,
        )
    print(f"geomean {geomean(ratios):.2f}x over {len(ratios)} models; worst {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
