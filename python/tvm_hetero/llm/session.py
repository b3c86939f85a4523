"""One generation's state and the loop step: a KV cache and, per entry graph, a frame with every
input and output bound once to preallocated tensors.

After :class:`GenerationSession` is set up, a step writes the chunk's token ids, positions and
logit row into the bound tensors, runs the frame and appends the new key/value rows to the cache:
no tensor is allocated per token. Several sessions of one model run at the same time (each owns
its frames and cache; the weights are shared).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import tvm

from .buckets import plan_chunks
from .config import DecoderConfig
from .entry_graphs import EntryGraph
from .graph_io import (
    CACHE_MASK,
    CHUNK_MASK,
    LOGIT_ROW,
    MASKED,
    POSITIONS,
    TOKENS,
    key_cache,
    new_key_output,
    new_value_output,
    value_cache,
)
from .kv_cache import KVCache, host_tensor
from .packed_outputs import packed_layout, packed_size


def checked_prompt(prompt_ids: Iterable[int], vocab_size: int, capacity: int) -> np.ndarray:
    """The prompt as int32 ids, each checked against the vocabulary and the capacity."""
    if isinstance(prompt_ids, (str, bytes)):
        raise TypeError("prompt_ids: expected token ids (use generate_text for text)")
    ids = np.asarray(list(prompt_ids) if not isinstance(prompt_ids, np.ndarray) else prompt_ids)
    if ids.ndim != 1:
        raise ValueError(f"prompt_ids: expected a flat sequence of token ids, got shape {list(ids.shape)}")
    if ids.size == 0:
        raise ValueError("prompt_ids: the prompt is empty (at least one token is needed)")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"prompt_ids: token ids must be integers, got {ids.dtype}")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        raise ValueError(f"prompt_ids: token id {int(ids[bad[0]])} at position {int(bad[0])} is outside the "
                         f"vocabulary [0, {vocab_size})")
    if ids.size > capacity:
        raise ValueError(f"prompt_ids: a prompt of {ids.size} tokens exceeds the cache capacity of "
                         f"{capacity} tokens")
    return ids.astype(np.int32)


class ChunkRunner:
    """One entry graph's frame with its inputs and outputs bound (zero copy) to this session."""

    def __init__(self, graph: EntryGraph, cfg: DecoderConfig, cache: KVCache,
                 logits: tuple[tvm.runtime.Tensor, np.ndarray], scratch: tvm.runtime.Tensor):
        n, device = graph.size, cache.mask.device
        self.size = n
        self.capacity = cache.capacity
        self.frame = graph.runtime.frame(scratch)
        self.tokens_tensor, self.tokens = host_tensor((1, n), "int32", device)
        self.positions_tensor, self.positions = host_tensor((n,), "int32", device)
        self.row_tensor, self.logit_row = host_tensor((1,), "int32", device)
        self.chunk_mask_tensor, chunk_mask = host_tensor((n, n), "float32", device)
        chunk_mask[...] = np.triu(np.full((n, n), MASKED, np.float32), k=1)
        self.offsets = np.arange(n, dtype=np.int32)
        bound = {TOKENS: self.tokens_tensor, POSITIONS: self.positions_tensor,
                 LOGIT_ROW: self.row_tensor, CACHE_MASK: cache.mask,
                 CHUNK_MASK: self.chunk_mask_tensor}
        for layer, (keys, values) in enumerate(cache.tensors):
            bound[key_cache(layer)] = keys
            bound[value_cache(layer)] = values
        for name, tensor in bound.items():
            self.frame.set_input(name, tensor, copy=False)
        self._new_tensors = []  # kept alive: the frame writes into them
        self.new_rows: list[tuple[np.ndarray, np.ndarray]] = []
        if graph.packed:  # one output: views of it (packed_outputs.py)
            packed, flat = host_tensor((1, packed_size(cfg, n)), "float32", device)
            self.frame.bind_output(0, packed)
            self._new_tensors.append(packed)
            views = [flat[0, offset:offset + int(np.prod(shape))].reshape(shape)
                     for offset, shape in packed_layout(cfg, n)]
            #: The logits of this graph's last run (a view).
            self.logits = views[0][0, 0]
            self.new_rows = [(views[1 + 2 * layer], views[2 + 2 * layer]) for layer in range(cfg.num_layers)]
            return
        self.frame.bind_output(0, logits[0])
        self.logits = logits[1][0, 0]
        for layer in range(cfg.num_layers):
            keys, key_view = host_tensor((1, cfg.num_kv_heads, cfg.head_dim, n), "float32", device)
            values, value_view = host_tensor((1, cfg.num_kv_heads, n, cfg.head_dim), "float32", device)
            self.frame.bind_output(new_key_output(layer), keys)
            self.frame.bind_output(new_value_output(layer), values)
            self._new_tensors += [keys, values]
            self.new_rows.append((key_view, value_view))

    def run(self, token_ids: np.ndarray, cache: KVCache) -> None:
        """Process ``token_ids`` (1..size ids, already checked) at the cache's filled position."""
        count = len(token_ids)
        self.tokens[0, :count] = token_ids
        self.tokens[0, count:] = 0
        np.add(self.offsets, cache.filled, out=self.positions)
        np.minimum(self.positions, self.capacity - 1, out=self.positions)  # padding rows stay in the tables
        self.logit_row[0] = count - 1
        self.frame.run()
        cache.append(self.new_rows, count)


