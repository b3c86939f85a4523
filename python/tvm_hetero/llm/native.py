"""The C++ generation loop (src/llm/, no Python per token) on an exported directory.

``NativeGenerator(directory)`` loads a directory written by ``LanguageModel.export`` (format
``tvm-hetero-llm/1``) through ``libtvm_hetero``: the checksums are verified, this CPU is checked
against the export's ``compiled_for`` record before any library is loaded, and the weights are loaded
once in C++. ``generate`` returns the new token ids, ``stream`` yields them as they are chosen.
Greedy tokens equal the Python loop's; sampled tokens come from the C++ generator (SplitMix64,
``include/tvm_hetero/llm/sampler.h``), reproducible by seed but not the Python loop's draws.
"""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import tvm_ffi


@dataclass(frozen=True)
class GenerationTimes:
    """Where the last generation's time went (measured in C++)."""

    prompt_tokens: int
    prefill_seconds: float
    decode_steps: int
    decode_seconds: float

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds > 0 else 0.0


def plan_chunks(length: int, sizes: Iterable[int]) -> list[tuple[int, int]]:
    """The C++ chunk plan (include/tvm_hetero/llm/chunk_plan.h): ``[(chunk size, real rows), ...]``."""
    plan = tvm_ffi.get_global_func("tvm_hetero.llm.plan_chunks")(int(length), [int(s) for s in sizes])
    return [(int(size), int(rows)) for size, rows in plan]


class NativeGenerator:
    """An exported language model run by the C++ loop; one session per thread, made on demand."""

    def __init__(self, directory: str | os.PathLike, num_threads: int | None = None):
        """``num_threads``: the threads every graph's kernels run on (None: the runtime's defaults)."""
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
        self.directory = os.fspath(directory)
        self._model = tvm_ffi.get_global_func("tvm_hetero.llm.load")(self.directory, num_threads or 0, None)
        self.vocab_size = int(self._model["vocab_size"]())
        self.capacity = int(self._model["capacity"]())
        self.chunk_sizes = tuple(int(s) for s in self._model["chunk_sizes"]())
        self.eos_token_ids = tuple(int(t) for t in self._model["eos_token_ids"]())
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        #: The timings of the last generation that finished (any thread).
        self.last_times: GenerationTimes | None = None

    def generate(self, prompt_ids: Iterable[int], max_new_tokens: int = 32, **options: Any) -> list[int]:
        """The new token ids (keywords: temperature, top_k, top_p, seed, stop_tokens)."""
        return list(self.stream(prompt_ids, max_new_tokens, **options))

    def stream(self, prompt_ids: Iterable[int], max_new_tokens: int = 32, *, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               stop_tokens: Iterable[int] | None = None) -> Iterator[int]:
        """Yield up to ``max_new_tokens`` new ids; the prompt and options are checked (and the prompt
        prefilled) now, before the first token is asked for. Stops after a stop token (yielded), by
        default the model's end-of-sequence ids."""
        prompt = _token_ids(prompt_ids, "prompt_ids")
        stops = None if stop_tokens is None else _token_ids(stop_tokens, "stop_tokens")
        max_new = operator.index(max_new_tokens)
        session = self._take_session()
        try:
            session["start"](prompt, max_new, float(temperature or 0.0), int(top_k or 0),
                             1.0 if top_p is None else float(top_p), seed, stops)
        except BaseException:
            self._give_back(session)
            raise
        return self._tokens(session)

    def _tokens(self, session: Any) -> Iterator[int]:
        try:
            while (token := int(session["next"]())) >= 0:
                yield token
            prompt_tokens, prefill_seconds, decode_steps, decode_seconds = (float(v) for v in session["times"]())
            self.last_times = GenerationTimes(int(prompt_tokens), prefill_seconds, int(decode_steps), decode_seconds)
        finally:
            self._give_back(session)

    def _take_session(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._model["new_session"]()

    def _give_back(self, session: Any) -> None:
        with self._lock:
            self._idle.append(session)


def _token_ids(ids: Iterable[int], what: str) -> list[int]:
    """Integers (numpy's included) as a list; text and other types are refused naming ``what``."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{what}: expected token ids, got text")
    out = []
    for position, token in enumerate(ids):
        try:
            out.append(operator.index(token))
        except TypeError:
            raise TypeError(f"{what}: token ids must be integers, got {token!r} at position {position}") from None
    return out
