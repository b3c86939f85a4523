"""Two sessions on two devices at once: one prefills prompts on the HTP (emulated, its executor pinned to
core 1), the other decodes on the CPU (core 0); against the same two jobs run one after the other.

    PYTHONPATH=python python bench/llm/two_sessions.py [--rounds 5] [--prompts 4] [--unpinned]

The model is the demo's tiny Llama checkpoint (testing/tiny_decoder.py) with prefill on the CPU and the
HTP and decode on the CPU. The decode job is sized so that alone it takes about as long as the prefill
job alone (both measured first), so two devices at once can at best halve the time: the figure is
serial / concurrent (target at least 1.5), median of interleaved rounds, with the load average. The
concurrent run's results are checked against the serial run's (the same logits and tokens). Times
are the emulator's, never an NPU's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import tvm  # noqa: E402

from tvm_hetero import llm  # noqa: E402
from tvm_hetero.testing.tiny_decoder import tiny_llama_checkpoint  # noqa: E402

HOST = (tvm.cpu(0), "llvm")
CAPACITY, CHUNK = 64, 16


def prefill_job(session, prompts):
    return [session.prefill(p).copy() for p in prompts]


def decode_job(session, prefix, steps):
    """``steps`` tokens after the session's first ``len(prefix)`` rows (prefilled once, before timing)."""
    session.cache.truncate(len(prefix))
    logits, tokens = session.prefix_logits, []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits)))
        logits = session.decode(tokens[-1])
    return tokens


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def concurrently(jobs):
    """Run each (fn, args) on its own thread, released together; (seconds, results)."""
    barrier, results = threading.Barrier(len(jobs) + 1), [None] * len(jobs)

    def worker(i, fn, args):
        barrier.wait()
        results[i] = fn(*args)

    threads = [threading.Thread(target=worker, args=(i, fn, args)) for i, (fn, args) in enumerate(jobs)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--unpinned", action="store_true", help="no executor pinned (the emulator takes both cores)")
    args = parser.parse_args()
    pinned = [{"cores": [0], "num_threads": 1}, {"cores": [1], "num_threads": 1}]
    lm = llm.build(str(tiny_llama_checkpoint()), {"prefill": [HOST, "qnn-htp"], "decode": [HOST]}, capacity=CAPACITY,
                   prefill_chunks=(CHUNK,), device_options=None if args.unpinned else {"prefill": pinned, "decode": pinned[:1]})
    vocab = lm.config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, vocab, CHUNK)] for _ in range(args.prompts)]
    start = [int(t) for t in rng.integers(0, vocab, 4)]
    a, b = lm.session(), lm.session()
    prefill_job(a, prompts)  # warm-up
    b.prefix_logits = b.prefill(start).copy()  # the decode job's prompt, on the HTP once
    one_prefill_set = min(timed(prefill_job, a, prompts)[0] for _ in range(2))
    one_step = min(timed(decode_job, b, start, 16)[0] for _ in range(3)) / 16
    steps = max(1, min(CAPACITY - len(start) - 1, int(one_prefill_set / one_step)))
    repeats = max(1, round(one_prefill_set / (steps * one_step)))  # decode jobs to match the prefill job

    def decode_all(session):
        return [decode_job(session, start, steps) for _ in range(repeats)]

    serial_times, concurrent_times = [], []
    reference = (prefill_job(a, prompts), decode_all(b))
    same = True
    for _ in range(args.rounds):  # interleaved
        t_prefill, _ = timed(prefill_job, a, prompts)
        t_decode, _ = timed(decode_all, b)
        serial_times.append(t_prefill + t_decode)
        seconds, (logits, tokens) = concurrently([(prefill_job, (a, prompts)), (decode_all, (b,))])
        concurrent_times.append(seconds)
        same &= all(np.array_equal(x, y) for x, y in zip(logits, reference[0])) and tokens == reference[1]
    serial, concurrent = statistics.median(serial_times), statistics.median(concurrent_times)
    print(f"prefill job: {args.prompts} prompts of {CHUNK} tokens on the HTP (emulated, core 1), "
          f"{one_prefill_set * 1e3:.0f} ms alone; decode job: {repeats} x {steps} steps on the CPU (core 0), "
          f"{one_step * 1e3:.3f} ms per step")
    print(f"serial {serial * 1e3:.0f} ms, concurrent {concurrent * 1e3:.0f} ms: {serial / concurrent:.2f}x "
          f"(median of {args.rounds} interleaved rounds; target 1.5x); results as serial: {same}; "
          f"load {os.getloadavg()[0]:.1f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
