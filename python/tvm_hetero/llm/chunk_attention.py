"""The attention of a prefill chunk (n rows) as one kernel that reads only the cache's filled rows.

The chunk graphs' masked form (blocks.cache_attention) scores every query row against all C cache
rows and keeps n x (C + n) scores per head. Here the filled length f = clamp(positions[0], 0, C) is
read at run time, and chunk row i of query head (h, g) attends to

    cache rows j < f:   s = q · keys[:, j] + cache_mask[j]
    own rows  j <= i:   s = q · new_keys[:, j]                (causal; j > i is left out)
    out = softmax(s) · [values[0:f]; new_values[0:i+1]]        (max subtracted)

How the loops run. A key/value head's G x n query rows (query head g of its group, chunk row i) are
taken ROWS at a time, as the one-row kernel (one_row_attention.py) takes query heads: each cache row
is loaded once per pass and multiplied into every row's accumulators; keys are stored [D, C], so the
lanes of the score loop run over BLOCK positions, values [C, D], so those of the weighted sum run over
D. The softmax uses the one-row kernel's vectorized exponential. Only one pass's scores are kept
(ROWS x (C + n) floats, reused by the next pass), not the n x (C + n) of the masked form.

Guarantee: for every query row, the result equals the masked attention over the whole cache and the
chunk's causally masked rows whenever the cache rows at and beyond ``positions[0]`` are masked (the
session's invariant), up to float32 rounding (the exponential is within 1 ulp; sums run in another
order); every row's output is finite when its inputs are (padded rows of a last chunk included); it
reads no cache row at or beyond the clamped position and nothing outside any tensor, whatever
``positions`` holds.
"""

from __future__ import annotations

import os

from tvm import tirx
from tvm.script import tirx as T

from .one_row_attention import BLOCK, LANES, ROWS, below, exp_nonpositive, span


#: Set to "0", the host's chunk graphs keep the masked form (for comparison).
SWITCH = "TVM_HETERO_LLM_CHUNK_ATTENTION"


def wanted() -> bool:
    """Whether the host's chunk graphs use this kernel (not switched off by :data:`SWITCH`)."""
    return os.environ.get(SWITCH, "1") != "0"


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def scratch_shape(capacity: int, rows: int) -> tuple[int, int]:
    """The kernel's scores scratch: one pass's rows, the cache's scores (whole blocks) then the own rows'."""
    return ROWS, _round_up(capacity, BLOCK) + _round_up(rows, BLOCK)


