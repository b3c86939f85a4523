"""The `transformers` peer: the Hugging Face model in eager PyTorch, greedy, with its KV cache.

fp32 as saved; the 8-bit line is PyTorch's dynamic int8 quantization of every Linear (weights int8
per tensor, activations quantized per call), the stock 8-bit path of eager PyTorch on a CPU.
The thread count is ``torch.set_num_threads``, set at each call since peers with other counts run
in between.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path


class TransformersPeer:
    """``stream(prompt_ids, n)`` yields ``n`` greedy token ids; the first after the prompt's pass."""

    def __init__(self, path: Path, threads: int, int8: bool = False):
        import torch
        from transformers import AutoModelForCausalLM

        self.name = "transformers" + (" dynamic-int8" if int8 else "")
        self.threads = threads
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
        if int8:
            from torch.ao.quantization import quantize_dynamic

            with warnings.catch_warnings():  # quantized tensors are deprecated upstream, still the stock path
                warnings.simplefilter("ignore")
                model = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        self.model = model

    def weight_bytes(self) -> int:
        """Bytes one decode step reads: every matrix once (a tied embedding once, as the output)."""
        import torch

        seen, total = set(), 0
        for module in self.model.modules():
            tensors = list(module.parameters(recurse=False))
            if callable(getattr(module, "weight", None)):  # dynamic int8: one byte per weight (+ the fp32 bias)
                tensors += [module.weight()] + ([module.bias()] if module.bias() is not None else [])
            for t in tensors:
                key = t.data_ptr() if not t.is_quantized else (id(module), t.dtype)  # weight() makes a new one
                if key in seen or isinstance(module, torch.nn.Embedding):
                    continue  # the lookup reads one row; a tied output matrix is counted at lm_head
                seen.add(key)
                total += t.numel() * t.element_size()
        return total

    def stream(self, prompt_ids: list[int], n: int) -> Iterator[int]:
        import torch

        torch.set_num_threads(self.threads)
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids], dtype=torch.long)
            out = self.model(input_ids=ids, use_cache=True)
            for i in range(n):
                token = int(out.logits[0, -1].argmax())
                yield token
                if i + 1 < n:
                    out = self.model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values,
                                     use_cache=True)
