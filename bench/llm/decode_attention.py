"""The decode step's attention kernel alone (llm/one_row_attention.py), SmolLM2-135M's shape: 3 key/value
heads of 9 query heads, head dim 64, capacity 2048, at given positions.

Two settings: "one cache" calls the kernel on the same tensors again and again (TVM's time_evaluator,
the cache stays in L1/L2), "30 caches" calls it once per layer's cache of 30, as a decode step
does (at position 1024 the 30 caches' filled rows are 45 MB, past the 32 MB L3; per call it
includes the Python call, about 1 us). With ``--compare FILE``, a file defining
``decode_attention(kv_heads, group, head_dim, capacity)`` the same way (for instance the kernel of
an earlier commit: ``git show REV:python/tvm_hetero/llm/one_row_attention.py > old.py``), both run
interleaved in rounds; medians per call and their ratio are printed with the load average.

    python bench/llm/decode_attention.py [--positions 128,1024] [--rounds 7] [--compare old.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time

import numpy as np
import tvm
from tvm_hetero.llm import one_row_attention
from tvm_hetero.llm.this_cpu import this_cpu

KV_HEADS, GROUP, HEAD_DIM, CAPACITY, LAYERS = 3, 3, 64, 2048, 30


def compiled(module) -> tuple[tvm.runtime.Module, tuple[int, ...]]:
    """The module's kernel built for this CPU, and the shape of its scratch (its last parameter)."""
    kernel = module.decode_attention(KV_HEADS, GROUP, HEAD_DIM, CAPACITY)
    module = tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")})
    lib = tvm.compile(module, target=this_cpu()).mod
    return lib, tuple(int(n) for n in kernel.params[-1].shape)


def from_file(path: str):
    spec = importlib.util.spec_from_file_location("compared_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer_inputs(position: int, rng: np.random.Generator) -> list[tvm.runtime.Tensor]:
    """One layer's inputs: query, caches, own row, position, mask (rows below the position open), output."""
    mask = np.full((1, 1, 1, CAPACITY), -1e30, np.float32)
    mask[..., :position] = 0.0
    arrays = [rng.standard_normal(shape, dtype=np.float32) for shape in (
        (1, KV_HEADS, GROUP, HEAD_DIM), (1, KV_HEADS, HEAD_DIM, CAPACITY), (1, KV_HEADS, CAPACITY, HEAD_DIM),
        (1, KV_HEADS, HEAD_DIM, 1), (1, KV_HEADS, 1, HEAD_DIM))]
    arrays += [np.int32([position]), mask, np.zeros((1, KV_HEADS, GROUP, HEAD_DIM), np.float32)]
    return [tvm.runtime.tensor(a) for a in arrays]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", default="128,1024")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compare", help="a file with another decode_attention to run against")
    args = parser.parse_args()
    kernels = {"this": compiled(one_row_attention)}
    if args.compare:
        kernels["compared"] = compiled(from_file(args.compare))
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()}")
    for position in (int(p) for p in args.positions.split(",")):
        layers = [layer_inputs(position, rng) for _ in range(LAYERS)]
        scratch = {name: tvm.runtime.tensor(np.zeros(shape, np.float32))
                   for name, (_, shape) in kernels.items()}
        one, many = ({name: [] for name in kernels} for _ in range(2))
        for _ in range(args.rounds):
            for name, (lib, _) in kernels.items():
                calls = max(20, 20000 // (position + 50))
                timer = lib.time_evaluator("main", tvm.cpu(), number=calls, repeat=5)
                one[name].append(statistics.median(timer(*layers[0], scratch[name]).results))
                fn = lib["main"]
                for inputs in layers:  # warm-up: the calls after the first
                    fn(*inputs, scratch[name])
                start = time.perf_counter()
                for _ in range(10):
                    for inputs in layers:
                        fn(*inputs, scratch[name])
                many[name].append((time.perf_counter() - start) / (10 * LAYERS))
        for setting, results in (("one cache", one), ("30 caches", many)):
            medians = {name: statistics.median(times) * 1e6 for name, times in results.items()}
            line = ", ".join(f"{name} {us:.2f} us" for name, us in medians.items())
            if "compared" in medians:
                line += f", compared/this {medians['compared'] / medians['this']:.2f}x"
            print(f"position {position}, {setting}: {line}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
