"""Decoders' phases on the emulated HTP: what runs there, how many graph executions, how close to fp32.

For each tiny test model (tests/python/test_llm.py: Llama, Qwen2, GPT-2; 2 layers, hidden 64) and
each placement -- both phases on the CPU and the HTP (``htp``), or prefill there and decode on the
CPU (``prefill-htp``) -- ``tvm_hetero.llm.build`` with ``check_tokens`` teacher-forced steps
(docs/llm.md, "Phases across devices"), then a greedy generation against transformers' fp32 tokens.
Printed per line: each prefill bucket's logits error against the host's fp32 graph, the decode
steps' worst error, the greedy agreement, HTP graph executions per chunk and per token, the share
of matmul FLOPs on the HTP, the ops on the HTP, the build's wall time, the load average.

The emulator's wall time is not an HTP's (hundreds of times slower): no speed is reported. Run it
confined to one core so that it disturbs the rest of the machine less:

    PYTHONPATH=python taskset -c 1 python bench/llm/htp_phases.py [--tokens 64] [--capacity 128] [--chunks 8,32] [--peer]

``--peer`` also hands each ONNX model our build gave QNN to ONNX Runtime with the QNN EP (the peer,
qnn/peer.py) and prints its partitions, node split and error against the CPU EP.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))


def peer_side_by_side(lm) -> list[dict]:
    """ONNX Runtime + QNN EP (qnn/peer.py, in a child process) on each ONNX model our build handed to
    QNN, on random inputs drawn as the capability probe draws them: its partitions, its node split
    and its error against ONNX Runtime's CPU EP in fp32."""
    from tvm_hetero.ep_offload.capability_probe import sample_feeds
    from tvm_hetero.qnn import peer

    rows = []
    for graph in lm.graphs:
        for region, model in graph.accelerator_models.items():
            feeds = sample_feeds(model)
            result = peer.run_peer(model, feeds, repeat=1, warmup=0, isolated=True, timeout=900)
            error = peer.relative_error(result.outputs, peer.cpu_reference(model, feeds)) if result.ran else float("nan")
            rows.append({"size": graph.size, "region": region, "ran": result.ran, "partitions": result.partitions,
                         "nodes_qnn": result.nodes_qnn, "nodes_cpu": result.nodes_cpu, "cpu_ops": result.cpu_ops,
                         "relative_error": error, "error": result.error})
    return rows


def measure(arch: str, placement: str, tokens: int, capacity: int, chunks: tuple[int, ...],
            with_peer: bool = False) -> dict:
    import tvm
    from test_llm import prompt_of, reference_tokens, tiny_model  # the test models
    from tvm_hetero import llm

    host = (tvm.cpu(0), "llvm")
    model = tiny_model(arch)
    targets = ([host, "qnn-htp"] if placement == "htp" else {"prefill": [host, "qnn-htp"], "decode": [host]})
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    lm = llm.build(model, targets, capacity=capacity, prefill_chunks=chunks, check_tokens=tokens)
    build_seconds = time.perf_counter() - start
    check = lm.phase_check
    prompt = prompt_of(13, lm.config.vocab_size)
    new = min(tokens, capacity - len(prompt))
    same = lm.generate(prompt, new) == reference_tokens(model, prompt, new)
    graphs = {}
    for graph in lm.graphs:
        offload = graph.offload
        graphs[graph.size] = {
            "executions": graph.accelerator_executions,
            "flops_share": offload.flops_on_device / offload.flops if offload and offload.flops else 0.0,
            "ops_on_device": sum(r.ops for r in offload.regions) if offload else 0,
            "ops_asked": offload.asked if offload else 0,
            "refused": sorted({f"{r.op}: {r.reason}" for r in offload.refused}) if offload else [],
            "moved_to_host": graph.moved_to_host,
        }
    peer_rows = peer_side_by_side(lm) if with_peer and placement == "htp" else []
    return {"peer": peer_rows, "arch": arch, "placement": placement, "buckets": check["buckets"], "decode": check["decode"],
            "failed": check["failed"], "tolerance": check["tolerance"], "graphs": graphs,
            "generate_matches_transformers": same, "new_tokens": new, "build_seconds": build_seconds,
            "load": [load_before, os.getloadavg()[0]]}


def row(result: dict) -> str:
    graphs = result["graphs"]
    prefill = [g for size, g in graphs.items() if size > 1]
    buckets = ", ".join(f"{size}: {error:.1e}" for size, error in sorted(result["buckets"].items()))
    decode = result["decode"]
    flops = min(g["flops_share"] for g in graphs.values() if g["executions"]) if any(
        g["executions"] for g in graphs.values()) else 0.0
    ops = "/".join(f"{g['ops_on_device']}" for g in graphs.values())
    return (f"| {result['arch']} | {result['placement']} | {buckets} | {decode['max_error']:.1e} | "
            f"{decode['agreement']}/{decode['steps']} | {'same' if result['generate_matches_transformers'] else 'DIFFERENT'}"
            f" ({result['new_tokens']}) | {max(g['executions'] for g in prefill)} | {graphs[1]['executions']} | "
            f"{flops:.0%} | {ops} | {result['build_seconds']:.0f} s | {result['load'][0]:.1f}-{result['load'][1]:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="llama,qwen2,gpt2")
    parser.add_argument("--placements", default="htp,prefill-htp")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--capacity", type=int, default=128)
    parser.add_argument("--chunks", default="8,32")
    parser.add_argument("--out", help="write every result as JSON here")
    parser.add_argument("--peer", action="store_true",
                        help="also run ONNX Runtime + QNN EP on the ONNX graphs handed to QNN (placement htp)")
    args = parser.parse_args()
    chunks = tuple(int(c) for c in args.chunks.split(","))
    results = []
    print("| model | placement | prefill buckets: logits error | decode: worst error | greedy agreement "
          "(teacher-forced) | generate vs transformers (tokens) | HTP executions per chunk | per token | "
          "matmul FLOPs on the HTP | ops on the HTP per graph | build | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for arch in args.archs.split(","):
        for placement in args.placements.split(","):
            result = measure(arch, placement, args.tokens, args.capacity, chunks, args.peer)
            results.append(result)
            print(row(result), flush=True)
            for size, graph in result["graphs"].items():
                for refused in graph["refused"]:
                    print(f"    graph of {size} row(s): refused: {refused}")
            for peer in result["peer"]:
                print(f"    peer (ONNX Runtime + QNN EP) on the graph of {peer['size']} row(s): "
                      + (f"{peer['partitions']} QNN partition(s), {peer['nodes_qnn']} nodes on QNN, {peer['nodes_cpu']} "
                         f"on the CPU {peer['cpu_ops'] or ''}, error {peer['relative_error']:.1e}" if peer["ran"]
                         else f"did not run: {peer['error']}"))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=lambda v: float(np.asarray(v))))


if __name__ == "__main__":
    main()
