"""Pipeline throughput on two CPU cores: a real model split into two stages vs the unsplit graph.

    PYTHONPATH=python python bench/pipeline.py [--model squeezenet] [--backend dnnl] [--repeat 3]

Each stage is pinned to its own core (stage 0 on core 0, stage 1 on core 1, one TVM thread each);
the unsplit graph runs in a thread pinned to core 0 with one TVM thread (oneDNN: OMP_NUM_THREADS=1).
All pipelines share the unsplit graph's kernel library, and every pipeline's outputs are checked
bit for bit against the unsplit graph before timing.

Configurations:
- ``unsplit``: the one-device graph (``PipelineArtifact.unsplit()``), one inference at a time.
- ``auto``: ``tvm_hetero.pipeline.auto_split`` (measured per-kernel times on each stage's core).
- ``manual@k``: every block boundary (a cut that exactly one tensor crosses) whose prefix holds
  20-80% of the measured kernel time, i.e. the cuts a person would try; the best is reported.

Other processes skew this (the kernel's autogroup scheduling gives this process one share of the
CPUs however many threads it runs): before each run the bench waits up to ``--max-wait`` s for a
second in which other processes use under ``--quiet`` cores, and it reports the cores they used
during every run. Configurations are measured round-robin ``--repeat`` times; figures are
medians of the quiet runs (other processes under ``--quiet`` cores during the run), or of all
runs where a configuration had none. Throughput is steady state: outputs after ``--warmup``
divided by the time from the ``--warmup``-th output to the last. ``ideal`` is the sum over the
max of the stage busy times per inference that the pipeline itself reports.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="squeezenet", help="a light ONNX model (tvm_hetero.testing.models)")
    parser.add_argument("--backend", default="none", choices=["none", "dnnl"])
    parser.add_argument("--inferences", type=int, default=0, help="timed outputs per run (0: ~3 s worth)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="profile runs per core for auto_split")
    parser.add_argument("--max-manual", type=int, default=8, help="most manual split points tried")
    parser.add_argument("--quiet", type=float, default=0.25, help="wait until others use < this many cores")
    parser.add_argument("--max-wait", type=float, default=30.0, help="most seconds to wait before a run")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # oneDNN's OpenMP, read once at load
    os.environ["TVM_NUM_THREADS"] = "1"

    import numpy as np
    from tvm_hetero import pipeline
    from tvm_hetero.testing import models

    if len(os.sched_getaffinity(0)) < 2:
        print("needs two CPU cores", file=sys.stderr)
        return 1
    options = {"stages": [{"cores": [0], "num_threads": 1}, {"cores": [1], "num_threads": 1}]}
    backends = [] if args.backend == "none" else [args.backend]
    model = models.light_model(args.model)
    mod = models.relax_module(model)
    (input_name,) = [i.name for i in model.graph.input]
    sample = models.model_inputs(model)[input_name]

    start = time.perf_counter()
    plan = pipeline.auto_split(mod, 2, "llvm", options=options, rounds=args.rounds, backends=backends)
    auto_seconds = time.perf_counter() - start
    auto = pipeline.build(mod, "llvm", plan, options=options)
    unsplit = auto.unsplit().create()
    cuts = manual_candidates(plan, args.max_manual)
    configs: dict[str, pipeline.PipelineArtifact] = {"auto": auto}
    for k in cuts:
        if k != plan.split_points[0]:
            configs[f"manual@{k}"] = pipeline.build(mod, "llvm", plan.with_split_points([k]), options=options)
        else:
            configs[f"manual@{k}"] = auto

    per_inference = unsplit_time(unsplit, input_name, sample)
    count = args.inferences or max(8, int(3.0 / per_inference))
    rng = np.random.default_rng(0)
    batch = [
        {input_name: rng.standard_normal(sample.shape).astype(sample.dtype)}
        for _ in range(count + args.warmup)
    ]
    # Every pipeline lives until the end: oneDNN regions cache reordered weights by address, so a
    # runtime freed and another created could meet stale weights (a known issue of the oneDNN backend).
    pipes = {name: art.create() for name, art in configs.items()}
    check_bit_identical(pipes, unsplit, batch[:3], input_name)

    load = os.getloadavg()[0]
    print(
        f"model {args.model} ({'TVM kernels' if not backends else 'TVM + ' + args.backend}), "
        f"{len(plan.kernels)} kernels; auto_split took {auto_seconds:.1f} s; {count} timed inferences "
        f"per run, {args.repeat} runs each; load average {load:.2f} on {os.cpu_count()} cores"
    )
    print(plan.describe())
    throughput: dict[str, list[float]] = {name: [] for name in ["unsplit", *configs]}
    others: dict[str, list[float]] = {name: [] for name in throughput}
    ideal: dict[str, list[float]] = {name: [] for name in configs}
    stage_ms: dict[str, list[list[float]]] = {name: [] for name in configs}
    waited = 0.0
    for _ in range(args.repeat):
        for name, rates in throughput.items():
            waited += wait_until_quiet(args.quiet, args.max_wait)
            with OtherProcesses() as background:
                if name == "unsplit":
                    rate = run_unsplit(unsplit, batch, input_name, args.warmup)
                else:
                    rate, busy = run_pipeline(pipes[name], batch, args.warmup)
                    ideal[name].append(sum(busy) / max(busy))
                    stage_ms[name].append([b * 1e3 for b in busy])
            rates.append(rate)
            others[name].append(background.cores)
    print(f"waited {waited:.0f} s in all for quiet moments; load average after: {os.getloadavg()[0]:.2f}")

    def quiet(name: str, values: list) -> list:
        """The runs of ``name`` during which other processes stayed under --quiet, else all of them."""
        kept = [v for v, o in zip(values, others[name]) if o < args.quiet]
        return kept or values

    def quiet_runs(name: str) -> int:
        return sum(o < args.quiet for o in others[name])

    rate = {name: statistics.median(quiet(name, values)) for name, values in throughput.items()}
    base = rate["unsplit"]
    header = f"{'config':<12} {'split':>6} {'inf/s':>7} {'vs unsplit':>10} {'ideal':>6} {'stage ms':>16}"
    print(f"\n{header}  quiet  runs: inf/s (cores used by other processes)")
    print(
        f"{'unsplit':<12} {'-':>6} {base:7.2f} {1.0:9.2f}x {'':>23}  {quiet_runs('unsplit'):>2}"
        f"/{args.repeat}  {runs(throughput, others, 'unsplit')}"
    )
    for name, art in configs.items():
        stages = [statistics.median(s[i] for s in quiet(name, stage_ms[name])) for i in range(2)]
        print(
            f"{name:<12} {art.split['split_points'][0]:>6} {rate[name]:7.2f} {rate[name] / base:9.2f}x "
            f"{statistics.median(quiet(name, ideal[name])):5.2f}x {stages[0]:7.1f} / {stages[1]:6.1f}  "
            f"{quiet_runs(name):>2}/{args.repeat}  {runs(throughput, others, name)}"
        )
    best = max((n for n in configs if n.startswith("manual@")), key=rate.get)
    print(
        f"\nauto-split {rate['auto'] / base:.2f}x the unsplit graph (target >= 1.7x; ideal "
        f"{statistics.median(quiet('auto', ideal['auto'])):.2f}x); auto / best manual ({best}) = "
        f"{rate['auto'] / rate[best]:.3f} (target >= 0.90)"
    )
    loaded = [n for n in ("unsplit", "auto", best) if not quiet_runs(n)]
    if loaded:
        print(f"NOT COMPARABLE: {', '.join(loaded)} had no quiet run; rerun when the machine is idle")
    for pipe in pipes.values():
        pipe.close()
    return 0


def runs(throughput: dict, others: dict, name: str) -> str:
    return " ".join(f"{r:.2f} ({o:.2f})" for r, o in zip(throughput[name], others[name]))


def busy_jiffies() -> tuple[int, int]:
    """(all CPUs' non-idle jiffies, this process's jiffies)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(values) - values[3] - values[4], int(fields[11]) + int(fields[12])


