"""Frames: several requests on one compiled model, and inputs/outputs bound without copies.

    PYTHONPATH=python python bench/frames.py [--model resnet50] [--rounds 5] [--inferences 8]

1. Throughput. The light ResNet-50 (ONNX's light model, seeded random weights) built once for
   cpu:0 (oneDNN regions where available, as by default). ``one thread``: one frame on one thread;
   ``two frames``: two threads, each with its own frame of the same runtime, running at the same
   time; ``two runtimes``: two threads, each with its own runtime (the way before frames). Every thread keeps TVM's and OpenMP's pools at one thread (TVM_NUM_THREADS=1,
   OMP_NUM_THREADS=1), so one thread uses one core. Rounds alternate the two configurations
   (interleaved, so machine load hits both alike); per round each thread runs ``--inferences``
   inferences; the ratio is two-thread throughput / one-thread throughput per round, median. The
   process's CPU seconds per wall second (the cores it got from a shared machine) are recorded too,
   and throughput per core obtained: near equal for one and two threads means the frames scale with
   the cores they get, whatever other processes take.
2. Memory for N frames: the runtime's pool (weights and one set of activations, its default
   frame) once, and each extra frame's own allocation (activations only: parameter slots are shared);
   then the process's resident-set growth for N frames against N runtimes, each run once.
3. Bytes copied per inference on a 1x3x1024x1024 model (y = relu(x) + 1): ``numpy`` -- set_input
   from a numpy array, get_output(0).numpy(); ``tensor`` -- set_input from a TVM tensor (copy=True),
   get_output(0, out); ``bound`` -- set_input(copy=False) and bind_output once, then run only. Bytes
   counted: the runtime's own count (io_bytes_copied) plus the conversions Python makes (numpy to a
   tensor, a tensor to numpy), and the median time per inference of each, interleaved.
"""

from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import statistics
import threading
import time

import numpy as np


