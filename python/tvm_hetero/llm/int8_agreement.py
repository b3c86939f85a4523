"""How closely an 8-bit model follows the float32 model it was made from: greedy tokens and logits.

On one prompt (seeded random ids), the float32 model generates greedily; the 8-bit model is fed the
same tokens (teacher forcing), and at every step its top token is compared with the float32 one and
its logits with the float32 logits. Its own greedy run is also compared, token by token, to find
where the two generations first part. ``llm.build(..., weights="int8")`` measures this once, and
``report()`` and the export's manifest carry it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: Tokens of the prompt the comparison starts from.
PROMPT_TOKENS = 16


@dataclass(frozen=True)
class Agreement:
    """The comparison's result; errors are absolute, ``max_logit`` gives their scale."""

    #: Generated tokens compared.
    tokens: int
    #: Steps at which the 8-bit model's top token is the float32 model's (teacher forcing).
    agree: int
    #: Leading tokens of the 8-bit model's own greedy run equal to the float32 run's.
    identical_prefix: int
    #: Largest |logit difference| over every compared step, and the largest |float32 logit|.
    max_logit_error: float
    max_logit: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Agreement:
        return cls(**data)

    def describe(self) -> str:
        return (f"greedy tokens against float32: {self.agree}/{self.tokens} agree (teacher forcing), "
                f"identical for the first {self.identical_prefix}; largest logit error "
                f"{self.max_logit_error:.3g} (largest logit {self.max_logit:.3g})")


def measure_agreement(quantized: Any, reference: Any, tokens: int, seed: int = 0) -> Agreement:
    """Compare two :class:`.LanguageModel` of one checkpoint over ``tokens`` greedy tokens (fewer
    when the capacity is smaller)."""
    vocab = reference.config.vocab_size
    prompt_len = min(PROMPT_TOKENS, max(1, reference.capacity // 2))
    tokens = min(tokens, reference.capacity - prompt_len + 1)
    prompt = np.random.default_rng(seed).integers(0, vocab, prompt_len)
    ref, q = reference.session(), quantized.session()
    ref_logits, q_logits = _row(ref.prefill(prompt)), _row(q.prefill(prompt))
    chosen, agree, error, scale = [], 0, 0.0, 0.0
    for step in range(tokens):
        token = int(np.argmax(ref_logits))
        chosen.append(token)
        agree += int(np.argmax(q_logits)) == token
        error = max(error, float(np.abs(q_logits - ref_logits).max()))
        scale = max(scale, float(np.abs(ref_logits).max()))
        if step + 1 < tokens:
            ref_logits, q_logits = _row(ref.decode(token)), _row(q.decode(token))
    own = quantized.generate(prompt, tokens, stop_tokens=())
    prefix = next((i for i, (a, b) in enumerate(zip(own, chosen)) if a != b), min(len(own), len(chosen)))
    return Agreement(tokens, agree, prefix, error, scale)


def _row(logits: np.ndarray) -> np.ndarray:
    return np.array(logits, dtype=np.float32).reshape(-1)
