"""Sweep every ONNX node test case through the Relax VM and through tvm_hetero.build.

    PYTHONPATH=python python bench/onnx_node_sweep.py [--jobs 2] [--match conv] [--json out.json]

Prints how many cases the Relax VM passes, how many of those ours passes with all ops on device 0
and with a seeded random two-device split, and every case the VM passes but ours fails, with the
reason. The harness is :mod:`tvm_hetero.testing.onnx_node_cases`.

Cases run in worker processes (``--jobs`` of them) so that a crash or a hang in one case costs
that case only: each worker logs the stage it starts before running it, and the parent records a
worker that dies (or is silent for ``--hang-s`` seconds, then killed) as a failure of that stage
and starts a new worker on the remaining cases.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tvm_hetero.testing.onnx_node_cases import (
    FAILED,
    CaseOutcome,
    CaseResult,
    SweepSummary,
    iter_cases,
    random_placement,
    run_case_ours,
    run_case_vm,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--match", default="", help="only cases whose name contains this")
    parser.add_argument("--hang-s", type=float, default=300.0, help="kill a worker silent this long")
    parser.add_argument("--json", help="also write every outcome to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # file of case names, one a line
    parser.add_argument("--log", help=argparse.SUPPRESS)  # where a worker writes its JSON lines
    args = parser.parse_args()
    if args.worker:
        run_worker(Path(args.worker).read_text().split(), Path(args.log))
        return

    start = time.perf_counter()
    names = [c.name for c in iter_cases() if args.match in c.name]
    print(f"{len(names)} cases, {args.jobs} workers", flush=True)
    outcomes = run_parallel(names, args.jobs, args.hang_s)
    summary = SweepSummary(sorted(outcomes, key=lambda o: o.name))
    print(summary)
    print(f"sweep took {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps([o.to_dict() for o in summary.outcomes], indent=1))


# ---- worker: run cases, log each stage before and after ----------------------------------------
def run_worker(names: list[str], log_file: Path) -> None:
    """Write a JSON line to ``log_file`` as each stage starts, with the case's outcome so far.

    (Not to stdout: the ONNX frontend prints there.)
    """
    with open(log_file, "w", buffering=1) as out:

        def log(stage: str, outcome: CaseOutcome) -> None:
            out.write(json.dumps({"start": stage, "outcome": outcome.to_dict()}) + "\n")
            out.flush()

        for case in iter_cases(names):
            log("vm", CaseOutcome(case.name, CaseResult(case.name, "running")))
            outcome = CaseOutcome(case.name, run_case_vm(case))
            if outcome.vm.passed:
                log("device0", outcome)
                outcome.device0 = run_case_ours(case, None)
                log("random_split", outcome)
                outcome.random_split = run_case_ours(case, random_placement(case.name))
            log("done", outcome)


# ---- parent: keep `jobs` workers busy, survive crashes and hangs --------------------------------
class Worker:
    """One worker process on a list of cases, read line by line."""

    def __init__(self, names: list[str], tmp: Path, index: int) -> None:
        self.names = names
        self.list_file = tmp / f"names_{index}.txt"
        self.list_file.write_text("\n".join(names))
        self.log_file = tmp / f"log_{index}.jsonl"
        self.log_file.touch()
        env = dict(os.environ, TVM_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(self.list_file), "--log", str(self.log_file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.read_pos = 0
        self.last_progress = time.monotonic()
        self.current: tuple[str, CaseOutcome] | None = None  # stage being run, outcome so far
        self.done: list[CaseOutcome] = []

    def poll(self) -> None:
        """Read new log lines."""
        with open(self.log_file) as f:
            f.seek(self.read_pos)
            while True:
                line = f.readline()
                if not line.endswith("\n"):
                    break
                self.read_pos = f.tell()
                self.last_progress = time.monotonic()
                record = json.loads(line)
                outcome = CaseOutcome.from_dict(record["outcome"])
                if record["start"] == "done":
                    self.done.append(outcome)
                    self.current = None
                else:
                    self.current = (record["start"], outcome)

    def lost_case(self, why: str) -> CaseOutcome | None:
        """The outcome of the case the worker was on when it died: that stage failed."""
        if self.current is None:
            return None
        stage, outcome = self.current
        setattr(outcome, stage, CaseResult(outcome.name, FAILED, f"{stage}: {why}"))
        return outcome

    def remaining(self, lost: CaseOutcome | None) -> list[str]:
        finished = {o.name for o in self.done} | ({lost.name} if lost else set())
        return [n for n in self.names if n not in finished]


def run_parallel(names: list[str], jobs: int, hang_s: float) -> list[CaseOutcome]:
    outcomes: list[CaseOutcome] = []
    chunks = [names[i::jobs] for i in range(jobs)]
    spawned = 0
    with tempfile.TemporaryDirectory(prefix="onnx_node_sweep_") as tmp_dir:
        tmp = Path(tmp_dir)
        workers = []
        for chunk in chunks:
            if chunk:
                workers.append(Worker(chunk, tmp, spawned))
                spawned += 1
        reported = 0
        while workers:
            time.sleep(0.5)
            for worker in list(workers):
                worker.poll()
                code = worker.proc.poll()
                hung = code is None and time.monotonic() - worker.last_progress > hang_s
                if hung:
                    worker.proc.kill()
                    worker.proc.wait()
                if code is None and not hung:
                    continue
                worker.poll()
                why = (
                    f"worker hung over {hang_s:.0f} s, killed"
                    if hung
                    else f"worker crashed (exit code {code})"
                )
                lost = worker.lost_case(why) if (hung or code != 0) else None
                outcomes.extend(worker.done)
                if lost:
                    outcomes.append(lost)
                    print(f"  {lost.name}: {why}", flush=True)
                workers.remove(worker)
                rest = worker.remaining(lost)
                if rest:
                    workers.append(Worker(rest, tmp, spawned))
                    spawned += 1
            done = len(outcomes) + sum(len(w.done) for w in workers)
            if done - reported >= 100:
                reported = done
                print(f"  {done}/{len(names)} cases done", flush=True)
    return outcomes


if __name__ == "__main__":
    main()
