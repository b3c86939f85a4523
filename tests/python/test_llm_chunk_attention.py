"""The prefill chunk's attention kernel (llm/chunk_attention.py) against causal attention in float64:
chunk sizes from 1 up, a last pass repeating a row, positions at 0, mid-cache and C − n, NaN in every
cache row it must not read."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm_hetero.llm import chunk_attention
from tvm_hetero.llm.this_cpu import this_cpu


def build(kv_heads, group, head_dim, capacity, rows):
    kernel = chunk_attention.chunk_attention(kv_heads, group, head_dim, capacity, rows)
    module = tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")})
    return tvm.compile(module, target=this_cpu()).mod["main"]


def attention(q, keys, values, new_keys, new_values, mask, filled, group):
    """Each query row i over the first ``filled`` cache rows and the chunk's rows 0..i, in float64."""
    n, heads, _ = q.shape[1:]
    out = np.zeros(q.shape)
    for head in range(heads):
        h = head // group
        for i in range(n):
            query = q[0, i, head].astype(np.float64)
            scores = np.concatenate([query @ keys[0, h, :, :filled] + mask[0, 0, 0, :filled],
                                     query @ new_keys[0, h, :, :i + 1]])
            p = np.exp(scores - scores.max())
            rows = np.concatenate([values[0, h, :filled], new_values[0, h, :i + 1]])
            out[0, i, head] = (p / p.sum()) @ rows
    return out


def run(fn, shape, rows, position, rng):
    kv_heads, group, head_dim, capacity = shape
    filled = min(max(position, 0), capacity)
    q = rng.standard_normal((1, rows, kv_heads * group, head_dim), dtype=np.float32) * 0.5
    keys = rng.standard_normal((1, kv_heads, head_dim, capacity), dtype=np.float32)
    values = rng.standard_normal((1, kv_heads, capacity, head_dim), dtype=np.float32)
    keys[..., filled:] = np.nan  # a read of any row at or beyond the position would show
    values[:, :, filled:] = np.nan
    new_keys = rng.standard_normal((1, kv_heads, head_dim, rows), dtype=np.float32)
    new_values = rng.standard_normal((1, kv_heads, rows, head_dim), dtype=np.float32)
    mask = np.full((1, 1, 1, capacity), -1e30, np.float32)
    mask[..., :filled] = 0.0
    mask[..., :filled:5] = -1e30  # masked rows inside the filled ones count for nothing
    out = tvm.runtime.tensor(np.full(q.shape, np.nan, np.float32))
    scratch = tvm.runtime.tensor(np.full(chunk_attention.scratch_shape(capacity, rows), np.nan, np.float32))
    positions = (position + np.arange(rows)).astype(np.int32)
    inputs = (q, keys, values, new_keys, new_values, positions, mask)
    fn(*[tvm.runtime.tensor(a) for a in inputs], out, scratch)
    return out.numpy(), attention(q, keys, values, new_keys, new_values, mask, filled, group)


@pytest.mark.parametrize("shape", [(3, 3, 64, 200), (2, 1, 16, 64), (1, 4, 24, 130)],
                         ids=lambda s: "kv{}-group{}-dim{}-capacity{}".format(*s))
def test_the_chunk_attention_is_causal_attention_over_the_filled_rows(shape):
    capacity = shape[3]
    rng = np.random.default_rng(sum(shape))
    for rows in (1, 2, 3, 5, 16, 17, 64):
        if rows > capacity:
            continue
        fn = build(*shape, rows)
        for position in sorted({0, 1, capacity // 2, 63, 64, capacity - rows}):
            got, expected = run(fn, shape, rows, position, rng)
            message = f"rows {rows}, position {position}"
            assert np.isfinite(got).all(), message
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=message)


def test_a_position_beyond_the_cache_reads_no_row_outside_it():
    shape, rows = (1, 2, 16, 40), 4
    fn = build(*shape, rows)
    got, expected = run(fn, shape, rows, 55, np.random.default_rng(3))  # clamped to the capacity
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_chunk_of_no_rows_is_refused():
    with pytest.raises(ValueError, match="rows must be at least 1"):
        chunk_attention.chunk_attention(1, 1, 16, 64, 0)