class OtherProcesses:
    """Cores that other processes kept busy, on average, while the block ran."""

    def __enter__(self):
        self.start, self.t0 = busy_jiffies(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        (total, own), seconds = busy_jiffies(), time.perf_counter() - self.t0
        ticks = os.sysconf("SC_CLK_TCK")
        self.cores = max(0.0, ((total - self.start[0]) - (own - self.start[1])) / ticks / seconds)


def wait_until_quiet(threshold: float, max_wait: float) -> float:
    """Wait (up to ``max_wait`` s) for a second in which other processes use under ``threshold`` cores."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait:
        with OtherProcesses() as background:
            time.sleep(1.0)
        if background.cores < threshold:
            break
    return time.perf_counter() - start


def manual_candidates(plan, limit: int) -> list[int]:
    """Block boundaries (one tensor crosses) inside 20-80% of the measured time, nearest the middle first."""
    costs = plan.costs_us[0]
    total = sum(costs)
    candidates = []
    for k in range(1, len(plan.kernels)):
        share = sum(costs[:k]) / total
        if len(plan.crossing(k)) == 1 and 0.2 <= share <= 0.8:
            candidates.append((abs(share - 0.5), k))
    return sorted(k for _, k in sorted(candidates)[:limit])


def unsplit_time(runtime, input_name: str, sample) -> float:
    from tvm_hetero.runtime.measure import run_in_thread

    def once() -> float:
        runtime.set_input(input_name, sample)
        runtime.run()
        start = time.perf_counter()
        runtime.run()
        return time.perf_counter() - start

    return run_in_thread(once, [0], 1)


def run_unsplit(runtime, batch, input_name: str, warmup: int) -> float:
    """Inferences per second of the unsplit graph on core 0, one thread (inputs in, outputs out)."""
    from tvm_hetero.runtime.measure import run_in_thread

    def loop() -> list[float]:
        stamps = []
        for inputs in batch:
            runtime.set_input(input_name, inputs[input_name])
            runtime.run()
            runtime.get_output(0).numpy()
            stamps.append(time.perf_counter())
        return stamps

    stamps = run_in_thread(loop, [0], 1)
    return (len(stamps) - warmup) / (stamps[-1] - stamps[warmup - 1])


def run_pipeline(pipe, batch, warmup: int) -> tuple[float, list[float]]:
    """Steady-state inferences per second, and each stage's busy seconds per inference."""
    before = pipe.stats()["stages"]
    stamps = []
    for inputs in batch:
        while not pipe.run(inputs, block=False):
            pipe.get_output()
            stamps.append(time.perf_counter())
    while len(stamps) < len(batch):
        pipe.get_output()
        stamps.append(time.perf_counter())
    after = pipe.stats()["stages"]
    busy = [(b["busy_s"] - a["busy_s"]) / (b["inferences"] - a["inferences"]) for a, b in zip(before, after)]
    return (len(stamps) - warmup) / (stamps[-1] - stamps[warmup - 1]), busy


def check_bit_identical(pipes, unsplit, batch, input_name: str) -> None:
    for name, pipe in pipes.items():
        outputs = pipe.run_batch(batch)
        for inputs, got in zip(batch, outputs):
            unsplit.set_input(input_name, inputs[input_name])
            unsplit.run()
            if unsplit.get_output(0).numpy().tobytes() != got[0].tobytes():
                raise AssertionError(f"{name}: pipeline output differs from the unsplit graph")


if __name__ == "__main__":
    sys.exit(main())
