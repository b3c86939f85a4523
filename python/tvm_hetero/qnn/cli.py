"""The HTP's commands of ``tvm-hetero``: ``demo-htp``, ``qnn-fit`` and ``qnn-costs`` (the kind
record's ``cli`` adds them to the command line)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any


def add_commands(subparsers: Any) -> None:
    """Add this vendor's commands to ``tvm-hetero``'s subcommands."""
    demo_htp = subparsers.add_parser("demo-htp", help="a model over the host CPU and a Qualcomm HTP (QNN), against "
                                               "ONNX Runtime + QNN EP")
    demo_htp.add_argument("--model", default="squeezenet",
                          help="a light ONNX model's name (squeezenet, inception_v1, ...) or an .onnx file")
    demo_htp.add_argument("--repeat", type=int, default=3, metavar="N",
                          help="timed runs of ours and of the peer (default 3)")
    demo_htp.add_argument("--part", choices=("all", "model", "decoder"), default="all",
                          help="the model part, the decoder part (a tiny Llama-shaped checkpoint: prefill on the "
                               "HTP, decode on the CPU), or both (default)")
    demo_htp.set_defaults(fn=cmd_demo_htp)
    fit = subparsers.add_parser("qnn-fit", help="import a QNN profile taken on a real device: its microseconds per HTP "
                                         "cycle, used for modeled HTP latencies")
    fit.add_argument("profile", help="the CSV the QNN EP writes with profiling_level=detailed, on the device")
    fit.add_argument("--soc-model", type=int, default=60, help="the device's QNN SoC model (default 60)")
    fit.add_argument("--htp-arch", type=int, default=73,
                     help="the device's HTP architecture version (default 73)")
    fit.set_defaults(fn=cmd_qnn_fit)
    costs = subparsers.add_parser("qnn-costs", help="import HTP graph costs measured on a real device (used by "
                                             "placement='auto' instead of modeled ones)")
    costs.add_argument("file", help="JSON {graph key: seconds}, or with --key a QNN profile CSV taken on the device")
    costs.add_argument("--key", default=None, help="the graph's key (the build report lists it) for a profile CSV")
    costs.set_defaults(fn=cmd_qnn_costs)



def cmd_demo_htp(args: argparse.Namespace) -> int:
    """A light model, then a decoder, over the host CPU and a Qualcomm HTP (emulated here), each against
    ONNX Runtime + QNN."""
    code = _demo_model(args) if args.part in ("all", "model") else 0
    if args.part in ("all", "decoder"):
        if args.part == "all":
            print()
        code = _demo_decoder() or code
    return code


def _demo_decoder() -> int:
    """A tiny Llama-shaped checkpoint (made once, offline): prompt prefilled on the HTP, tokens decoded
    on the CPU, beside ONNX Runtime + QNN EP on the same prefill graph (decoder_demo.py)."""
    from tvm_hetero.progress import Progress
    from tvm_hetero.qnn import decoder_demo
    from tvm_hetero.testing.tiny_decoder import SHAPE, reference_tokens, tiny_llama_checkpoint

    say = Progress(start=time.perf_counter())
    checkpoint = tiny_llama_checkpoint()
    print(f"tvm-hetero demo-htp: a decoder, tiny Llama-shaped ({SHAPE['num_hidden_layers']} layers, hidden "
          f"{SHAPE['hidden_size']}, vocab {SHAPE['vocab_size']}, seeded random weights, initializer_range 0.5; "
          f"{checkpoint}): prefill on cpu:0 + qnn-htp, decode on cpu:0")
    demo = decoder_demo.run(checkpoint, lambda prompt, n: reference_tokens(checkpoint, prompt, n), say=say)
    decoder_demo.print_demo(demo)
    print("(modeled HTP speeds come from QNN's cycle counts, never the emulator's wall time)")
    return 0 if demo.same_tokens and demo.check and not demo.check["failed"] else 1


def _demo_model(args: argparse.Namespace) -> int:
    """A light model over the host CPU and a Qualcomm HTP (emulated here), against ONNX Runtime + QNN."""
    import numpy as np
    import tvm

    import tvm_hetero
    from tvm_hetero.importers import from_onnx, load_onnx
    from tvm_hetero.progress import Progress
    from tvm_hetero.qnn import peer
    from tvm_hetero.runtime.measure import wall_times
    from tvm_hetero.testing import models

    say = Progress(start=time.perf_counter())
    from_file = args.model.endswith(".onnx") or os.sep in args.model
    what = "ONNX model" if from_file else "ONNX light model, seeded random weights"
    print(f"tvm-hetero demo-htp: {args.model} ({what}) on cpu:0 + qnn-htp "
          "(Snapdragon X Elite NPU, soc 60 / HTP v73, fp16; emulated by onnxruntime-qnn on this x86 host)")
    model = load_onnx(args.model) if from_file else models.light_model(args.model)
    inputs = models.model_inputs(model)
    t = time.perf_counter()
    art = tvm_hetero.build(from_onnx(model), [(tvm.cpu(0), "llvm"), "qnn-htp"], progress=say)
    build_s = time.perf_counter() - t
    print(art.report())
    rt = art.create()
    for name, value in inputs.items():
        rt.set_input(name, value)
    rt.run()
    times = wall_times(rt.run, args.repeat)
    ours = rt.get_output(0).numpy()
    reference = peer.cpu_reference(model, inputs)[0]
    scale = float(np.abs(reference).max())
    ours_err = float(np.abs(ours - reference).max()) / scale
    print(f"\nours: {rt.stats()['accelerator_graph_executions']} QNN graph execution(s) per inference, "
          f"{min(times) * 1e3:.0f} ms on the emulator (build {build_s:.1f} s), "
          f"relative error vs ONNX Runtime CPU fp32 {ours_err:.1e}")
    rt.close()
    say("running ONNX Runtime + QNN EP on the same model, emulator and options (in a child process)")
    result = peer.run_peer(model, inputs, repeat=args.repeat, isolated=True)
    if result.ran and result.outputs:
        peer_err = float(np.abs(result.outputs[0] - reference).max()) / scale
        verdict = "WRONG, without a warning" if peer_err > 1e-2 else "right"
        print(f"ONNX Runtime + QNN EP: {result.partitions} QNN partition(s), {result.nodes_qnn} nodes on QNN, "
              f"{result.nodes_cpu} on its CPU EP, {result.seconds * 1e3:.0f} ms, relative error {peer_err:.1e} ({verdict})")
    else:
        print(f"ONNX Runtime + QNN EP: did not finish: {result.error}")
    print("(emulator times are hundreds of times a real HTP's: context only, never a cost)")
    return 0 if ours_err <= 1e-2 else 1


def cmd_qnn_fit(args: argparse.Namespace) -> int:
    """Fit a device's microseconds per HTP cycle from a QNN profile taken on it, and keep it."""
    from tvm_hetero.qnn import ep as qnn_ep

    factor = qnn_ep.fit_us_per_cycle(args.profile)
    options = {"soc_model": args.soc_model, "htp_arch": args.htp_arch}
    path = qnn_ep.save_fitted_factor(options, factor, f"{args.profile} (soc {args.soc_model}, v{args.htp_arch})")
    print(f"{factor:.4g} us per HTP cycle for soc {args.soc_model} / HTP v{args.htp_arch}, kept in {path}; "
          f"HTP latencies are modeled with it from now on (the default was {qnn_ep.DEFAULT_US_PER_CYCLE:.4g})")
    return 0


def cmd_qnn_costs(args: argparse.Namespace) -> int:
    """Import HTP graph costs measured on a device into the device cost table."""
    from tvm_hetero.qnn import costs as htp_costs

    added = htp_costs.import_costs(args.file, args.key)
    for key, entry in added.items():
        print(f"graph {key[:12]}: {entry['seconds'] * 1e3:.3f} ms per execution ({entry['source']})")
    print(f"{len(added)} graph cost(s) kept in {htp_costs.table_path()}; placement='auto' uses them from now on")
    return 0


