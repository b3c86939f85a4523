"""The DEFAULT build (``tvm_hetero.build`` without ``backends=``) against PyTorch eager, side by side.

    PYTHONPATH=python python bench/default_vs_torch.py --threads 1 [--models resnet18_like ...]

The speed goal's models (``tvm_hetero.testing.torch_models.SPEED``: ResNet-18, MobileNetV2, a
TransformerEncoderLayer), exported with torch.export and imported with TVM's Relax frontend
(weights as constants). torch gets ``torch.set_num_threads(N)``, TVM and oneDNN N threads, set
before anything loads. Every output is checked against torch before timing; timing is interleaved
as in bench/default_vs_onnxruntime.py (the median over rounds of the per-round ratio of medians).
"""

from __future__ import annotations

import sys

from default_vs_onnxruntime import bench_args, geomean, interleaved, report_row


def main() -> int:
    args = bench_args(__doc__)

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
        peer_ms, per_round = interleaved(run_torch, {"default": rt.run}, args.rounds, args.runs, args.settle)
        ratios.append(report_row(name, art, peer_ms, per_round["default"]))
    print(f"geomean {geomean(ratios):.2f}x over {len(ratios)} models; worst {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
