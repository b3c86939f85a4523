"""A SmolLM2-135M-shaped decoder's phases on a Snapdragon X Elite HTP, modeled: prefill and decode
tokens/s from QNN's cycle counts, never the emulator's wall time.

The shape is SmolLM2-135M's (hidden 576, 9 heads / 3 key-value heads, intermediate 1536, vocab
49152, random weights), built with fewer layers than its 30 because the x86 emulator is hundreds of
times slower than an HTP: with ``L1`` and ``L2`` layers (default 1 and 2), each graph (a prefill
chunk of ``--chunk`` rows, the decode token) is built for the CPU and the HTP as ``tvm_hetero.llm``
builds it (one QNN graph per call), and the build's verification profiles one execution in QNN
cycles. Per graph, the cycles of one layer are ``(c(L2) - c(L1)) / (L2 - L1)`` and the rest (the
embedding, the final norm, the logits) ``c(L1) - L1 x layer``; 30 layers are then
``rest + 30 x layer`` cycles. One call costs those cycles x the device's us per cycle
(``qnn.ep.us_per_cycle``: fitted on a device, else the default from SqueezeNet on an X Elite) plus
the fixed cost of a QNN graph call (``qnn.ep.CALL_SECONDS``): modeled, and labelled so.

    PYTHONPATH=python taskset -c 1 python bench/llm/htp_modeled.py [--precisions fp16,a16w8] [--chunk 32]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

SMOLLM2_135M = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
                "vocab_size": 49152, "num_hidden_layers": 30, "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True}


def checkpoint(layers: int, folder: Path) -> str:
    import torch
    import transformers as hf

    torch.manual_seed(0)
    config = hf.LlamaConfig(**{**SMOLLM2_135M, "num_hidden_layers": layers})
    path = folder / f"smollm2_{layers}"
    hf.LlamaForCausalLM(config).eval().save_pretrained(path)
    return str(path)


def graph_cycles(path: str, precision: str, chunk: int, capacity: int) -> dict:
    """QNN cycles of one call of each graph (chunk rows, 1 row), and its build's seconds."""
    import tvm
    from tvm_hetero import llm

    start = time.perf_counter()
    lm = llm.build(path, [(tvm.cpu(0), "llvm"), f"qnn-htp:precision={precision}"], capacity=capacity,
                   prefill_chunks=(chunk,), check_tokens=0, offload_tolerance=1.0)
    seconds = time.perf_counter() - start
    out = {"build_seconds": seconds}
    for graph in lm.graphs:
        offload = graph.offload
        modeled = offload.modeled if offload else None
        verification = offload.verification if offload else None
        out[graph.size] = {"cycles": modeled.cycles if modeled else float("nan"), "calls": graph.accelerator_executions,
                           "flops_share": offload.flops_on_device / offload.flops if offload and offload.flops else 0,
                           "verified_error": max((r.relative_error for r in verification.regions), default=float("nan"))
                           if verification else float("nan"),
                           "build_seconds": graph.build_seconds}
    return out


def main() -> None:
    from tvm_hetero.qnn.ep import CALL_SECONDS, us_per_cycle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp16,a16w8")
    parser.add_argument("--layers", default="1,2", help="the two layer counts built (L1,L2)")
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--capacity", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args()
    low, high = (int(x) for x in args.layers.split(","))
    factor, source = us_per_cycle({"soc_model": 60, "htp_arch": 73})
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {n: checkpoint(n, Path(tmp)) for n in (low, high)}
        for precision in args.precisions.split(","):
            load = os.getloadavg()[0]
            measured = {n: graph_cycles(paths[n], precision, args.chunk, args.capacity) for n in (low, high)}
            row = {"precision": precision, "load": [load, os.getloadavg()[0]], "us_per_cycle": factor,
                   "factor_source": source, "measured": measured}
            for size in (args.chunk, 1):
                a, b = measured[low][size]["cycles"], measured[high][size]["cycles"]
                layer = (b - a) / (high - low)
                rest = a - low * layer
                total = rest + SMOLLM2_135M["num_hidden_layers"] * layer
                seconds = total * factor * 1e-6 + measured[high][size]["calls"] * CALL_SECONDS
                row[size] = {"cycles_per_layer": layer, "cycles_rest": rest, "cycles_30_layers": total,
                             "modeled_seconds": seconds, "modeled_tokens_per_second": size / seconds}
            results.append(row)
            print(f"{precision}: prefill {args.chunk}-row chunk {row[args.chunk]['modeled_seconds'] * 1e3:.2f} ms "
                  f"= {row[args.chunk]['modeled_tokens_per_second']:.0f} tok/s; decode "
                  f"{row[1]['modeled_seconds'] * 1e3:.2f} ms = {row[1]['modeled_tokens_per_second']:.0f} tok/s "
                  f"(modeled: {row[1]['cycles_30_layers'] / 1e6:.1f} M cycles per token, "
                  f"{row[args.chunk]['cycles_30_layers'] / 1e6:.1f} M per chunk, x {factor:.3g} us ({source}) "
                  f"+ {CALL_SECONDS * 1e3:.2f} ms per call); builds {low}/{high} layers "
                  f"{measured[low]['build_seconds']:.0f}/{measured[high]['build_seconds']:.0f} s; "
                  f"verified error {measured[high][args.chunk]['verified_error']:.1e} / "
                  f"{measured[high][1]['verified_error']:.1e}; matmul FLOPs on the HTP "
                  f"{measured[high][args.chunk]['flops_share']:.0%}; load {row['load'][0]:.1f}-{row['load'][1]:.1f}",
                  flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
