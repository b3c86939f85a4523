"""The contract between an entry graph (one per chunk size) and the generation loop that runs it.

Written once here; the architecture files build graphs with these inputs and outputs, and the
session (or a C++ loop later) feeds them. For a chunk of ``n`` rows and a cache of capacity ``C``:

inputs (data, set by the loop)
  ``tokens``      int32 [1, n]      the chunk's token ids (padding rows: any valid id, e.g. 0)
  ``positions``   int32 [n]         each row's position (padding rows: clamped to C - 1)
  ``logit_row``   int32 [1]         the row whose logits come out (the chunk's last real row)
  ``cache_mask``  float32 [1,1,1,C] additive: 0 where the cache row is filled, -1e30 elsewhere
  ``chunk_mask``  float32 [n, n]    additive causal mask inside the chunk (0 on and below the diagonal)
  ``cache.{i}.k`` float32 [1, KV, D, C]  layer i's keys, stored transposed (scores need no transpose)
  ``cache.{i}.v`` float32 [1, KV, C, D]  layer i's values
inputs (weights): the checkpoint's tensors by name, in the graphs' layout (family.py), plus
  derived tables (RoPE)
outputs
  0: logits [1, 1, vocab] of ``logit_row``; then per layer i: ``1 + 2i`` new keys [1, KV, D, n]
  and ``2 + 2i`` new values [1, KV, n, D] -- only the chunk's rows, which the loop writes into the
  cache at the chunk's position (rows of padding are never written).
"""

from __future__ import annotations

import numpy as np

from .config import DecoderConfig

TOKENS = "tokens"
POSITIONS = "positions"
LOGIT_ROW = "logit_row"
CACHE_MASK = "cache_mask"
CHUNK_MASK = "chunk_mask"
#: Added to a score to exclude it: finite, so a fully masked cache part stays NaN-free.
MASKED = -1e30


def key_cache(layer: int) -> str:
    return f"cache.{layer}.k"


def value_cache(layer: int) -> str:
    return f"cache.{layer}.v"


def key_cache_shape(cfg: DecoderConfig, capacity: int) -> tuple[int, ...]:
    return (1, cfg.num_kv_heads, cfg.head_dim, capacity)


def value_cache_shape(cfg: DecoderConfig, capacity: int) -> tuple[int, ...]:
    return (1, cfg.num_kv_heads, capacity, cfg.head_dim)


def data_inputs(cfg: DecoderConfig, capacity: int, n: object) -> list[tuple[str, tuple, str]]:
    """(name, shape, dtype) of every non-weight input, in the graph's order; ``n`` may be symbolic."""
    inputs = [
        (TOKENS, (1, n), "int32"),
        (POSITIONS, (n,), "int32"),
        (LOGIT_ROW, (1,), "int32"),
        (CACHE_MASK, (1, 1, 1, capacity), "float32"),
        (CHUNK_MASK, (n, n), "float32"),
    ]
    for layer in range(cfg.num_layers):
        inputs.append((key_cache(layer), key_cache_shape(cfg, capacity), "float32"))
        inputs.append((value_cache(layer), value_cache_shape(cfg, capacity), "float32"))
    return inputs


def new_key_output(layer: int) -> int:
    return 1 + 2 * layer


def new_value_output(layer: int) -> int:
    return 2 + 2 * layer


def chunk_inputs(tokens: np.ndarray, filled: int, capacity: int) -> dict[str, np.ndarray]:
    """The data inputs but the cache of a call of the ``len(tokens)``-row graph after ``filled`` rows:
    the ids, their positions, the last row, the mask over the filled rows and the causal chunk mask."""
    n = len(tokens)
    cache_mask = np.full((1, 1, 1, capacity), MASKED, np.float32)
    cache_mask[..., :filled] = 0.0
    return {TOKENS: np.asarray(tokens, np.int32).reshape(1, n), POSITIONS: (filled + np.arange(n)).astype(np.int32),
            LOGIT_ROW: np.array([n - 1], np.int32), CACHE_MASK: cache_mask,
            CHUNK_MASK: np.triu(np.full((n, n), MASKED, np.float32), k=1)}


def sample_inputs(cfg: DecoderConfig, capacity: int, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Data inputs of a real call of the ``n``-row graph (what an accelerator graph is verified on at
    build): a chunk of random token ids after a random prefix filling about half the cache, its
    positions and masks, and that prefix's cache rows (random, zero beyond it)."""
    rng = np.random.default_rng(seed)
    filled = min(capacity - n, capacity // 2)
    out = chunk_inputs(rng.integers(0, cfg.vocab_size, n), filled, capacity)
    for layer in range(cfg.num_layers):
        keys = np.zeros(key_cache_shape(cfg, capacity), np.float32)
        values = np.zeros(value_cache_shape(cfg, capacity), np.float32)
        keys[..., :filled] = rng.standard_normal(keys[..., :filled].shape)
        values[:, :, :filled] = rng.standard_normal(values[:, :, :filled].shape)
        out[key_cache(layer)], out[value_cache(layer)] = keys, values
    return out
