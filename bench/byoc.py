"""Latency of the light ONNX models: TVM kernels only, TVM + oneDNN regions, and onnxruntime (CPU).

    PYTHONPATH=python python bench/byoc.py [--threads 1] [--models resnet50 shufflenet densenet121]

All three run in this one process on the same thread count: TVM's pool (TVM_NUM_THREADS), oneDNN's
OpenMP (OMP_NUM_THREADS: Debian's libdnnl uses the OMP runtime) and onnxruntime's
intra_op_num_threads. Each latency is the median of ``--repeat`` runs after one warm-up
(TVM-kernels-only runs are slow, so they get ``--repeat-tvm``). Outputs are checked against
onnxruntime before timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["resnet50", "shufflenet", "densenet121"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--repeat-tvm", type=int, default=2)
    args = parser.parse_args()
    # Before anything loads TVM or libgomp: both read these once.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import tvm
    import tvm_hetero
    from tvm_hetero.backends import dnnl
    from tvm_hetero.testing import models

    info = dnnl.info()
    if not info.get("available"):
        print("libtvm_hetero was built without oneDNN; install libdnnl-dev and rebuild", file=sys.stderr)
        return 1
    dnnl.set_num_threads(args.threads)
    print(
        f"threads: {args.threads} (TVM_NUM_THREADS, OMP_NUM_THREADS for oneDNN {info['version']} "
        f"[{info['cpu_runtime']} runtime, reports {dnnl.info()['threads']}], onnxruntime intra_op_num_threads)"
    )
    header = f"{'model':<12} {'tvm only':>10} {'tvm+dnnl':>10} {'onnxrt':>10} {'dnnl/ort':>9} {'tvm/dnnl':>9} regions"
    print(header)
    print("-" * len(header))
    for name in args.models:
        model = models.light_model(name)
        inputs = models.model_inputs(model)
        session = models.onnxruntime_session(model, args.threads)
        expected = session.run(None, inputs)[0]

        mod = models.relax_module(model)
        runtimes = {}
        for label, backends in (("tvm", []), ("dnnl", ["dnnl"])):
            art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], backends=backends)
            rt = art.create()
            for key, value in inputs.items():
                rt.set_input(key, value)
            rt.run()
            got = rt.get_output(0).numpy()
            scale = float(np.abs(expected).max()) or 1.0
            err = float(np.abs(got - expected).max()) / scale
            if err > 1e-4:
                print(
                    f"{name}: {label} output differs from onnxruntime (max rel. error {err:.2e})",
                    file=sys.stderr,
                )
                return 1
            runtimes[label] = (rt, art)

        def median_ms(fn, repeat: int) -> float:
            fn()
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
            return statistics.median(times)

        ort_ms = median_ms(lambda s=session, x=inputs: s.run(None, x), args.repeat)
        dnnl_ms = median_ms(runtimes["dnnl"][0].run, args.repeat)
        tvm_ms = median_ms(runtimes["tvm"][0].run, args.repeat_tvm)
        regions = sum(n for _b, _d, n, _ops in runtimes["dnnl"][1].build_report.backend_regions)
        print(
            f"{name:<12} {tvm_ms:8.1f}ms {dnnl_ms:8.1f}ms {ort_ms:8.1f}ms {dnnl_ms / ort_ms:8.2f}x "
            f"{tvm_ms / dnnl_ms:8.1f}x {regions}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
