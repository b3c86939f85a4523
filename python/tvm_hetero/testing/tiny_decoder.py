"""A tiny Llama-shaped checkpoint made offline: a ``transformers`` configuration, seeded random
weights, ``save_pretrained`` into a folder of the cache (nothing is downloaded).

The weights are drawn wide (``initializer_range=0.5``) so that greedy choices are no near-ties
between two correct float32 implementations, and the configuration has no end-of-sequence id, so a
generation always runs its full length. The shape is the test suite's (tests/python/test_llm.py):
2 layers, hidden 64, 4 heads / 2 key-value heads, intermediate 128, vocabulary 256.
"""

from __future__ import annotations

from pathlib import Path

from ..cache_dir import cache_root

#: The configuration's sizes (transformers' LlamaConfig names).
SHAPE = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128}
SEED = 0


def tiny_llama_checkpoint(folder: Path | None = None) -> Path:
    """The checkpoint's folder (config.json + model.safetensors), made once: by default
    ``<cache>/checkpoints/tiny-llama-seed0``; a folder already holding both files is used as it is."""
    folder = Path(folder) if folder is not None else cache_root() / "checkpoints" / f"tiny-llama-seed{SEED}"
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    import torch
    import transformers as hf

    hf.utils.logging.disable_progress_bar()  # a tiny file: no progress bar
    config = hf.LlamaConfig(**SHAPE, initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(SEED)
    model = hf.LlamaForCausalLM(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def reference_tokens(checkpoint: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """``transformers``' greedy tokens (fp32, CPU) for ``prompt``: the float reference of a generation."""
    import torch
    import transformers as hf

    hf.utils.logging.disable_progress_bar()
    model = hf.LlamaForCausalLM.from_pretrained(checkpoint).float().eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()
