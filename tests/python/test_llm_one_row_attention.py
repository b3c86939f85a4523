"""The decode step's attention kernel (llm/one_row_attention.py) against attention in float64: every
group size (a pass of query heads, a last pass repeating one), capacities and positions at and off
the block edges, NaN in every row it must not read, and its exponential against numpy's."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T
from tvm_hetero.llm import one_row_attention
from tvm_hetero.llm.this_cpu import this_cpu

TARGETS = {"this CPU": this_cpu, "the architecture's baseline": lambda: tvm.target.Target("llvm")}


def build(kv_heads, group, head_dim, capacity, target):
    kernel = one_row_attention.decode_attention(kv_heads, group, head_dim, capacity)
    return compile_main(kernel, target)


def compile_main(kernel, target):
    module = tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")})
    return tvm.compile(module, target=target).mod["main"]


def attention(q, keys, values, own_key, own_value, mask, filled):
    """Softmax attention of each query head over the first ``filled`` cache rows and its own row."""
    out = np.zeros(q.shape)
    for h in range(q.shape[1]):
        queries = q[0, h].astype(np.float64)
        scores = np.concatenate([queries @ keys[0, h, :, :filled] + mask[0, 0, 0, :filled],
                                 queries @ own_key[0, h]], axis=1)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        rows = np.concatenate([values[0, h, :filled], own_value[0, h]])
        out[0, h] = (p / p.sum(axis=1, keepdims=True)) @ rows
    return out


def run(fn, shape, position, rng):
    kv_heads, group, head_dim, capacity = shape
    filled = min(max(position, 0), capacity)
    q = rng.standard_normal((1, kv_heads, group, head_dim), dtype=np.float32) * 0.5
    keys = rng.standard_normal((1, kv_heads, head_dim, capacity), dtype=np.float32)
    values = rng.standard_normal((1, kv_heads, capacity, head_dim), dtype=np.float32)
    keys[..., filled:] = np.nan  # a read of any row at or beyond the position would show
    values[:, :, filled:] = np.nan
    own_key = rng.standard_normal((1, kv_heads, head_dim, 1), dtype=np.float32)
    own_value = rng.standard_normal((1, kv_heads, 1, head_dim), dtype=np.float32)
    mask = np.full((1, 1, 1, capacity), -1e30, np.float32)
    mask[..., :filled] = 0.0
    mask[..., :filled:5] = -1e30  # masked rows inside the filled ones count for nothing
    out = tvm.runtime.tensor(np.full(q.shape, np.nan, np.float32))
    scratch = np.full(one_row_attention.scores_shape(kv_heads, group, capacity), np.nan, np.float32)
    inputs = (q, keys, values, own_key, own_value, np.int32([position]), mask)
    fn(*[tvm.runtime.tensor(a) for a in inputs], out, tvm.runtime.tensor(scratch))
    return out.numpy(), attention(q, keys, values, own_key, own_value, mask, filled)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(3, 3, 64, 200), (2, 7, 16, 64), (1, 8, 8, 37), (2, 1, 24, 130)],
                         ids=lambda s: "kv{}-group{}-dim{}-capacity{}".format(*s))
def test_the_decode_attention_is_attention_over_the_filled_rows(shape, target):
    fn = build(*shape, TARGETS[target]())
    capacity = shape[3]
    rng = np.random.default_rng(sum(shape))
    for position in sorted({-3, 0, 1, 15, 16, 63, 64, 65, 127, 128, capacity - 1, capacity, capacity + 9}):
        got, expected = run(fn, shape, position, rng)
        assert np.isfinite(got).all(), f"position {position}"
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=f"position {position}")


def test_the_kernels_exponential_is_within_one_ulp_and_zero_below_the_normal_range():
    n = 1 << 16

    @T.prim_func(private=True)
    def exp(x: T.Buffer((n,), "float32"), y: T.Buffer((n,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for block in range(n // 16):
            for lane in T.vectorized(16):
                y[block * 16 + lane] = one_row_attention.exp_nonpositive(x[block * 16 + lane])

    fn = compile_main(exp, this_cpu())
    edges = np.float32([-0.0, -1e-30, -87.0, -3e38])
    x = np.concatenate([np.linspace(-100, 0, n - len(edges), dtype=np.float32), edges])
    y = tvm.runtime.tensor(np.zeros(n, np.float32))
    fn(tvm.runtime.tensor(x), y)
    y = y.numpy()
    exact = np.exp(x.astype(np.float64))
    normal = x >= -87.0
    ulps = np.abs(y[normal] - exact[normal]) / np.spacing(exact[normal].astype(np.float32))
    assert ulps.max() <= 1.0
    assert (y[~normal] == 0).all() and y[-4] == 1.0
