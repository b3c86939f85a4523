"""The attention of a decode step (one row) as one kernel that reads only the cache's filled rows.

The chunk graphs' attention (blocks.cache_attention) multiplies the queries with the whole cache,
masked: at capacity C and f filled rows it reads C rows of keys and values where f are needed, in
seven kernels. For one row the filled length is the row's own position, an input of the graph, so a
single TIR kernel can loop over exactly those rows:

    f = clamp(positions[0], 0, C)
    scores[j] = q · keys[:, j] + cache_mask[j]   for j < f,   own = q · new_key
    p = softmax(scores[0:f], own)                  (max subtracted, as relax's softmax does)
    out = Σ_j p[j] · values[j, :] + p_own · new_value

How the loops run. The query heads of one key/value head are taken ROWS at a time, so each cache
row is read once per ROWS query heads (once per key/value head for groups up to ROWS), and each
pass keeps its accumulators in vector registers:

1. Scores: keys are stored transposed ([D, C], one row per head-dim index), so the vector lanes run
   over BLOCK consecutive positions. For each of the D rows one vector of keys is loaded and
   multiplied into every query head's accumulators. The last block's loads are masked at f, so
   no row at or beyond f is read. A lane-wise running max comes along. The next block's keys are
   prefetched: its D rows are D streams, more than the hardware prefetcher follows, and a decode
   step's cache is cold (the weights passed through the caches since the layer's last step).
2. Softmax: exp(s − max) over LANES scores at a time, by the polynomial of :func:`exp_nonpositive`
   (LLVM turns a vector ``exp`` into one libm call per lane); lanes at or beyond f become 0.
3. Weighted sum: values are stored [C, D], so the lanes run over D; each value row is loaded once
   and multiplied into every query head's D accumulators.

Guarantee: for every key/value head and every query head of its group, the result equals the
masked attention over the whole cache whenever the rows at and beyond ``positions[0]`` are masked
(the session's invariant: they are −1e30 in ``cache_mask``, whose exponent is 0 in float32), up to
float32 rounding (the exponential is within 1 ulp; sums run in another order); it reads no cache
row at or beyond the clamped position and nothing outside any tensor, whatever ``positions`` holds.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

#: Positions per block of the score loop (4 AVX-512 registers per query head).
BLOCK = 64
#: Scores per vector of the softmax loop (one AVX-512 register of float32).
LANES = 16
#: Query heads per pass: their accumulators (ROWS × BLOCK and ROWS × D floats) fit the 32 registers.
ROWS = 4

_LOG2E = 1.4426950408889634
# ln 2 in two parts: _LN2_HI has 9 significant bits, so n · _LN2_HI is exact and r = x − n·ln 2
# loses no more than _LN2_LO's rounding.
_LN2_HI = 0.693359375
_LN2_LO = -2.1219444005469057e-4
# Below this the result is 0 (exp(−87) ≈ 1.6e-38 is next to float32's smallest normal number), so
# 2^n, made from its exponent bits, stays a normal number.
_EXP_FLOOR = -87.0


def scores_shape(kv_heads: int, group: int, capacity: int) -> tuple[int, int, int]:
    """The shape of the kernel's scores scratch: a row per key/value head and query head (the last
    pass's repeated heads have rows of their own), the capacity rounded up to whole blocks."""
    rows = min(ROWS, group)
    return kv_heads, -(-group // rows) * rows, -(-capacity // BLOCK) * BLOCK


def exp_nonpositive(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp(x) for float32 x <= 0, within 1 ulp, as arithmetic that vectorizes: exp(x) = 2^n · exp(r)
    with n = round(x / ln 2), |r| <= ln 2 / 2, and exp(r) by its Taylor series to degree 7 (the first
    term left out is below 6e-9 there)."""
    f32 = lambda value: tirx.const(value, "float32")  # noqa: E731
    v = tirx.Var("v", "float32")
    n = tirx.Var("n", "float32")
    r = tirx.Var("r", "float32")
    p = f32(1.0 / 5040)
    for k in (720, 120, 24, 6, 2, 1, 1):
        p = p * r + f32(1.0 / k)
    scale = tirx.reinterpret("float32", tirx.shift_left(tirx.Cast("int32", n) + 127, 23))
    body = tirx.Let(r, v - n * f32(_LN2_HI) - n * f32(_LN2_LO), p * scale)
    body = tirx.Let(n, tirx.floor(v * f32(_LOG2E) + f32(0.5)), body)
    body = tirx.Let(v, tirx.max(x, f32(_EXP_FLOOR)), body)
    return tirx.Select(x < f32(_EXP_FLOOR), f32(0.0), body)


def span(start: tirx.PrimExpr, lanes: int) -> tirx.PrimExpr:
    """The indices start, ..., start + lanes − 1 as one vector."""
    return tirx.Ramp(start, 1, lanes)


def below(start: tirx.PrimExpr, lanes: int, end: tirx.PrimExpr) -> tirx.PrimExpr:
    """Which of those indices are below ``end``: the mask of a load that stops there."""
    return tirx.Ramp(start, 1, lanes) < tirx.Broadcast(end, lanes)


def decode_attention(kv_heads: int, group: int, head_dim: int, capacity: int) -> tirx.PrimFunc:
    """The kernel for one row: q [1, KV, group, D] (scaled), keys [1, KV, D, C], values [1, KV, C, D],
    the row's own key [1, KV, D, 1] and value [1, KV, 1, D], positions [1], cache_mask [1, 1, 1, C]
    → out [1, KV, group, D], and the scores (:func:`scores_shape`) as a second output (memory the
    graph plans; a call asks the runtime only for the small per-pass state)."""
    KV, G, D, C = kv_heads, group, head_dim, capacity
    _, P, S = scores_shape(kv_heads, group, capacity)
    B, L, R = BLOCK, LANES, min(ROWS, group)
    block_t = f"float32x{B}"
    # The per-pass state in one scratch, so a call asks for memory once: per query head of the pass,
    # a row of [acc: B | top: B | total: L | weighted: D | own: 1].
    TOP, TOTAL, WEIGHTED, OWN = B, 2 * B, 2 * B + L, 2 * B + L + D
    width = OWN + 1

    def head(p: tirx.PrimExpr, r: tirx.PrimExpr) -> tirx.PrimExpr:
        """The query head in place r of pass p (the last pass repeats head G − 1 where G is not a
        multiple of R: the same output, written twice); its scores are row p·R + r."""
        return tirx.min(p * R + r, G - 1)

    @T.prim_func(private=True)
    def kernel(q: T.Buffer((1, KV, G, D), "float32"), keys: T.Buffer((1, KV, D, C), "float32"),
               values: T.Buffer((1, KV, C, D), "float32"), own_key: T.Buffer((1, KV, D, 1), "float32"),
               own_value: T.Buffer((1, KV, 1, D), "float32"), positions: T.Buffer((1,), "int32"),
               mask: T.Buffer((1, 1, 1, C), "float32"), out: T.Buffer((1, KV, G, D), "float32"),
               scores: T.Buffer((KV, P, S), "float32")):
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
        own = T.decl_buffer((R,), "float32", data=state.data, elem_offset=OWN, strides=[width], scope="local")
        for h, p in T.grid(KV, P // R):
            for r in T.unroll(R):  # own = q · new_key, as LANES partial sums, then their sum
                for lane in T.vectorized(L):
                    total[r, lane] = T.float32(0)
                for c in range(D // L):
                    for lane in T.vectorized(L):
                        total[r, lane] = total[r, lane] + q[0, h, head(p, r), c * L + lane] * own_key[
                            0, h, c * L + lane, 0]
                for d in range(D // L * L, D):
                    total[r, 0] = total[r, 0] + q[0, h, head(p, r), d] * own_key[0, h, d, 0]
                own[r] = total[r, 0]
                for lane in range(1, L):
                    own[r] = own[r] + total[r, lane]
                for lane in T.vectorized(B):
                    top[r, lane] = own[r]
            for block in range((filled + B - 1) // B):  # 1. scores, B positions at a time
                start: T.let[T.int32] = block * B
                for r in T.unroll(R):
                    acc[r, span(0, B)] = T.masked_load(block_t, mask, 0, 0, 0, span(start, B),
                                                       below(start, B, filled))
                for d in range(D):
                    for i in T.unroll(B // L):  # the next block's keys, those below f, towards L2
                        if start + B + i * L < filled:
                            T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(
                                keys[0, h, d, start + B + i * L]), 0, 1, 1))
                    for r in T.unroll(R):
                        acc[r, span(0, B)] = acc[r, span(0, B)] + T.Broadcast(q[0, h, head(p, r), d], B) * (
                            T.masked_load(block_t, keys, 0, h, d, span(start, B), below(start, B, filled)))
                for r in T.unroll(R):
                    scores[h, p * R + r, span(start, B)] = acc[r, span(0, B)]
                    top[r, span(0, B)] = T.max(top[r, span(0, B)], T.Select(below(start, B, filled), acc[
                        r, span(0, B)], T.Broadcast(T.min_value("float32"), B)))
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
                        scores[h, p * R + r, block * L + lane] = T.Select(
                            block * L + lane < filled,
                            exp_nonpositive(scores[h, p * R + r, block * L + lane] - top[r, 0]), T.float32(0))
                        total[r, lane] = total[r, lane] + scores[h, p * R + r, block * L + lane]
                own[r] = exp_nonpositive(own[r] - top[r, 0])
                for lane in range(1, L):
                    total[r, 0] = total[r, 0] + total[r, lane]
                total[r, 0] = total[r, 0] + own[r]
                for e in T.vectorized(D):
                    weighted[r, e] = own[r] * own_value[0, h, 0, e]
            for j in range(filled):  # 3. the weighted sum, one value row at a time
                for r in T.unroll(R):
                    for e in T.vectorized(D):
                        weighted[r, e] = weighted[r, e] + scores[h, p * R + r, j] * values[0, h, j, e]
            for r in T.unroll(R):
                for e in T.vectorized(D):
                    out[0, h, head(p, r), e] = weighted[r, e] / total[r, 0]

    return kernel
