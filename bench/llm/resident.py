"""Memory and time to first token of an exported tvm_hetero.llm model, in a fresh process.

    PYTHONPATH=python python bench/llm/resident.py --shape smollm2-135m --weights int8 [--threads 1]

Builds the checkpoint (checkpoints.py) once per weight format and exports it under the bench cache,
then a child process imports tvm_hetero, loads the export and reports its resident set (VmRSS)
at each point: after the import (the baseline), after ``llm.load`` (weights and every graph's
runtime), and after a first generation (which makes a session: its KV cache and frames). Then the
time to first token of a 200-token prompt (median of --rounds, with the load average), and the
bytes each part should take: the weights, the KV cache, and each graph's planned activations.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checkpoints


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def exported(shape: str, weights: str) -> Path:
    """The export of ``shape`` with ``weights``, made once (its build report kept beside it)."""
    out = checkpoints.CACHE / "exports" / f"{shape}-{weights}"
    if not (out / "manifest.json").exists():
        from tvm_hetero import llm

        lm = llm.build(str(checkpoints.make(shape)), capacity=512, weights=weights)
        lm.export(out)
        (out / "report.txt").write_text(lm.report())
    return out


def child(path: Path, threads: int, rounds: int, prompt_len: int) -> dict:
    """What the child process measures (see the module docstring)."""
    import numpy as np

    base = rss_bytes()
    from tvm_hetero import llm

    imported = rss_bytes()
    lm = llm.load(path, device_options=[{"cores": list(range(threads)), "num_threads": threads}])
    loaded = rss_bytes()
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, lm.config.vocab_size, prompt_len)]
    lm.generate(prompt, max_new_tokens=4, stop_tokens=())
    generated = rss_bytes()
    ttft, loads = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        next(iter(lm.stream(prompt, max_new_tokens=1, stop_tokens=())))
        ttft.append(time.perf_counter() - start)
        loads.append(os.getloadavg()[0])
    from tvm_hetero.llm.report import kv_cache_bytes

    session = lm.session()  # measured after the resident figures: it is a second session
    return {
        "graph_scratch_bytes": {g.size: g.runtime.scratch_bytes() for g in lm.graphs},
        "session_scratch_bytes": session.scratch_bytes,
        "frames_own_bytes": {size: r.frame.allocated_bytes for size, r in session.runners.items()},
        "weights": lm.weights, "weight_bytes": lm.weight_bytes, "kv_cache_bytes": kv_cache_bytes(lm),
        "rss_import": imported - base, "rss_after_load": loaded - imported,
        "rss_after_generate": generated - imported,
        "ttft_s": statistics.median(ttft), "ttft_samples": ttft, "prompt": prompt_len, "threads": threads,
        "load": loads,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="smollm2-135m", choices=list(checkpoints.SHAPES))
    parser.add_argument("--weights", default="int8", choices=["float32", "int8"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.threads, args.rounds, args.prompt)))
        return 0
    path = exported(args.shape, args.weights)
    cmd = [sys.executable, __file__, "--child", str(path), "--threads", str(args.threads), "--rounds",
           str(args.rounds), "--prompt", str(args.prompt)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    mib = 2**20
    print(f"{args.shape} {args.weights}, {args.threads} thread(s): weights {result['weight_bytes'] / mib:.1f} MiB, "
          f"KV cache {result['kv_cache_bytes'] / mib:.1f} MiB; resident after load +{result['rss_after_load'] / mib:.1f} "
          f"MiB, after a generation (its session: KV cache, frames) "
          f"+{result['rss_after_generate'] / mib:.1f} MiB; time to first token ({args.prompt}-token prompt) "
          f"{result['ttft_s'] * 1e3:.0f} ms (median of {args.rounds}; load {min(result['load']):.1f}-"
          f"{max(result['load']):.1f})")
    needs = {int(k): v / mib for k, v in result["graph_scratch_bytes"].items()}
    print(f"intermediate values per graph (MiB): {', '.join(f'{k} rows {v:.2f}' for k, v in sorted(needs.items()))}; "
          f"a session holds one scratch of {result['session_scratch_bytes'] / mib:.2f} MiB for all of them "
          f"(their sum: {sum(needs.values()):.2f}); beside the decode graph's the prefill graphs cost "
          f"{(result['session_scratch_bytes'] / mib - needs[1]):.2f} MiB = "
          f"{100 * (result['session_scratch_bytes'] - result['graph_scratch_bytes']['1']) / result['weight_bytes']:.1f}% "
          f"of the weights")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
