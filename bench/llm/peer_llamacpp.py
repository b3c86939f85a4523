"""The llama.cpp peer through llama-cpp-python: the checkpoint as a GGUF file (gguf_export.py), F32 or
Q8_0 for the 8-bit line, greedy, driven with token ids.

``n_threads`` (decode) and ``n_threads_batch`` (the prompt) are both the thread count; the whole
prompt is one batch (``n_batch`` = ``n_ubatch`` = the context). Each call
starts from an empty cache (``reset``), so the prompt is evaluated every time rather than found in
llama-cpp-python's prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gguf_export import export


def gguf_file(checkpoint: Path, q8: bool) -> Path:
    """The GGUF file of ``checkpoint`` (F32 or Q8_0), written once."""
    path = checkpoint / "peers" / f"llama-{'q8_0' if q8 else 'f32'}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        export(checkpoint, path.with_suffix(".tmp"), q8).rename(path)
    return path


def load(path: Path, threads: int, n_ctx: int, logits_all: bool = False):
    """A context with an fp32 KV cache, as the other peers keep (llama.cpp's default f16 cache alone
    moves the logits by ~1e-3 of their range; its traffic is a few MB against hundreds of weights)."""
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                           n_threads_batch=threads, type_k=llama_cpp.GGML_TYPE_F32,
                           type_v=llama_cpp.GGML_TYPE_F32, logits_all=logits_all, verbose=False)


class LlamaCppPeer:
    """``stream(prompt_ids, n)`` yields ``n`` greedy token ids; the first after the prompt's pass."""

    def __init__(self, checkpoint: Path, threads: int, int8: bool = False, n_ctx: int = 512):
        self.name = "llama.cpp " + ("Q8_0" if int8 else "F32")
        self.threads = threads
        self.path = gguf_file(checkpoint, int8)
        self.llm = load(self.path, threads, n_ctx)

    def weight_bytes(self) -> int:
        """Bytes one decode step reads: every tensor, the embedding table only when it is the output."""
        from gguf import GGUFReader

        tensors = {t.name: int(t.n_bytes) for t in GGUFReader(self.path).tensors}
        if "output.weight" in tensors:
            del tensors["token_embd.weight"]
        return sum(tensors.values())

    def stream(self, prompt_ids: list[int], n: int) -> Iterator[int]:
        self.llm.reset()
        tokens = self.llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                   reset=True)
        for _ in range(n):
            yield int(next(tokens))
