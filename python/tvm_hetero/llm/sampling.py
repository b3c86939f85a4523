"""Choosing the next token from the logits: greedy, or sampled with temperature, top-k and top-p.

Greedy (the default, or ``temperature=0``) is ``argmax`` -- the first of equal maxima, as
``transformers`` picks. Sampling is reproducible: the same ``seed`` gives the same tokens.
"""

from __future__ import annotations

import numpy as np


class Sampler:
    """Picks a token id from one row of logits."""

    def __init__(self, temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None):
        if temperature is not None and (not np.isfinite(temperature) or temperature < 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        self.greedy = not temperature
        if self.greedy and (top_k is not None or top_p is not None):
            raise ValueError("top_k and top_p choose among sampled tokens: give a temperature > 0 as well")
        self.temperature = temperature or 1.0
        self.top_k = top_k
        self.top_p = top_p
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / self.temperature
        order = np.argsort(-scaled, kind="stable")
        if self.top_k is not None:
            order = order[: self.top_k]
        probs = np.exp(scaled[order] - scaled[order[0]])
        probs /= probs.sum()
        if self.top_p is not None:  # the smallest prefix whose probability reaches top_p
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return int(order[self.rng.choice(len(order), p=probs)])
