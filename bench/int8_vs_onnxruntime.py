"""QDQ (int8) models: the default build against onnxruntime on the same QDQ model, side by side.

    PYTHONPATH=python python bench/int8_vs_onnxruntime.py --threads 1 [--models squeezenet ...]
        [--variants per_tensor per_channel]

Each light model is quantized with onnxruntime's own ``quantize_static`` (QDQ, uint8 activations,
int8 weights, 4 seeded calibration batches: ``testing.quantized.qdq_model``), per tensor and per
channel. The same QDQ model runs in onnxruntime's CPU provider (its int8 kernels) and through
``tvm_hetero.build``. Outputs are checked first: every element within one step of the output's
quantization (the scale of the last QuantizeLinear) of onnxruntime's. Timing as in
default_vs_onnxruntime.py (interleaved rounds, median per-round ratio, one thread count per
process). Each row also says how the model's QDQ units ran (int8 in oneDNN, float inside a
oneDNN block, or TVM kernels).
"""

from __future__ import annotations

import logging
import sys
import warnings

from default_vs_onnxruntime import bench_args, geomean, interleaved, report_row

LIGHT_SIX = ["resnet50", "densenet121", "inception_v1", "squeezenet", "shufflenet", "bvlc_alexnet"]


def main() -> int:
    args = bench_args(__doc__)
    logging.disable(logging.WARNING)  # the quantizer's advice on pre-processing
    warnings.filterwarnings("ignore")

    import numpy as np
    import tvm
    import tvm_hetero
    from tvm_hetero.backends import dnnl
    from tvm_hetero.testing import models
    from tvm_hetero.testing.quantized import qdq_model, quantization_step

    if dnnl.info().get("available"):
        dnnl.set_num_threads(args.threads)
    print(f"threads {args.threads}; oneDNN {dnnl.info()}; {args.rounds} rounds x {args.runs} runs per side")
    header = f"{'model':<26} {'ours':>9} {'ort int8':>9} {'ratio':>7} {'min..max':>11}  backend"
    print(header)
    print("-" * len(header))
    ratios = []
    for name in args.models or LIGHT_SIX:
        for per_channel in (False, True):
            label = f"{name}/{'pc' if per_channel else 'pt'}"
            model = qdq_model(models.light_model(name), per_channel=per_channel)
            inputs = models.model_inputs(model)
            session = models.onnxruntime_session(model, args.threads)
            expected = session.run(None, inputs)[0]
            art = tvm_hetero.build(models.relax_module(model), [(tvm.cpu(0), "llvm")])
            runtime = art.create()
            runtime.run(**inputs)
            got = runtime.get_output(0).numpy()
            step = quantization_step(model)
            steps = float(np.abs(got - expected).max()) / step
            if steps > 1.0 + 1e-3:
                print(f"{label}: output {steps:.1f} quantization steps from onnxruntime's", file=sys.stderr)
            run_ort = lambda s=session, x=inputs: s.run(None, x)
            run_ort()
            peer_ms, per_round = interleaved(run_ort, {"ours": runtime.run}, args.rounds, args.runs, args.settle)
            notes = [n for n in art.build_report.backend_notes if n.startswith("QDQ units")]
            extra = f"; max {steps:.2f} steps off" + "".join(f"\n    {n}" for n in notes)
            ratios.append(report_row(label, art, peer_ms, per_round["ours"], extra))
    print(f"geomean {geomean(ratios):.2f}x over {len(ratios)} models; worst {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
