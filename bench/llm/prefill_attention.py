"""Prefill with the chunk attention kernel (llm/chunk_attention.py) against the masked form, interleaved.

    PYTHONPATH=python python bench/llm/prefill_attention.py [--capacity 512] [--prompt 128] [--rounds 11] [--threads 1]

Builds the SmolLM2-135M-shaped checkpoint twice in one process (TVM_HETERO_LLM_CHUNK_ATTENTION=1,
then 0), its threads pinned to the first cores, prints each build's report (the graphs' activations), the
largest logit difference of one prompt, and the prefill tokens per second of each, round by round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from checkpoints import make  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    from tvm_hetero import llm
    from tvm_hetero.llm import chunk_attention

    path = make("smollm2-135m")
    models = {}
    for form, switch in (("kernel", "1"), ("masked", "0")):
        os.environ[chunk_attention.SWITCH] = switch
        models[form] = llm.build(path, capacity=args.capacity, device_options=[
            {"cores": list(range(args.threads)), "num_threads": args.threads}])
        print(f"{form}:\n{models[form].report()}", flush=True)
    prompt = np.random.default_rng(0).integers(0, models["kernel"].config.vocab_size, args.prompt)
    sessions = {form: lm.session() for form, lm in models.items()}
    logits = {form: s.prefill(prompt).copy() for form, s in sessions.items()}
    print(f"largest logit difference {np.abs(logits['kernel'] - logits['masked']).max():.3g}")
    rates: dict[str, list[float]] = {form: [] for form in models}
    for _ in range(args.rounds):
        for form, session in sessions.items():
            start = time.perf_counter()
            session.prefill(prompt)
            rates[form].append(args.prompt / (time.perf_counter() - start))
    for form, samples in rates.items():
        print(f"{form}: median {statistics.median(samples):.1f} tok/s, rounds {[round(r) for r in samples]}")
    ratio = statistics.median(rates["kernel"]) / statistics.median(rates["masked"])
    print(f"kernel / masked: {ratio:.2f}x; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