def chunk_attention(kv_heads: int, group: int, head_dim: int, capacity: int, rows: int) -> tirx.PrimFunc:
    """The kernel for a chunk of ``rows`` rows: q [1, n, KV·G, D] (scaled), keys [1, KV, D, C], values
    [1, KV, C, D], the chunk's keys [1, KV, D, n] and values [1, KV, n, D], positions [n] (the first
    is the number of filled cache rows), cache_mask [1, 1, 1, C] → out [1, n, KV·G, D], and the
    scores scratch (:func:`scratch_shape`) as a second output (memory the graph plans)."""
    if rows < 1:
        raise ValueError(f"chunk_attention: rows must be at least 1, got {rows}")
    KV, G, D, C, N = kv_heads, group, head_dim, capacity, rows
    M = G * N  # query rows per key/value head, (g, i) with i the faster
    B, L, R = BLOCK, LANES, min(ROWS, M)
    passes = -(-M // R)
    _, S = scratch_shape(C, N)
    OWN = _round_up(C, B)  # where the own rows' scores start in a scratch row
    block_t = f"float32x{B}"
    # The per-pass state in one scratch: per row of the pass, [acc: B | top: B | total: L | weighted: D].
    TOP, TOTAL, WEIGHTED = B, 2 * B, 2 * B + L
    width = WEIGHTED + D

    def row(p: tirx.PrimExpr, r: tirx.PrimExpr) -> tirx.PrimExpr:
        """The query row in place r of pass p (the last pass repeats row M − 1: the same output twice)."""
        return tirx.min(p * R + r, M - 1)

    def chunk_row(p: tirx.PrimExpr, r: tirx.PrimExpr) -> tirx.PrimExpr:
        return tirx.floormod(row(p, r), N)

    def query_head(h: tirx.PrimExpr, p: tirx.PrimExpr, r: tirx.PrimExpr) -> tirx.PrimExpr:
        return h * G + tirx.floordiv(row(p, r), N)

    @T.prim_func(private=True)
    def kernel(q: T.Buffer((1, N, KV * G, D), "float32"), keys: T.Buffer((1, KV, D, C), "float32"),
               values: T.Buffer((1, KV, C, D), "float32"), new_keys: T.Buffer((1, KV, D, N), "float32"),
               new_values: T.Buffer((1, KV, N, D), "float32"), positions: T.Buffer((N,), "int32"),
               mask: T.Buffer((1, 1, 1, C), "float32"), out: T.Buffer((1, N, KV * G, D), "float32"),
               scores: T.Buffer((ROWS, S), "float32")):
        T.func_attr({"tirx.noalias": True})
        filled: T.let[T.int32] = T.max(T.min(positions[0], C), 0)
        state = T.alloc_buffer((R * width,), "float32", scope="local")
        acc = T.decl_buffer((R, B), "float32", data=state.data, strides=[width, 1], scope="local")
        top = T.decl_buffer((R, B), "float32", data=state.data, elem_offset=TOP, strides=[width, 1],
                            scope="local")
        total = T.decl_buffer((R, L), "float32", data=state.data, elem_offset=TOTAL, strides=[width, 1],
                              scope="local")
        weighted = T.decl_buffer((R, D), "float32", data=state.data, elem_offset=WEIGHTED, strides=[width, 1],
                                 scope="local")
        for h, p in T.grid(KV, passes):
            for r in T.unroll(R):
                for lane in T.vectorized(B):
                    top[r, lane] = T.min_value("float32")
            for block in range((filled + B - 1) // B):  # 1a. the cache's scores, B positions at a time
                start: T.let[T.int32] = block * B
                for r in T.unroll(R):
                    acc[r, span(0, B)] = T.masked_load(block_t, mask, 0, 0, 0, span(start, B),
                                                       below(start, B, filled))
                for d in range(D):
                    for r in T.unroll(R):
                        acc[r, span(0, B)] = acc[r, span(0, B)] + T.Broadcast(
                            q[0, chunk_row(p, r), query_head(h, p, r), d], B) * T.masked_load(
                            block_t, keys, 0, h, d, span(start, B), below(start, B, filled))
                for r in T.unroll(R):
                    scores[r, span(start, B)] = acc[r, span(0, B)]
                    top[r, span(0, B)] = T.max(top[r, span(0, B)], T.Select(below(start, B, filled), acc[
                        r, span(0, B)], T.Broadcast(T.min_value("float32"), B)))
            for block in range((N + B - 1) // B):  # 1b. the own rows' scores, j <= i counted
                start: T.let[T.int32] = block * B
                for r in T.unroll(R):
                    for lane in T.vectorized(B):
                        acc[r, lane] = T.float32(0)
                for d in range(D):
                    for r in T.unroll(R):
                        acc[r, span(0, B)] = acc[r, span(0, B)] + T.Broadcast(
                            q[0, chunk_row(p, r), query_head(h, p, r), d], B) * T.masked_load(
                            block_t, new_keys, 0, h, d, span(start, B), below(start, B, N))
                for r in T.unroll(R):
                    scores[r, span(OWN + start, B)] = acc[r, span(0, B)]
                    top[r, span(0, B)] = T.max(top[r, span(0, B)], T.Select(
                        below(start, B, chunk_row(p, r) + 1), acc[r, span(0, B)],
                        T.Broadcast(T.min_value("float32"), B)))
            for r in T.unroll(R):  # 2. softmax
                for c in range(1, B // L):  # the max of the lanes: B → LANES by vectors, then one by one
                    for lane in T.vectorized(L):
                        top[r, lane] = T.max(top[r, lane], top[r, c * L + lane])
                for lane in range(1, L):
                    top[r, 0] = T.max(top[r, 0], top[r, lane])
                for lane in T.vectorized(L):
                    total[r, lane] = T.float32(0)
                for block in range((filled + L - 1) // L):
                    for lane in T.vectorized(L):
                        scores[r, block * L + lane] = T.Select(
                            block * L + lane < filled, exp_nonpositive(scores[r, block * L + lane] - top[r, 0]),
                            T.float32(0))
                        total[r, lane] = total[r, lane] + scores[r, block * L + lane]
                for block in range((N + L - 1) // L):  # every own row written: 0 where j > i
                    for lane in T.vectorized(L):
                        scores[r, OWN + block * L + lane] = T.Select(
                            block * L + lane <= chunk_row(p, r),
                            exp_nonpositive(scores[r, OWN + block * L + lane] - top[r, 0]), T.float32(0))
                        total[r, lane] = total[r, lane] + scores[r, OWN + block * L + lane]
                for lane in range(1, L):
                    total[r, 0] = total[r, 0] + total[r, lane]
                for e in T.vectorized(D):
                    weighted[r, e] = T.float32(0)
            for j in range(filled):  # 3. the weighted sums, one value row at a time
                for r in T.unroll(R):
                    for e in T.vectorized(D):
                        weighted[r, e] = weighted[r, e] + scores[r, j] * values[0, h, j, e]
            for j in range(N):
                for r in T.unroll(R):
                    for e in T.vectorized(D):
                        weighted[r, e] = weighted[r, e] + scores[r, OWN + j] * new_values[0, h, j, e]
            for r in T.unroll(R):
                for e in T.vectorized(D):
                    out[0, chunk_row(p, r), query_head(h, p, r), e] = weighted[r, e] / total[r, 0]

    return kernel
