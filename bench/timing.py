"""Timing shared by the benchmarks: the median of single runs after one warm-up run."""

from __future__ import annotations

import statistics
import time


def median_run_seconds(runtime, repeat: int) -> float:
    """Seconds of ``runtime.run()``: one warm-up call, then the median of ``repeat`` timed calls."""
    runtime.run()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        runtime.run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
