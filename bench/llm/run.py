"""Decoders side by side: prefill and decode tokens per second of each peer, per thread count.

    PYTHONPATH=python python bench/llm/run.py --shape smollm2-135m|tiny --threads 1,2 --prompt 128 --new 64 \\
        [--int8] [--rounds 3] [--peers transformers onnxruntime-genai llama.cpp tvm-hetero]

Every peer loads the same checkpoint directory (checkpoints.py) and gets the same prompt token ids
(the checkpoint's tokenizer on generated text), greedy, exactly ``--new`` tokens (no early stop).
Prefill tok/s = prompt tokens / time to the first new token; decode tok/s = the other new tokens /
their time. ``--int8`` adds each peer's 8-bit line (llama.cpp Q8_0, onnxruntime-genai int8,
transformers dynamic int8, the product's ``weights="int8"``). Timing is interleaved: each round
runs every (peer, threads) entry once, in turn, after ``--settle`` seconds (the previous peer's
threads stop spinning); figures are medians over rounds, with the load average taken at each run.
The machine's limit is measured in the same run, before and after (bandwidth.py): decode ceiling =
read bandwidth at that thread count / the bytes of weights one step reads, per peer.
Tokens are checked against transformers fp32 (the first warm-up run of each entry): with random
weights greedy decoding is easily tied, so the count of agreeing leading tokens is reported, and
check_peers.py compares logits. Writes <out>/<shape>[-int8].json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bandwidth
import checkpoints

PEERS = ["transformers", "onnxruntime-genai", "llama.cpp", "tvm-hetero"]
# Weights below this stay in the caches from one step to the next: DRAM bandwidth does not bound
# their decode, so the table gives no ceiling for them (the tiny shape).
CACHE_RESIDENT_BYTES = 64e6


def peer_class(name: str):
    """The adapter of ``name``, imported only when asked for (each pulls its own runtime)."""
    if name == "transformers":
        from peer_transformers import TransformersPeer

        return TransformersPeer
    if name == "onnxruntime-genai":
        from peer_ortgenai import OrtGenaiPeer

        return OrtGenaiPeer
    if name == "llama.cpp":
        from peer_llamacpp import LlamaCppPeer

        return LlamaCppPeer
    from peer_tvm_hetero import TvmHeteroPeer

    return TvmHeteroPeer


def prompt_ids(checkpoint: Path, n: int) -> list[int]:
    """``n`` token ids of generated text through the checkpoint's own tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    ids = tok(" ".join(checkpoints.generated_text(max(16, 2 * n), seed=1)))["input_ids"][:n]
    if len(ids) < n:
        raise ValueError(f"the generated text gives {len(ids)} tokens, fewer than --prompt {n}")
    return ids


def timed(peer, prompt: list[int], n: int) -> tuple[list[int], float, float]:
    """(tokens, prefill seconds, decode seconds for the n - 1 tokens after the first)."""
    if hasattr(peer, "timed"):
        return peer.timed(prompt, n)
    tokens = []
    start = time.perf_counter()
    for token in peer.stream(prompt, n):
        if not tokens:
            first = time.perf_counter()
        tokens.append(token)
    end = time.perf_counter()
    if len(tokens) != n:
        raise RuntimeError(f"{peer.name}: {len(tokens)} tokens, not {n}")
    return tokens, first - start, end - first


def agreeing(tokens: list[int], ref: list[int]) -> int:
    """How many leading tokens agree with the reference."""
    n = 0
    for a, b in zip(tokens, ref):
        if a != b:
            break
        n += 1
    return n


def load_entries(checkpoint: Path, names: list[str], threads: list[int], int8: bool) -> tuple[list, list[str]]:
    """The (peer, threads) entries that load, and a line for each that does not."""
    entries, skipped = [], []
    for precision_int8 in [False, True] if int8 else [False]:
        for name in names:
            if name == "tvm-hetero":
                from peer_tvm_hetero import unavailable

                reasons = {t: unavailable(t, precision_int8) for t in threads}
            else:
                reasons = {t: None for t in threads}
            for t in threads:
                label = f"{name}{' 8-bit' if precision_int8 else ''} x{t}"
                if reasons[t]:
                    skipped.append(f"{label}: {reasons[t]}")
                    continue
                try:
                    entries.append(peer_class(name)(checkpoint, t, precision_int8))
                except Exception as err:  # noqa: BLE001 - a peer that does not load is reported, the others still run
                    skipped.append(f"{label}: {type(err).__name__}: {err}")
    return entries, skipped


