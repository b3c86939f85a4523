"""The product's entry: ``tvm_hetero.llm`` on the CPU, from the same checkpoint directory.

It is used when ``tvm_hetero.llm`` imports; otherwise ``unavailable()`` says why and the runner
skips it. The interface read here: ``tvm_hetero.llm.build(path, targets, ...)`` returns an object
with ``stream(prompt_ids, max_new_tokens=N)`` (an iterator of token ids: the first token's time is
the prefill) or, failing that, ``generate(prompt_ids, max_new_tokens=N)`` (a list: the prefill is
then timed as a one-token generate and subtracted from an N-token one, ``timed_by_generate``).
The model is built once per precision and exported under <checkpoint>/peers/ (as the other peers'
files are); later runs load that export with the thread count asked for. Optional keywords are
passed only when ``build``'s signature has them:
``device_options=[{"cores": [...], "num_threads": N}]`` for the thread count, ``weights="int8"``
for the 8-bit line.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path


def unavailable(threads: int, int8: bool) -> str | None:
    """Why the entry cannot run with these settings, or None."""
    try:
        from tvm_hetero import llm
    except ImportError as err:
        return f"tvm_hetero.llm does not import ({err})"
    params = inspect.signature(llm.build).parameters
    if int8 and "weights" not in params:
        return "tvm_hetero.llm.build takes no weights= (no 8-bit line)"
    default = int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    if "device_options" not in params and threads != default:
        return f"tvm_hetero.llm.build takes no device_options= (runs TVM's {default} threads only)"
    return None


def fp32_weight_bytes(checkpoint: Path) -> int:
    """Bytes of the checkpoint's fp32 weights one decode step reads (a tied embedding once)."""
    from safetensors import safe_open

    config = json.loads((checkpoint / "config.json").read_text())
    total = 0
    for shard in checkpoint.glob("*.safetensors"):
        with safe_open(shard, "np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                if name == "model.embed_tokens.weight" and not config.get("tie_word_embeddings"):
                    continue  # untied: the lookup reads one row, lm_head is the matrix read
                total += 4 * int(math.prod(f.get_slice(name).get_shape()))
    return total


class TvmHeteroPeer:
    """``stream(prompt_ids, n)`` yields ``n`` greedy token ids; the first after the prompt's pass."""

    def __init__(self, checkpoint: Path, threads: int, int8: bool = False, n_ctx: int = 512):
        import tvm
        from tvm_hetero import llm

        self.name = "tvm-hetero" + (" int8" if int8 else "")
        self.threads = threads
        self.checkpoint = checkpoint
        params = inspect.signature(llm.build).parameters
        kwargs = {"capacity": n_ctx} if "capacity" in params else {}
        if "device_options" in params:
            kwargs["device_options"] = [{"cores": list(range(threads)), "num_threads": threads}]
        if int8:
            kwargs["weights"] = "int8"
        exported = checkpoint / "peers" / f"tvm-hetero-{'int8' if int8 else 'fp32'}"
        if hasattr(llm, "load") and (exported / "manifest.json").exists():  # built once, as the other peers' files
            self.lm = llm.load(exported, **{k: v for k, v in kwargs.items() if k == "device_options"})
        else:
            self.lm = llm.build(str(checkpoint), [(tvm.cpu(0), "llvm")], **kwargs)
            if hasattr(self.lm, "export"):
                self.lm.export(exported)
        if int8 and getattr(self.lm, "agreement", None) is not None:
            print(f"{self.name} x{threads}: {self.lm.agreement.describe()}", flush=True)
        if not hasattr(self.lm, "stream"):
            self.timed = self.timed_by_generate  # the runner uses timed() where a peer has it
        # exactly n tokens, as every peer makes: no stop at an end-of-text token
        generate = getattr(self.lm, "stream", None) or self.lm.generate
        self.no_stop = {"stop_tokens": ()} if "stop_tokens" in inspect.signature(generate).parameters else {}
        self.int8 = int8

    def weight_bytes(self) -> int:
        """fp32: the checkpoint's matrices, counted as for the other peers; int8: the model's own count."""
        own = getattr(self.lm, "weight_bytes", None)
        if self.int8 and own is not None:
            return int(own() if callable(own) else own)
        return fp32_weight_bytes(self.checkpoint)

    def stream(self, prompt_ids: list[int], n: int) -> Iterator[int]:
        for token in self.lm.stream(prompt_ids, max_new_tokens=n, **self.no_stop):
            yield int(token)

    def timed_by_generate(self, prompt_ids: list[int], n: int) -> tuple[list[int], float, float]:
        """Without ``stream``: (tokens, prefill s, decode s) from a one-token generate (the prefill)
        and an n-token one (the prefill again, then n - 1 steps)."""
        start = time.perf_counter()
        self.lm.generate(prompt_ids, max_new_tokens=1, **self.no_stop)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        tokens = [int(t) for t in self.lm.generate(prompt_ids, max_new_tokens=n, **self.no_stop)]
        return tokens, prefill, time.perf_counter() - start - prefill
