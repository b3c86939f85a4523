"""Verification's move-back rules on CNNs nobody here wrote: FLOPs on the HTP against the error.

    PYTHONPATH=python taskset -c 1 python bench/fewest_ops.py --out fewest_ops.json [--size 224] [--models ...]

EfficientNet-B0 and RegNet-Y-400MF from ``transformers`` (torchvision is not needed), with seeded
random weights initialized as torchvision initializes them (Kaiming normal, fan out) and batch-norm
statistics randomized so that eval mode matters; the backbone's last feature map is the output (the
classifier head adds a pooling and one matmul), every convolution padded symmetrically inside the conv as in
torchvision (transformers' EfficientNet pads apart, with asymmetric pads on its stride-2 convs). Each is exported to ONNX (opset 17) and, in one run:

- built for ``[cpu, "qnn-htp"]`` (fp16, default tolerance) with ``offload_move_back="first_bad_step"``
  (the earlier rule) and with the default ``"fewest"``: conv/matmul FLOPs on the HTP, QNN graphs, ops
  moved back by verification, build rounds, the worst graph's verified error, and the whole model's
  error against ONNX Runtime's CPU EP in fp32 (the artifact run on the same inputs: what a user sees);
- run whole on ONNX Runtime + QNN EP (the peer, in a child process): its partitions and error.

Configurations against the published architectures: EfficientNet-B0 is width 1.0, depth 1.0,
224x224, a 1280-channel head; RegNet-Y-400MF is depths [1, 3, 6, 6], widths [48, 104, 208, 440],
group width 8, a 32-channel stem, squeeze-excitation at a quarter of each block's input width.
Build times are the emulator's (hundreds of times a real HTP's), given only to size the runs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

import numpy as np

MODELS = ("efficientnet_b0", "regnet_y_400mf")
RULES = ("first_bad_step", "fewest")


def torch_model(name: str, size: int):
    """The model in eval mode (seeded), returning its last feature map."""
    import torch
    import transformers as hf

    torch.manual_seed(0)
    if name == "efficientnet_b0":
        model = hf.EfficientNetModel(hf.EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0,
                                                           image_size=size, hidden_dim=1280))
    elif name == "regnet_y_400mf":
        model = hf.RegNetModel(hf.RegNetConfig(layer_type="y", depths=[1, 3, 6, 6], hidden_sizes=[48, 104, 208, 440],
                                               groups_width=8, embedding_size=32))
    else:
        raise SystemExit(f"unknown model {name!r}; one of {', '.join(MODELS)}")
    _symmetric_padding(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, mode="fan_out", generator=g)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-0.5, 0.5, generator=g)

    class Features(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x, return_dict=False)[0]

    return Features().eval()


def _symmetric_padding(model) -> None:
    """Convolutions padded by ``kernel // 2`` on every side, in the conv (as torchvision's EfficientNet
    and RegNet are): transformers' EfficientNet pads its stride-2 convs with a separate asymmetric
    ``ZeroPad2d`` and the others with ``padding="same"``, which export as Pad nodes of their own."""
    import torch

    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.ZeroPad2d):
                setattr(parent, child_name, torch.nn.Identity())
            elif isinstance(child, torch.nn.Conv2d) and isinstance(child.padding, str):
                child.padding = tuple(k // 2 for k in child.kernel_size)


def onnx_model(name: str, size: int):
    import onnx
    import torch

    model = torch_model(name, size)
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, (torch.zeros(1, 3, size, size),), buffer, opset_version=17, input_names=["x"],
                          output_names=["y"], dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


def cpu_reference(model, inputs: dict) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got.astype("float64") - expected).max() / np.abs(expected).max())


def ours(model, inputs: dict, reference: np.ndarray, rule: str, tolerance: float | None) -> dict:
    import tvm
    import tvm_hetero
    from tvm_hetero.importers import from_onnx

    start = time.perf_counter()
    art = tvm_hetero.build(from_onnx(model), [(tvm.cpu(0), "llvm"), "qnn-htp"],
                           calibration=[inputs], offload_move_back=rule, offload_tolerance=tolerance)
    seconds = time.perf_counter() - start
    rt = art.create()
    for key, value in inputs.items():
        rt.set_input(key, value)
    rt.run()
    out = rt.get_output(0).numpy()
    rt.close()
    htp = art.build_report.offload
    moved = [r for r in htp.excluded.values() if r.startswith("verification")]
    checks = htp.verification.regions if htp.verification else []  # none when every graph moved back
    return {"rule": rule, "flops_on_htp": htp.flops_on_device / htp.flops, "gflops": htp.flops / 1e9,
            "graphs": len(htp.regions), "ops_on_htp": sum(r.ops for r in htp.regions),
            "ops_moved_back": len(moved), "rounds": len(htp.move_back.rounds) if htp.move_back else 1,
            "worst_graph_error": max((r.relative_error for r in checks), default=0.0),
            "tolerance": tolerance if tolerance is not None else htp.verification.tolerance,
            "model_error": relative_error(out, reference),
            "history": [vars(r) for r in htp.move_back.rounds] if htp.move_back else [],
            "build_seconds_emulated": seconds, "report": art.report()}


def peer(model, inputs: dict, reference: np.ndarray, timeout: float) -> dict:
    from tvm_hetero.qnn import peer as qnn

    result = qnn.run_peer(model, inputs, repeat=1, isolated=True, timeout=timeout)
    return {"ran": result.ran, "partitions": result.partitions, "nodes_cpu": result.nodes_cpu,
            "error": relative_error(result.outputs[0], reference) if result.ran and result.outputs else None,
            "failure": result.error}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--tolerances", nargs="*", type=float, default=[],
                        help="tolerances beyond the default (fp16: 1e-2), for FLOPs on the HTP against the error")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f}; size {args.size}x{args.size}", flush=True)
    for name in args.models:
        model = onnx_model(name, args.size)
        inputs = {"x": np.random.default_rng(0).standard_normal((1, 3, args.size, args.size)).astype("float32")}
        reference = cpu_reference(model, inputs)
        row = {"model": name, "size": args.size, "peer": peer(model, inputs, reference, args.timeout)}
        rows.append(row)
        print(f"{name}: ONNX Runtime + QNN EP: {row['peer']['partitions']} partition(s), error {row['peer']['error']}",
              flush=True)
        for tolerance in [None, *args.tolerances]:
            for rule in RULES:  # the two rules side by side, at each tolerance
                key = rule if tolerance is None else f"{rule}@{tolerance:g}"
                row[key] = r = ours(model, inputs, reference, rule, tolerance)
                print(f"{name} [{key}]: {r['flops_on_htp']:.1%} of {r['gflops']:.2f} GFLOP on the HTP in {r['graphs']} "
                      f"graph(s), {r['ops_on_htp']} ops on the HTP, {r['ops_moved_back']} moved back by verification, "
                      f"{r['rounds']} round(s); worst graph error {r['worst_graph_error']:.2e} (tolerance "
                      f"{r['tolerance']:g}), whole model {r['model_error']:.2e}; build {r['build_seconds_emulated']:.0f} s "
                      f"(emulator), load {os.getloadavg()[0]:.1f}", flush=True)
                if args.out:  # after each build: a long run keeps what it measured
                    with open(args.out, "w") as f:
                        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