def markdown(result: dict) -> str:
    bw = result["bandwidth_gbs"]
    lines = [
        f"{result['shape']}, prompt {result['prompt']} + {result['new']} new tokens, {result['rounds']} rounds; "
        f"read bandwidth (best pass) " + ", ".join(f"{t} thread(s) {v:.1f} GB/s" for t, v in bw.items())
        + f"; load average {result['load_start']:.1f} at the start, {result['load_end']:.1f} at the end",
        "",
        "| peer | threads | prefill tok/s | decode tok/s | weights MB | decode ceiling tok/s | of ceiling"
        + " | tokens as transformers | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        in_dram = r["weight_bytes"] >= CACHE_RESIDENT_BYTES
        ceiling = f"{r['decode_ceiling_tok_s']:.0f}" if in_dram else "(in cache)"
        share = f"{r['decode_tok_s'] / r['decode_ceiling_tok_s']:.0%}" if in_dram else "-"
        agree = "-" if r["agreeing_tokens"] is None else r["agreeing_tokens"]
        lines.append(
            f"| {r['peer']} | {r['threads']} | {r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} "
            f"| {r['weight_bytes'] / 1e6:.3g} | {ceiling} | {share} | {agree}/{result['new']} "
            f"| {min(r['load']):.1f}-{max(r['load']):.1f} |")
    lines += [""] + [f"- skipped {s}" for s in result["skipped"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", choices=list(checkpoints.SHAPES))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--int8", action="store_true", help="also each peer's 8-bit line")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.5, help="seconds before each run")
    parser.add_argument("--peers", nargs="+", default=PEERS, choices=PEERS)
    parser.add_argument("--out", type=Path, default=checkpoints.CACHE / "results")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.prompt + args.new > 512:
        parser.error("the peers are built for 512 tokens of context: --prompt + --new must not exceed it")

    checkpoint = checkpoints.make(args.shape)
    prompt = prompt_ids(checkpoint, args.prompt)
    load_start = os.getloadavg()[0]
    print(f"{args.shape}: {checkpoint}; prompt {len(prompt)} tokens + {args.new}; load average {load_start:.2f}",
          flush=True)
    bw_before = bandwidth.measure(threads, passes=3)

    entries, skipped = load_entries(checkpoint, args.peers, threads, args.int8)
    for line in skipped:
        print("skipped", line, flush=True)
    ref = None
    warm, weight_bytes = {}, {}
    for peer in entries:  # warm-up, the tokens each entry makes, the bytes a step reads
        warm[id(peer)] = timed(peer, prompt, args.new)[0]
        weight_bytes[id(peer)] = peer.weight_bytes()
        print(f"warm-up {peer.name} x{peer.threads}: {weight_bytes[id(peer)] / 1e6:.3g} MB of weights per step",
              flush=True)
        if ref is None and peer.name == "transformers":
            ref = warm[id(peer)]
    samples = {id(p): {"prefill": [], "decode": [], "load": []} for p in entries}
    for r in range(args.rounds):
        for peer in entries:
            time.sleep(args.settle)
            _, prefill, decode = timed(peer, prompt, args.new)
            s = samples[id(peer)]
            s["prefill"].append(len(prompt) / prefill)
            s["decode"].append((args.new - 1) / decode)
            s["load"].append(os.getloadavg()[0])
            print(f"round {r + 1} {peer.name:<28} x{peer.threads}: prefill {s['prefill'][-1]:7.1f} tok/s, "
                  f"decode {s['decode'][-1]:6.1f} tok/s  (load {s['load'][-1]:.2f})", flush=True)
    bw_after = bandwidth.measure(threads, passes=3)
    bw = {t: max(bw_before[t]["best_gbs"], bw_after[t]["best_gbs"]) for t in threads}

    rows = []
    for peer in entries:
        s = samples[id(peer)]
        rows.append({
            "peer": peer.name, "threads": peer.threads, "prefill_tok_s": statistics.median(s["prefill"]),
            "decode_tok_s": statistics.median(s["decode"]), "prefill_samples": s["prefill"],
            "decode_samples": s["decode"], "load": s["load"], "weight_bytes": weight_bytes[id(peer)],
            "decode_ceiling_tok_s": bw[peer.threads] * 1e9 / weight_bytes[id(peer)],
            "agreeing_tokens": agreeing(warm[id(peer)], ref) if ref else None,
        })
    result = {
        "shape": args.shape, "checkpoint": str(checkpoint), "prompt": len(prompt), "new": args.new,
        "rounds": args.rounds, "prompt_ids": prompt, "bandwidth_gbs": bw,
        "bandwidth_runs": {"before": bw_before, "after": bw_after}, "load_start": load_start,
        "load_end": os.getloadavg()[0], "rows": rows, "skipped": skipped,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{args.shape}{'-int8' if args.int8 else ''}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    table = markdown(result)
    stem.with_suffix(".md").write_text(table)
    print("\n" + table + f"written: {stem}.json, {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
