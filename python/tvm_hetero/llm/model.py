"""A built decoder: ``generate`` / ``stream`` token ids (or text), ``report``, ``export``.

Token ids are checked on the host before any kernel runs (type, range, an empty prompt, the cache
capacity), so a bad id is an error naming it, never a read outside the embedding table.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import DecoderConfig
from .entry_graphs import EntryGraph
from .int8_agreement import Agreement
from .sampling import Sampler
from .session import GenerationSession, checked_prompt


class LanguageModel:
    """Entry graphs of one decoder (a decode graph and prefill chunk graphs) sharing one set of weights."""

    def __init__(self, cfg: DecoderConfig, capacity: int, graphs: Sequence[EntryGraph], weight_bytes: int,
                 tokenizer_file: Path | None = None, source: str = "", weights: str = "float32"):
        self.config = cfg
        #: Tokens the KV cache holds: prompt plus generated tokens (less the last) must fit.
        self.capacity = capacity
        self.graphs = sorted(graphs, key=lambda g: g.size)
        self.weight_bytes = weight_bytes
        #: How the matmul weights are stored: "float32" or "int8" (int8_weights.py).
        self.weights = weights
        #: How many float32 matmul weights are stored in 16-column panels (panel_weights.py).
        self.weights_in_panels = 0
        #: For 8-bit weights: how its greedy tokens and logits follow float32 (int8_agreement.py).
        self.agreement: Agreement | None = None
        self.tokenizer_file = tokenizer_file
        self.source = source
        self._tokenizer: Any = None
        self._idle: list[GenerationSession] = []  # sessions set up and not in use
        self._made: list[GenerationSession] = []  # every session generate/stream made (for stats)
        self._lock = threading.Lock()
        #: The whole-path check against the host's fp32 graphs (phase_check.py), when the build ran it.
        self.phase_check: dict | None = None
        #: The decode's placement by cost (decode_placement.py), when the build was asked for it.
        self.decode_choice: dict | None = None
        #: The CPU name and features the host kernels were compiled for (this_cpu.py; None: any CPU
        #: of the architecture).
        self.compiled_for: dict | None = None

    @property
    def prefill_chunks(self) -> tuple[int, ...]:
        return tuple(g.size for g in self.graphs if g.phase == "prefill")

    def session(self) -> GenerationSession:
        """A new generation session (its own KV cache and frames; the weights are shared)."""
        return GenerationSession(self.config, self.capacity, self.graphs)

    # ---- generation --------------------------------------------------------------------------
    def stream(self, prompt_ids: Iterable[int], max_new_tokens: int = 32, *, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               stop_tokens: Iterable[int] | None = None) -> Iterator[int]:
        """Yield up to ``max_new_tokens`` new token ids, the first after the prompt's prefill.

        Greedy unless ``temperature`` > 0 (then ``top_k``, ``top_p`` and ``seed`` apply). Generation
        ends after a stop token (yielded), by default the checkpoint's end-of-sequence ids. The
        arguments are checked now, before the first token is asked for.
        """
        ids = self.check_prompt(prompt_ids)
        if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        needed = len(ids) + int(max_new_tokens) - 1  # the last new token is never fed back
        if needed > self.capacity:
            raise ValueError(f"a prompt of {len(ids)} tokens and {max_new_tokens} new tokens need {needed} cache rows; "
                             f"the cache capacity is {self.capacity} tokens (build with a larger capacity)")
        sampler = Sampler(temperature, top_k, top_p, seed)
        stops = frozenset(self.config.eos_token_ids if stop_tokens is None else (int(t) for t in stop_tokens))
        return self._generate(ids, int(max_new_tokens), sampler, stops)

    def generate(self, prompt_ids: Iterable[int], max_new_tokens: int = 32, **options: Any) -> list[int]:
        """The new token ids as a list (the keywords of :meth:`stream`)."""
        return list(self.stream(prompt_ids, max_new_tokens, **options))

    def generate_text(self, prompt: str, max_new_tokens: int = 32, **options: Any) -> str:
        """Text in, text out, with the checkpoint's tokenizer.json."""
        tokenizer = self.tokenizer()
        ids = tokenizer.encode(prompt).ids
        return tokenizer.decode(self.generate(ids, max_new_tokens, **options))

    def tokenizer(self) -> Any:
        """The checkpoint's ``tokenizers.Tokenizer``; an error when it had no tokenizer.json."""
        if self._tokenizer is None:
            if self.tokenizer_file is None:
                raise ValueError(f"{self.source or 'this model'}: no tokenizer.json was found with the checkpoint; "
                                 "use token ids (generate) or put tokenizer.json in the checkpoint directory")
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
        return self._tokenizer

    def check_prompt(self, prompt_ids: Iterable[int]) -> np.ndarray:
        """The prompt as int32 ids, each checked against the vocabulary and the capacity."""
        return checked_prompt(prompt_ids, self.config.vocab_size, self.capacity)

    def _generate(self, ids: np.ndarray, max_new_tokens: int, sampler: Sampler,
                  stops: frozenset[int]) -> Iterator[int]:
        session = self._take_session()
        try:
            logits = session.prefill(ids)
            for step in range(max_new_tokens):
                token = sampler(logits)
                yield token
                if token in stops or step == max_new_tokens - 1:
                    return
                logits = session.decode(token)
        finally:
            with self._lock:
                self._idle.append(session)

    def _take_session(self) -> GenerationSession:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        session = self.session()
        with self._lock:
            self._made.append(session)
        return session

    def stats(self) -> dict:
        """What ``generate``/``stream`` ran, summed over their sessions (:meth:`GenerationSession.stats`):
        graph calls per phase, accelerator graph executions in all and per call (per prefill chunk
        of each size, per decode token), KV cache bytes written."""
        with self._lock:
            made = list(self._made)
        template = self._zero_stats()
        for session in made:
            one = session.stats()
            template["kv_cache_bytes_written"] += one["kv_cache_bytes_written"]
            template["accelerator_graph_executions"] += one["accelerator_graph_executions"]
            for phase in ("prefill", "decode"):
                for key in ("calls", "accelerator_graph_executions"):
                    template[phase][key] += one[phase][key]
        return template

    def _zero_stats(self) -> dict:
        """Zero counts in the shape of :meth:`GenerationSession.stats`, with each graph's executions per call."""
        per_call = {g.size: g.accelerator_executions for g in self.graphs}
        return {"kv_cache_bytes_written": 0, "accelerator_graph_executions": 0,
                "prefill": {"calls": 0, "accelerator_graph_executions": 0,
                            "per_call": {s: n for s, n in per_call.items() if s > 1}},
                "decode": {"calls": 0, "accelerator_graph_executions": 0, "per_call": {1: per_call.get(1, 0)}}}

    # ---- description and files ----------------------------------------------------------------
    def report(self) -> str:
        """Buckets, graphs, where each phase runs, and the bytes of weights, KV cache and each graph."""
        from .report import describe

        return describe(self)

    def export(self, path: str | os.PathLike) -> Path:
        """One directory: every entry graph and kernel library, one params.bin, a checked manifest."""
        from .export import export

        return export(self, Path(path))