def rss_bytes() -> int:
    """Resident set after collecting garbage and handing freed heap back to the system."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def throughput(artifact, rt, inputs: dict, rounds: int, inferences: int) -> dict[str, list[float]]:
    """Per round, interleaved: inferences/s of one thread, of two threads with a frame each, and of
    two threads with a runtime each (the way before frames; weights twice)."""
    other = artifact.create()
    runners = {"frames": [rt.frame(), rt.frame()], "runtimes": [rt, other]}
    for pair in runners.values():
        for r in pair:
            r.set_input(**inputs)
            r.run()  # warm-up: first calls prepare the backends' call sites

    def serve(runner, barrier) -> None:
        barrier.wait()
        for _ in range(inferences):
            runner.run()

    def timed(pair, num_threads: int) -> tuple[float, float]:
        """(inferences per second, cores this process got: its CPU seconds per second)."""
        barrier = threading.Barrier(num_threads + 1)
        threads = [threading.Thread(target=serve, args=(pair[t], barrier)) for t in range(num_threads)]
        for t in threads:
            t.start()
        barrier.wait()
        start, cpu_start = time.perf_counter(), time.process_time()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        return num_threads * inferences / wall, (time.process_time() - cpu_start) / wall

    rates: dict[str, list[float]] = {"one thread": [], "two frames": [], "two runtimes": []}
    cores: dict[str, list[float]] = {name: [] for name in rates}
    for r in range(rounds):
        for name, pair, num_threads in (("one thread", runners["frames"], 1), ("two frames", runners["frames"], 2),
                                        ("two runtimes", runners["runtimes"], 2)):
            rate, used = timed(pair, num_threads)
            rates[name].append(rate)
            cores[name].append(used)
        print(f"  round {r}: " + ", ".join(f"{k} {v[-1]:.2f} inf/s on {cores[k][-1]:.2f} cores" for k, v in rates.items())
              + f" (load {load_average()})", flush=True)
    # Throughput per core obtained: what scaling gives when the other processes leave a share free.
    for name, used in cores.items():
        rates[name + " per core"] = [rate / c for rate, c in zip(rates[name], used)]
    return rates


def memory(artifact, rt, inputs: dict, input_names, counts=(1, 2)) -> None:
    """Memory of N frames against N runtimes: allocation counted by the runtime, and the resident
    set's growth once each has run (a backend may keep per-call-site data, e.g. oneDNN's reordered
    weights, made on the first run)."""
    pool = sum(rt.stats()["storage_bytes"])
    probe = rt.frame()
    per_frame = probe.allocated_bytes
    del probe
    params = sum(rt.get_input(i).numpy().nbytes for i in range(rt.get_num_inputs())
                 if rt.get_input_name(i) not in input_names)
    print(f"runtime pool (weights + the default frame's activations): {pool / 2**20:.1f} MiB")
    print(f"  of which parameters: {params / 2**20:.1f} MiB; each extra frame allocates {per_frame / 2**20:.1f} MiB")
    for n in counts:
        for what, make in (("frame", rt.frame), ("runtime", artifact.create)):
            before = rss_bytes()
            made = [make() for _ in range(n)]
            for one in made:
                one.set_input(**inputs)
                one.run()
            del one  # the loop variable would keep the last one alive into the next measurement
            grew = rss_bytes() - before
            print(f"  {n} {what}(s), each run once: resident set grew {grew / 2**20:.1f} MiB "
                  f"({grew / n / 2**20:.1f} MiB each)", flush=True)
            del made


def copies(rounds: int) -> None:
    import tvm
    import tvm_hetero
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Big:
        @R.function
        def main(x: R.Tensor((1, 3, 1024, 1024), "float32")):
            with R.dataflow():
                y = R.add(R.nn.relu(x), R.const(1.0, "float32"))
                R.output(y)
            return y

    rt = tvm_hetero.build(Big, [("cpu:0", "llvm")]).create()
    nbytes = 3 * 1024 * 1024 * 4
    x = np.random.default_rng(0).standard_normal((1, 3, 1024, 1024)).astype("float32")
    x_tensor = tvm.runtime.tensor(x)
    out = tvm.runtime.empty((1, 3, 1024, 1024), "float32")
    numpy_frame, tensor_frame, bound_frame = rt.frame(), rt.frame(), rt.frame()
    bound_frame.set_input("x", x_tensor, copy=False)
    bound_frame.bind_output(0, out)

    def numpy_io():
        numpy_frame.set_input("x", x)
        numpy_frame.run()
        return numpy_frame.get_output(0).numpy()

    def tensor_io():
        tensor_frame.set_input("x", x_tensor)
        tensor_frame.run()
        tensor_frame.get_output(0, out)

    def bound_io():
        bound_frame.run()

    configs = {"numpy": numpy_io, "tensor": tensor_io, "bound": bound_io}
    python_copies = {"numpy": 2, "tensor": 0, "bound": 0}  # numpy -> tensor, tensor -> numpy
    times = {name: [] for name in configs}
    counted = {}
    for name, fn in configs.items():
        fn()  # warm-up
    for _ in range(rounds):
        for name, fn in configs.items():
            start = time.perf_counter()
            for _ in range(5):
                fn()
            times[name].append((time.perf_counter() - start) / 5)
    for name, frame in (("numpy", numpy_frame), ("tensor", tensor_frame), ("bound", bound_frame)):
        runs = 1 + 5 * rounds
        counted[name] = frame.io_bytes_copied / runs
    np.testing.assert_allclose(out.numpy(), np.maximum(x, 0) + 1, rtol=1e-6)
    print(f"1x3x1024x1024 float32 input and output ({nbytes / 2**20:.0f} MiB each):")
    for name in configs:
        total = counted[name] + python_copies[name] * nbytes
        print(f"  {name:7s} runtime copied {counted[name] / 2**20:5.1f} MiB, Python {python_copies[name] * nbytes / 2**20:5.1f}"
              f" MiB, total {total / 2**20:5.1f} MiB per inference; {statistics.median(times[name]) * 1e3:6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inferences", type=int, default=8)
    parser.add_argument("--skip", default="", help="comma list of throughput,memory,copies to skip")
    parser.add_argument("--backends", default="default", choices=("default", "none"),
                        help="none: TVM kernels only (no oneDNN regions), e.g. for the memory figures")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"cores {os.cpu_count()}, load average at start {load_average()}")
    if not {"throughput", "memory"} <= skip:
        import tvm_hetero
        from tvm_hetero.testing import models

        model = models.light_model(args.model)
        backends = {} if args.backends == "default" else {"backends": ()}
        artifact = tvm_hetero.build(models.relax_module(model), [("cpu:0", "llvm")], **backends)
        rt = artifact.create()
        inputs = models.model_inputs(model)
        if "memory" not in skip:
            memory(artifact, rt, inputs, set(inputs))
        if "throughput" not in skip:
            rates = throughput(artifact, rt, inputs, args.rounds, args.inferences)
            for per in ("", " per core"):
                one = rates["one thread" + per]
                for name in ("two frames", "two runtimes"):
                    ratios = [two / base for two, base in zip(rates[name + per], one)]
                    print(f"{name} / one thread throughput{per}: median {statistics.median(ratios):.2f} "
                          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
            print(f"load average now {load_average()}")
    if "copies" not in skip:
        copies(args.rounds)


if __name__ == "__main__":
    main()
