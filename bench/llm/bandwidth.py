"""The machine's limit for decoding: read bandwidth with 1 and 2 threads, measured in one run.

    python bench/llm/bandwidth.py [--threads 1,2] [--mib 512] [--passes 5]

A decoder's step reads every weight once for one token, so bandwidth / weight bytes bounds its
tokens per second. The reader is a small C loop (read_bandwidth.c) compiled here with the system
compiler at -O3 -march=native: it has no interpreter or GIL in the way and uses the machine's widest
vector loads, as the peers' kernels do; numpy's reductions would add their own summation scheme.
Each thread sums its own buffer (512 MiB by default, far past the caches' tens of MiB). Thread counts alternate
pass by pass, so the machine's load hits each alike; the figure kept is the best pass (the least
disturbed by other processes on a shared machine), the median is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = Path.home() / ".cache" / "tvm-hetero" / "llm-bench" / "read_bandwidth"


def reader() -> Path:
    """The compiled reader (built again when the source is newer)."""
    src = HERE / "read_bandwidth.c"
    if not BUILD.exists() or BUILD.stat().st_mtime < src.stat().st_mtime:
        BUILD.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([os.environ.get("CC", "cc"), "-O3", "-march=native", "-pthread", str(src), "-o", str(BUILD)],
                       check=True)
    return BUILD


def measure(threads: list[int], mib: int = 512, passes: int = 5) -> dict[int, dict[str, float]]:
    """Per thread count: best and median GB/s over ``passes`` alternating passes."""
    exe = reader()
    samples: dict[int, list[float]] = {t: [] for t in threads}
    for _ in range(passes):
        for t in threads:
            out = subprocess.run([str(exe), str(t), str(mib), "2"], check=True, capture_output=True, text=True)
            samples[t].append(float(out.stdout.split()[-1]))  # the second pass: the first warms the TLB
    return {t: {"best_gbs": max(s), "median_gbs": statistics.median(s)} for t, s in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--mib", type=int, default=512, help="buffer per thread")
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    result = measure([int(t) for t in args.threads.split(",")], args.mib, args.passes)
    for t, r in result.items():
        print(f"{t} thread(s): {r['best_gbs']:.1f} GB/s best, {r['median_gbs']:.1f} median")
    print(f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