class GenerationSession:
    """A KV cache and a bound frame per entry graph: prefill a prompt, then decode token by token."""

    def __init__(self, cfg: DecoderConfig, capacity: int, graphs: Sequence[EntryGraph]):
        self.cfg = cfg
        device = graphs[0].devices[0]
        self.cache = KVCache(cfg, capacity, device)
        self._logits = host_tensor((1, 1, cfg.vocab_size), "float32", device)
        # One graph runs at a time, so the graphs' intermediate values share one scratch: the
        # session holds the largest graph's, not their sum.
        self.scratch_bytes = max(g.runtime.scratch_bytes(device) for g in graphs)
        self._scratch = tvm.runtime.empty((max(self.scratch_bytes, 1),), "uint8", device)
        self.runners = {g.size: ChunkRunner(g, cfg, self.cache, self._logits, self._scratch) for g in graphs}
        #: The logits of the last processed row (a view, overwritten by a later step).
        self.logits = self.runners[1].logits
        self.sizes = tuple(sorted(self.runners))
        #: Graph calls made, by chunk size.
        self.calls = dict.fromkeys(self.sizes, 0)
        #: Accelerator graph executions per call, by chunk size (0: the graph runs on the host alone).
        self.executions_per_call = {g.size: g.accelerator_executions for g in graphs}

    def stats(self) -> dict:
        """Calls per phase, the accelerator graph executions they made, and the bytes written into the
        KV cache (new rows only) since the session began."""
        out: dict = {"kv_cache_bytes_written": self.cache.bytes_written}
        for phase, sizes in (("prefill", [s for s in self.sizes if s > 1]), ("decode", [1])):
            calls = sum(self.calls.get(s, 0) for s in sizes)
            out[phase] = {"calls": calls,
                          "accelerator_graph_executions": sum(self.calls.get(s, 0) * self.executions_per_call.get(s, 0)
                                                              for s in sizes),
                          "per_call": {s: self.executions_per_call.get(s, 0) for s in sizes}}
        out["accelerator_graph_executions"] = (out["prefill"]["accelerator_graph_executions"]
                                               + out["decode"]["accelerator_graph_executions"])
        return out

    def prefill(self, token_ids: Iterable[int]) -> np.ndarray:
        """Start over with ``token_ids`` (checked: :func:`checked_prompt`) in chunks; the last row's logits."""
        token_ids = checked_prompt(token_ids, self.cfg.vocab_size, self.cache.capacity)
        self.cache.reset()
        start = 0
        for size, rows in plan_chunks(len(token_ids), self.sizes):
            runner = self.runners[size]
            runner.run(token_ids[start:start + rows], self.cache)
            self.calls[size] += 1
            start += rows
        self.logits = runner.logits
        return self.logits

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token; its logits. The decode graph's inputs are written directly (one row, no
        padding); the id and the room left are checked first."""
        if not 0 <= token_id < self.cfg.vocab_size:
            raise ValueError(f"decode: token id {token_id} is outside the vocabulary [0, {self.cfg.vocab_size})")
        if self.cache.filled >= self.cache.capacity:
            raise ValueError(f"decode: the cache is full ({self.cache.capacity} tokens, its capacity)")
        runner = self.runners[1]
        runner.tokens[0, 0] = token_id
        runner.positions[0] = self.cache.filled
        runner.logit_row[0] = 0
        runner.frame.run()
        self.cache.append(runner.new_rows, 1)
        self.calls[1] += 1
        self.logits = runner.logits
        return self.logits
