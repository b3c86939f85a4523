"""Float32 weights in 16-column panels against (in, out) rows, our own decoder, side by side.

    PYTHONPATH=python python bench/llm/weight_layout.py [--shape smollm2-135m] [--threads 1] [--rounds 7]

Builds the checkpoint twice in one process (``TVM_HETERO_LLM_WEIGHT_PANELS=0`` for rows; panels is
the default, llm/panel_weights.py), then alternates the two: each round prefills the same 128-token
prompt and decodes 64 tokens with each. Prints each round's figures with the load, the round-by-round
median ratios (panels / rows) and whether the tokens are identical.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checkpoints


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m", choices=list(checkpoints.SHAPES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    from tvm_hetero import llm
    from tvm_hetero.llm.panel_weights import SWITCH

    checkpoint = checkpoints.make(args.shape)
    options = [{"cores": list(range(args.threads)), "num_threads": args.threads}]
    models = {}
    for layout, switch in (("rows", "0"), ("panels", "1")):
        os.environ[SWITCH] = switch
        models[layout] = llm.build(str(checkpoint), capacity=512, device_options=options)
    os.environ.pop(SWITCH)
    prompt = list(range(5, 5 + args.prompt))
    figures = {layout: {"prefill": [], "decode": []} for layout in models}
    tokens = {}
    for round_ in range(args.rounds):
        for layout, lm in models.items():
            time.sleep(0.5)
            start = time.perf_counter()
            stream = lm.stream(prompt, max_new_tokens=args.new)
            out = [next(stream)]
            first = time.perf_counter()
            out += list(stream)
            end = time.perf_counter()
            figures[layout]["prefill"].append(args.prompt / (first - start))
            figures[layout]["decode"].append((args.new - 1) / (end - first))
            tokens[layout] = out
        now = {layout: f"{f['prefill'][-1]:.0f} / {f['decode'][-1]:.1f}" for layout, f in figures.items()}
        print(f"round {round_}: load {os.getloadavg()[0]:.2f}, prefill / decode tok/s {now}", flush=True)
    print(f"tokens identical: {tokens['rows'] == tokens['panels']}")
    for phase in ("prefill", "decode"):
        ratios = [p / r for p, r in zip(figures["panels"][phase], figures["rows"][phase])]
        print(f"{phase}: rows {statistics.median(figures['rows'][phase]):.1f}, panels "
              f"{statistics.median(figures['panels'][phase]):.1f} tok/s; panels / rows, round-by-round median "
              f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
