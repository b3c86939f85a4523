"""The onnxruntime-genai peer: its own builder's ONNX model (fp32, or int8 for the 8-bit line),
driven with token ids (``append_tokens``), greedy.

The model is built once per precision with ``python -m onnxruntime_genai.models.builder -p fp32|int8
-e cpu`` into <checkpoint>/peers/. The thread count is the decoder's documented session option
(genai_config.json ``model.decoder.session_options.intra_op_num_threads``), given through
``og.Config.overlay`` so that one built model serves every count; ``check_threads`` confirms that
the count took effect by the worker threads a session adds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def built_model(checkpoint: Path, precision: str) -> Path:
    """The builder's output for ``checkpoint`` at ``precision`` ("fp32" or "int8"), made once."""
    out = checkpoint / "peers" / f"ort-genai-{precision}"
    if not (out / "genai_config.json").exists():
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out),
               "-p", precision, "-e", "cpu", "-c", str(checkpoint / "peers" / "ort-genai-cache")]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)  # its progress bars: only on failure
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return out


def load(model_dir: Path, threads: int):
    import onnxruntime_genai as og

    config = og.Config(str(model_dir))
    options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og.Model(config)


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def check_threads(model_dir: Path) -> dict[int, int]:
    """Threads each session adds to the process, for 1 and 2 intra-op threads (kept alive together,
    so each count is what that session alone added): the pool of N threads adds N - 1 workers."""
    added, keep = {}, []
    for n in (1, 2, 1, 2):  # the first load also starts genai's own threads: keep the second figures
        before = os_threads()
        keep.append(load(model_dir, n))
        added[n] = os_threads() - before
    return added


class OrtGenaiPeer:
    """``stream(prompt_ids, n)`` yields ``n`` greedy token ids; the first after the prompt's pass."""

    def __init__(self, checkpoint: Path, threads: int, int8: bool = False):
        self.precision = "int8" if int8 else "fp32"
        self.name = f"onnxruntime-genai {self.precision}"
        self.threads = threads
        self.model_dir = built_model(checkpoint, self.precision)
        self.model = load(self.model_dir, threads)

    def weight_bytes(self) -> int:
        """Bytes one decode step reads: every initializer but the embedding table (a Gather reads one
        row; the builder keeps a separate lm_head matrix even for tied embeddings)."""
        import onnx

        model = onnx.load(str(self.model_dir / "model.onnx"), load_external_data=False)
        gathered = {n.input[0] for n in model.graph.node if n.op_type in ("Gather", "GatherBlockQuantized")}
        total = 0
        for init in model.graph.initializer:
            if init.name in gathered or init.name.startswith(("cos_cache", "sin_cache")):
                continue  # the RoPE tables are read one row per step too
            external = {e.key: e.value for e in init.external_data}
            total += int(external["length"]) if "length" in external else len(init.raw_data)
        return total

    def stream(self, prompt_ids: list[int], n: int) -> Iterator[int]:
        import onnxruntime_genai as og

        params = og.GeneratorParams(self.model)
        length = len(prompt_ids) + n
        params.set_search_options(do_sample=False, max_length=length, min_length=length)  # no early end-of-text
        generator = og.Generator(self.model, params)
        generator.append_tokens(prompt_ids)
        for _ in range(n):
            generator.generate_next_token()
            yield int(generator.get_next_tokens()[0])
