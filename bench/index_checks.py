"""What the index checks cost in ``run()``: each model built twice, with and without them, timed interleaved.

Models (both with their indices as the input that varies per request):

- ``embedding``: an ONNX Gather of 128 token ids from a 50,000 x 512 float32 table;
- ``bert``: a small BERT-like encoder through ``from_torch`` (token, position and type embeddings of
  a 30,522-token vocabulary, width 128, two encoder layers, sequence 128).

"Without" builds the same module with the check pass replaced by the identity (for this measurement
only; the product always checks). Runs alternate between the two runtimes in blocks, so both see the
same machine load; the median of each block's mean is reported, with the ratio.

    PYTHONPATH=python python bench/index_checks.py [--blocks 30] [--runs 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import contextmanager
from typing import Any

import numpy as np


def embedding_model() -> tuple[Any, dict[str, np.ndarray]]:
    import onnx
    from onnx import TensorProto, helper
    from tvm_hetero import importers

    table = np.random.default_rng(0).random((50_000, 512), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["out"], name="embed_tokens", axis=0)], "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 128])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 128, 512])],
        [onnx.numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ids = np.random.default_rng(1).integers(0, 50_000, (1, 128))
    return importers.from_onnx(model), {"ids": ids}


def bert_model() -> tuple[Any, dict[str, np.ndarray]]:
    import torch
    from tvm_hetero import importers

    torch.manual_seed(0)
    vocab, width, length = 30_522, 128, 128

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = torch.nn.Embedding(vocab, width)
            self.positions = torch.nn.Embedding(512, width)
            self.types = torch.nn.Embedding(2, width)
            self.norm = torch.nn.LayerNorm(width)
            self.layers = torch.nn.ModuleList(
                torch.nn.ModuleDict({"qkv": torch.nn.Linear(width, 3 * width), "out": torch.nn.Linear(width, width),
                                     "up": torch.nn.Linear(width, 4 * width), "down": torch.nn.Linear(4 * width, width),
                                     "n1": torch.nn.LayerNorm(width), "n2": torch.nn.LayerNorm(width)})
                for _ in range(2))

        def forward(self, ids: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
            x = self.norm(self.tokens(ids) + self.positions(torch.arange(length)) + self.types(types))
            for layer in self.layers:
                q, k, v = layer["qkv"](x).chunk(3, dim=-1)
                attention = torch.softmax(q @ k.transpose(-1, -2) / width**0.5, dim=-1) @ v
                x = layer["n1"](x + layer["out"](attention))
                x = layer["n2"](x + layer["down"](torch.nn.functional.gelu(layer["up"](x))))
            return x

    example = (torch.zeros(1, length, dtype=torch.int64), torch.zeros(1, length, dtype=torch.int64))
    mod = importers.from_torch(Encoder().eval(), example)
    rng = np.random.default_rng(2)
    return mod, {"ids": rng.integers(0, vocab, (1, length)), "types": rng.integers(0, 2, (1, length))}


@contextmanager
def checks_disabled():
    """The check pass as the identity, for the "without" build only."""
    from tvm_hetero.compiler import lower

    original = lower.insert_index_checks
    lower.insert_index_checks = lambda mod, *args, **kwargs: (mod, {})
    try:
        yield
    finally:
        lower.insert_index_checks = original


def runtime_for(mod: Any, inputs: dict[str, np.ndarray]) -> tuple[Any, int]:
    import tvm_hetero

    artifact = tvm_hetero.build(mod, ["cpu"])
    rt = artifact.create()
    for name, value in zip(artifact.input_names, inputs.values()):
        rt.set_input(name, value)
    checks = sum(n.get("attrs", {}).get("func_name", "").startswith("_tvm_hetero_check_indices")
                 for n in json.loads(artifact.graph_json)["nodes"])
    return rt, checks


def block_mean(rt: Any, runs: int) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        rt.run()
    return (time.perf_counter() - start) / runs


def measure(name: str, build: Any, blocks: int, runs: int) -> dict:
    mod, inputs = build()
    checked, checks = runtime_for(mod, inputs)
    with checks_disabled():
        plain, none = runtime_for(mod, inputs)
    assert none == 0 and checks > 0, (checks, none)
    for rt in (checked, plain):
        block_mean(rt, runs)  # warm up
    with_checks, without = [], []
    for _ in range(blocks):
        with_checks.append(block_mean(checked, runs))
        without.append(block_mean(plain, runs))
    a, b = statistics.median(with_checks), statistics.median(without)
    same = np.array_equal(checked.get_output(0).numpy(), plain.get_output(0).numpy())
    return {"model": name, "check_kernels": checks, "with_us": a * 1e6, "without_us": b * 1e6,
            "ratio": a / b, "outputs_identical": bool(same)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="TVM_NUM_THREADS for the kernels")
    parser.add_argument("--models", nargs="+", default=["embedding", "bert"])
    args = parser.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    builders = {"embedding": embedding_model, "bert": bert_model}
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for name in args.models:
        row = measure(name, builders[name], args.blocks, args.runs)
        print(json.dumps(row))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
