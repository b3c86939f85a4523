"""QDQ (int8) models: the default build against onnxruntime and OpenVINO on the same QDQ model,
side by side.

    PYTHONPATH=python python bench/int8_vs_onnxruntime.py --threads 1 [--models squeezenet ...]
        [--variants pt pc] [--no-openvino]

Models: the six light models, MobileNetV2 and a two-layer BERT (``testing.export_models``: exported
from PyTorch with seeded weights, nothing downloaded). Each is quantized with onnxruntime's own
``quantize_static`` (QDQ, uint8 activations, int8 weights, 4 seeded calibration batches:
``testing.quantized.qdq_model``), per tensor (``pt``) and per channel (``pc``). The same QDQ model
runs in onnxruntime's CPU provider (its int8 kernels; its threads wait without spinning, as
ours do with ``OMP_WAIT_POLICY=PASSIVE``), in OpenVINO's CPU plugin (when ``openvino``
is installed) and through ``tvm_hetero.build``. Outputs are checked first, in steps of the
output's quantization (the scale of the last QuantizeLinear; a model whose output is not quantized
is compared in units of its largest magnitude). Timing as in default_vs_onnxruntime.py: interleaved
rounds (onnxruntime, then ours, then OpenVINO, each after ``--settle`` seconds), the median
per-round ratio to onnxruntime, one thread count per process. Each row gives the 1-minute load
average before and after it (the machine may be shared) and how the model's QDQ units ran.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import warnings

from default_vs_onnxruntime import bench_args, geomean, interleaved, report_row

MODELS = ["resnet50", "densenet121", "inception_v1", "squeezenet", "shufflenet", "bvlc_alexnet",
          "mobilenet_v2", "bert_small"]


def onnx_model(name: str):
    """The float ONNX model ``name``: a light model, or one exported from PyTorch."""
    from tvm_hetero.testing import export_models, models

    if name == "mobilenet_v2":
        return export_models.mobilenet_v2_onnx()
    if name == "bert_small":
        return export_models.small_bert_onnx()
    return models.light_model(name)


_OPENVINO_CONFIG = '{"INFERENCE_NUM_THREADS": %d, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}'
_OPENVINO_PROBE = ("import json, sys, openvino as ov; core = ov.Core(); "
                   "core.compile_model(core.read_model(sys.argv[1]), 'CPU', json.loads(sys.argv[2]))")


def openvino_runner(model, threads: int):
    """A function running ``model`` in OpenVINO's CPU plugin (latency hint, one stream, ``threads``
    inference threads) and returning its first output, or None when openvino is not installed.
    The model is compiled in a child process first: OpenVINO 2026.4 crashes (SIGSEGV) compiling
    some QDQ graphs (DenseNet-121), which must not end the bench; that raises RuntimeError."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    config = _OPENVINO_CONFIG % threads
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
        probe = subprocess.run([sys.executable, "-c", _OPENVINO_PROBE, path, config], capture_output=True, text=True,
                               check=False)
        if probe.returncode != 0:
            tail = (probe.stderr.strip().splitlines() or [""])[-1]
            raise RuntimeError(f"OpenVINO's compile_model failed in a child process (exit {probe.returncode}) {tail}")
        compiled = core.compile_model(core.read_model(path), "CPU", json.loads(config))
    request = compiled.create_infer_request()
    return lambda inputs: request.infer(inputs)[compiled.output(0)]


def onnxruntime_session(model, threads: int):
    """onnxruntime's CPU EP with ``threads`` intra-op threads that wait without spinning, as ours
    do under ``OMP_WAIT_POLICY=PASSIVE``: on a shared machine a spinning pool runs on cores other
    processes need (and loses them)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def own_args() -> argparse.Namespace:
    """This bench's options (``--variants``, ``--no-openvino``), taken out of ``sys.argv`` before
    the options every side-by-side bench shares (``bench_args``) are read."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--variants", nargs="+", choices=["pt", "pc"], default=["pt", "pc"])
    parser.add_argument("--no-openvino", action="store_true")
    own, rest = parser.parse_known_args()
    sys.argv[1:] = rest
    return own


def main() -> int:
    own = own_args()
    parser_args = bench_args(__doc__)
    logging.disable(logging.WARNING)  # the quantizer's advice on pre-processing
    warnings.filterwarnings("ignore")

    import numpy as np
    import tvm
    import tvm_hetero
    from tvm_hetero.backends import dnnl
    from tvm_hetero.testing import export_models, models
    from tvm_hetero.testing.quantized import qdq_model, quantization_step

    args = parser_args
    if dnnl.info().get("available"):
        dnnl.set_num_threads(args.threads)
    print(f"threads {args.threads}; oneDNN {dnnl.info()}; {args.rounds} rounds x {args.runs} runs per side; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    header = (f"{'model':<26} {'ours':>9} {'ort int8':>9} {'ratio':>7} {'min..max':>11}  backend; "
              f"openvino/ort; steps off ort (ours, openvino); load")
    print(header)
    print("-" * len(header))
    ratios, ov_ratios = [], []
    for name in args.models or MODELS:
        float_model = onnx_model(name)
        for variant in own.variants:
            label = f"{name}/{variant}"
            load_before = os.getloadavg()[0]
            model = qdq_model(float_model, per_channel=variant == "pc")
            inputs = export_models.sample_inputs(model)
            session = onnxruntime_session(model, args.threads)
            expected = session.run(None, inputs)[0]
            step = quantization_step(model) or float(np.abs(expected).max())
            art = tvm_hetero.build(models.relax_module(model), [(tvm.cpu(0), "llvm")])
            runtime = art.create()
            runtime.run(**inputs)
            steps = float(np.abs(runtime.get_output(0).numpy() - expected).max()) / step
            ours = {"ours": runtime.run}
            ov_steps = float("nan")
            run_ov, ov_error = None, ""
            try:
                run_ov = None if own.no_openvino else openvino_runner(model, args.threads)
            except RuntimeError as e:  # OpenVINO's transformations refuse some QDQ graphs
                ov_error = str(e).strip().splitlines()[-1][:120]
            if run_ov is not None:
                ov_steps = float(np.abs(np.asarray(run_ov(inputs)) - expected).max()) / step
                ours["openvino"] = lambda f=run_ov, x=inputs: f(x)
            run_ort = lambda s=session, x=inputs: s.run(None, x)
            run_ort()
            peer_ms, per_round = interleaved(run_ort, ours, args.rounds, args.runs, args.settle)
            notes = [n for n in art.build_report.backend_notes if n.startswith("QDQ units")]
            ov = per_round.get("openvino")
            ov_text = f"{np.median(ov):.2f}x" if ov else f"n/a ({ov_error or 'not installed or off'})"
            if ov:
                ov_ratios.append(float(np.median(ov)))
            extra = (f"; openvino {ov_text}; steps {steps:.2f}, {ov_steps:.2f}; "
                     f"load {load_before:.1f}->{os.getloadavg()[0]:.1f}" + "".join(f"\n    {n}" for n in notes))
            ratios.append(report_row(label, art, peer_ms, per_round["ours"], extra))
    print(f"geomean {geomean(ratios):.2f}x over {len(ratios)} models; worst {max(ratios):.2f}x"
          + (f"; openvino geomean {geomean(ov_ratios):.2f}x" if ov_ratios else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
