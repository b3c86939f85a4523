"""Generative decoders (Llama, Qwen2, GPT-2) on tvm-hetero: static chunk graphs, one set of
weights, a KV cache written in place (docs/llm.md).

``lm = tvm_hetero.llm.build(path_or_module, targets)``, then ``lm.generate(prompt_ids,
max_new_tokens=N)``, ``lm.stream(...)``, ``lm.report()``, ``lm.export(dir)`` and
``tvm_hetero.llm.load(dir)``.
"""

from __future__ import annotations

from .builder import build, load
from .config import DecoderConfig
from .model import LanguageModel
from .session import GenerationSession

__all__ = ["DecoderConfig", "GenerationSession", "LanguageModel", "build", "load"]
