"""The attention of a decode step (one row) as one kernel that reads only the cache's filled rows.

The chunk graphs' attention (blocks.cache_attention) multiplies the queries with the whole cache,
masked: at capacity C and f filled rows it reads C rows of keys and values where f are needed, in
seven kernels. For one row the filled length is the row's own position, an input of the graph, so a
single TIR kernel can loop over exactly those rows:

    f = clamp(positions[0], 0, C)
    scores[j] = q · keys[:, j] + cache_mask[j]   for j < f,   own = q · new_key
    p = softmax(scores[0:f], own)                  (max subtracted, as relax's softmax does)
    out = Σ_j p[j] · values[j, :] + p_own · new_value

Guarantee: for every key/value head and every query head of its group, the result equals the
masked attention over the whole cache whenever the rows at and beyond ``positions[0]`` are masked
(the session's invariant: they are −1e30 in ``cache_mask``, whose exponent is 0 in float32); it reads
no cache row at or beyond the clamped position and nothing outside any tensor, whatever
``positions`` holds.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T


def decode_attention(kv_heads: int, group: int, head_dim: int, capacity: int) -> tirx.PrimFunc:
    """The kernel for one row: q [1, KV, group, D] (scaled), keys [1, KV, D, C], values [1, KV, C, D],
    the row's own key [1, KV, D, 1] and value [1, KV, 1, D], positions [1], cache_mask [1, 1, 1, C]
    → out [1, KV, group, D], and the scores [KV, group, C + 1] as a second output (memory the graph
    plans, so a run allocates nothing)."""
    KV, G, D, C = kv_heads, group, head_dim, capacity

    @T.prim_func(private=True)
    def kernel(q: T.Buffer((1, KV, G, D), "float32"), keys: T.Buffer((1, KV, D, C), "float32"),
               values: T.Buffer((1, KV, C, D), "float32"), own_key: T.Buffer((1, KV, D, 1), "float32"),
               own_value: T.Buffer((1, KV, 1, D), "float32"), positions: T.Buffer((1,), "int32"),
               mask: T.Buffer((1, 1, 1, C), "float32"), out: T.Buffer((1, KV, G, D), "float32"),
               scores: T.Buffer((KV, G, C + 1), "float32")):
        T.func_attr({"tirx.noalias": True})
        filled = T.max(T.min(positions[0], C), 0)
        top = T.decl_buffer((G,), "float32")
        total = T.decl_buffer((G,), "float32")
        for h in range(KV):  # scores[h, r, :filled]: the filled rows'; scores[h, r, C]: the row's own
            for r in range(G):
                for j in range(filled):
                    scores[h, r, j] = mask[0, 0, 0, j]
                scores[h, r, C] = T.float32(0)
            for d in range(D):  # keys are stored transposed: row d holds every position's d-th value
                for r in range(G):
                    for j in range(filled):
                        scores[h, r, j] = scores[h, r, j] + q[0, h, r, d] * keys[0, h, d, j]
                    scores[h, r, C] = scores[h, r, C] + q[0, h, r, d] * own_key[0, h, d, 0]
            for r in range(G):
                top[r] = scores[h, r, C]
                for j in range(filled):
                    top[r] = T.max(top[r], scores[h, r, j])
                total[r] = T.float32(0)
                for j in range(filled):
                    scores[h, r, j] = T.exp(scores[h, r, j] - top[r])
                    total[r] = total[r] + scores[h, r, j]
                scores[h, r, C] = T.exp(scores[h, r, C] - top[r])
                total[r] = total[r] + scores[h, r, C]
                for e in T.vectorized(D):
                    out[0, h, r, e] = scores[h, r, C] * own_value[0, h, 0, e]
                for j in range(filled):
                    for e in T.vectorized(D):
                        out[0, h, r, e] = out[0, h, r, e] + scores[h, r, j] * values[0, h, j, e]
                for e in T.vectorized(D):
                    out[0, h, r, e] = out[0, h, r, e] / total[r]

    return kernel
