"""Relax building blocks shared by the architecture files: projections, norms, RoPE and the
attention of a chunk against the fixed-capacity cache.

:func:`cache_attention` never copies or concatenates the cache: the chunk's queries meet the cache
(one batched matmul against the transposed keys, masked to the filled rows) and the chunk's own
new rows (a second matmul, causally masked) separately; one softmax runs over the two score blocks
side by side (their concatenation is n x (C + n) scores, not cache rows), and the two weighted sums
are added. Only the new rows leave the graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx

from .chunk_attention import chunk_attention, scratch_shape
from .config import DecoderConfig
from .graph_io import (
    CACHE_MASK,
    CHUNK_MASK,
    LOGIT_ROW,
    POSITIONS,
    TOKENS,
    data_inputs,
    key_cache,
    value_cache,
)
from .int8_weights import ZERO_POINT_WEIGHT, quantized_names, scale_name
from .one_row_attention import decode_attention, scores_shape
from .panel_weights import PANEL_WIDTH, panelled_names

op = relax.op


class GraphBuilder:
    """One entry function under construction: its inputs by name and an ``emit`` for its body."""

    def __init__(self, cfg: DecoderConfig, capacity: int, weight_shapes: dict[str, tuple[int, ...]],
                 rows: int | None = None):
        self.cfg = cfg
        self.capacity = capacity
        #: The symbolic chunk length, which each bucket binds (relax.transform.BindSymbolicVars), or
        #: ``rows`` for a graph built for one size, whose attention is one kernel over the cache's filled
        #: rows (1: the decode graph's, one_row_attention.py; more: a host chunk's, chunk_attention.py).
        self.n = tirx.Var("n", "int64") if rows is None else rows
        self._one_row_kernel: relax.GlobalVar | None = None
        self._chunk_kernel: relax.GlobalVar | None = None
        self.builder = relax.BlockBuilder()
        self.inputs: dict[str, relax.Var] = {}
        for name, shape, dtype in data_inputs(cfg, capacity, self.n):
            self.inputs[name] = relax.Var(name, relax.TensorType(list(shape), dtype))
        #: Weights stored in 8 bits (int8_weights.py): (out, in) uint8, their scales beside them.
        self.int8 = quantized_names(weight_shapes)
        #: Float32 weights stored in 16-column panels (panel_weights.py): (out / 16, in, 16).
        self.panels = panelled_names(weight_shapes)
        for name, shape in weight_shapes.items():
            dtype = "uint8" if name in self.int8 or name == ZERO_POINT_WEIGHT else "float32"
            self.inputs[name] = relax.Var(name, relax.TensorType(list(shape), dtype))

    def __getitem__(self, name: str) -> relax.Var:
        return self.inputs[name]

    def emit(self, expr: Any) -> relax.Var:
        return self.builder.emit(expr)

    def linear(self, x: relax.Expr, weight: str, bias: str | None = None) -> relax.Var:
        """``x @ W (+ b)`` for an (in, out) weight (family.py: the graphs' layout), or ``x @
        dequantize(W)ᵀ (+ b)`` for an 8-bit (out, in) one; one oneDNN region either way."""
        if weight in self.int8:
            y = self.emit(op.matmul(x, op.permute_dims(self.dequantized(weight))))
        elif weight in self.panels:
            count, k, width = (int(v) for v in self[weight].ty.shape)
            y = self.emit(op.matmul(x, op.reshape(op.permute_dims(self[weight], [1, 0, 2]), [k, count * width])))
        else:
            y = self.emit(op.matmul(x, self[weight]))
        return self.emit(op.add(y, self[bias])) if bias else y

    def embed(self, table: str, transposed: bool) -> relax.Var:
        """The chunk's token embeddings [1, n, hidden] from a (vocab, hidden) table, or from the
        (hidden, vocab) LM head it is tied to (``transposed``: columns gathered)."""
        tokens = self[TOKENS]
        if table in self.int8:  # (vocab, hidden) bytes: the rows gathered, then dequantized
            rows = self.emit(op.take(self[table], tokens, axis=0))  # [1, n, hidden] uint8
            scales = self.emit(op.reshape(op.take(self[scale_name(table)], tokens, axis=0), [self.n]))
            return self.emit(op.dequantize(rows, scales, self[ZERO_POINT_WEIGHT], axis=1))
        if not transposed:
            return self.emit(op.take(self[table], tokens, axis=0))
        if table in self.panels:  # each token's panel, then its column within the panel
            hidden = int(self[table].ty.shape[1])
            width = relax.const(PANEL_WIDTH, tokens.ty.dtype)
            panels = self.emit(op.take(self[table], op.floor_divide(tokens, width), axis=0))  # [1, n, hidden, 16]
            column = op.reshape(op.floor_mod(tokens, width), [1, self.n, 1, 1])
            column = op.broadcast_to(column, [1, self.n, hidden, 1])
            return self.emit(op.reshape(op.gather_elements(panels, column, axis=3), [1, self.n, hidden]))
        return self.emit(op.permute_dims(op.take(self[table], tokens, axis=1), [1, 2, 0]))

    def dequantized(self, weight: str) -> relax.Var:
        """An 8-bit (out, in) weight as float32: (W - zero point) * scale per output row."""
        return self.emit(op.dequantize(self[weight], self[scale_name(weight)], self[ZERO_POINT_WEIGHT], axis=0))

    def rms_norm(self, x: relax.Expr, weight: str) -> relax.Var:
        return self.emit(op.nn.rms_norm(x, self[weight], axes=[-1], epsilon=self.cfg.norm_eps))

    def layer_norm(self, x: relax.Expr, weight: str, bias: str) -> relax.Var:
        return self.emit(op.nn.layer_norm(x, self[weight], self[bias], axes=[-1], epsilon=self.cfg.norm_eps))

    def heads(self, x: relax.Expr, num_heads: int) -> relax.Var:
        """[1, n, num_heads * D] -> [1, n, num_heads, D]."""
        return self.emit(op.reshape(x, [1, self.n, num_heads, self.cfg.head_dim]))

    def rope(self, x: relax.Expr, cos: relax.Expr, sin: relax.Expr) -> relax.Var:
        """Hugging Face's rotate-half RoPE on [1, n, heads, D]; ``cos``/``sin`` are [1, n, 1, D]."""
        half = self.cfg.head_dim // 2
        x1 = self.emit(op.strided_slice(x, axes=[3], begin=[0], end=[half]))
        x2 = self.emit(op.strided_slice(x, axes=[3], begin=[half], end=[self.cfg.head_dim]))
        rotated = self.emit(op.concat([op.negative(x2), x1], axis=3))
        return self.emit(op.add(op.multiply(x, cos), op.multiply(rotated, sin)))

    def rope_tables(self) -> tuple[relax.Var, relax.Var]:
        """cos and sin of each row's position, gathered from the derived tables: [1, n, 1, D]."""
        shape = [1, self.n, 1, self.cfg.head_dim]
        cos = self.emit(op.reshape(op.take(self[ROPE_COS], self[POSITIONS], axis=0), shape))
        sin = self.emit(op.reshape(op.take(self[ROPE_SIN], self[POSITIONS], axis=0), shape))
        return cos, sin

    def cache_attention(self, layer: int, q: relax.Expr, k: relax.Expr, v: relax.Expr) -> tuple[relax.Var, ...]:
        """Attention of the chunk (q [1, n, H, D], k/v [1, n, KV, D]) over the cache's filled rows
        and its own rows; returns (output [1, n, H * D], new keys [1, KV, D, n], new values
        [1, KV, n, D]). Query head h reads key/value head h // (H / KV) (grouped-query attention)."""
        if isinstance(self.n, int) and self.n == 1:
            return self._one_row_attention(layer, q, k, v)
        if isinstance(self.n, int):
            return self._chunk_attention(layer, q, k, v)
        cfg, n = self.cfg, self.n
        kv, d, group = cfg.num_kv_heads, cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
        rows = group * n  # each key/value head's query rows: (head in group, token)
        q = self.emit(op.multiply(q, relax.const(1.0 / np.sqrt(d), "float32")))
        q = self.emit(op.reshape(op.permute_dims(op.reshape(q, [1, n, kv, group, d]), [0, 2, 3, 1, 4]),
                                 [1, kv, rows, d]))
        new_keys = self.emit(op.permute_dims(k, [0, 2, 3, 1]))  # [1, KV, D, n], the cache's layout
        new_values = self.emit(op.permute_dims(v, [0, 2, 1, 3]))  # [1, KV, n, D]
        cache_scores = self.emit(op.add(op.matmul(q, self[key_cache(layer)]), self[CACHE_MASK]))
        own_scores = self.emit(op.matmul(q, new_keys))  # [1, KV, rows, n]
        own_scores = self.emit(op.reshape(
            op.add(op.reshape(own_scores, [1, kv, group, n, n]), self[CHUNK_MASK]), [1, kv, rows, n]))
        probs = self.emit(op.nn.softmax(op.concat([cache_scores, own_scores], axis=3), axis=3))
        parts = self.emit(op.split(probs, [self.capacity], axis=3))
        cache_probs = self.emit(relax.TupleGetItem(parts, 0))
        own_probs = self.emit(relax.TupleGetItem(parts, 1))
        out = self.emit(op.add(op.matmul(cache_probs, self[value_cache(layer)]),
                               op.matmul(own_probs, new_values)))  # [1, KV, rows, D]
        out = self.emit(op.reshape(op.permute_dims(op.reshape(out, [1, kv, group, n, d]), [0, 3, 1, 2, 4]),
                                   [1, n, cfg.num_heads * d]))
        return out, new_keys, new_values

    def _one_row_attention(self, layer: int, q: relax.Expr, k: relax.Expr, v: relax.Expr) -> tuple[relax.Var, ...]:
        """cache_attention for one row, as one kernel over the filled rows only (one_row_attention.py)."""
        cfg = self.cfg
        kv, d, group = cfg.num_kv_heads, cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
        if self._one_row_kernel is None:
            self._one_row_kernel = self.builder.add_func(decode_attention(kv, group, d, self.capacity),
                                                         "one_row_attention")
        q = self.emit(op.reshape(op.multiply(q, relax.const(1.0 / np.sqrt(d), "float32")), [1, kv, group, d]))
        new_keys = self.emit(op.permute_dims(k, [0, 2, 3, 1]))  # [1, KV, D, 1]
        new_values = self.emit(op.permute_dims(v, [0, 2, 1, 3]))  # [1, KV, 1, D]
        args = [q, self[key_cache(layer)], self[value_cache(layer)], new_keys, new_values, self[POSITIONS],
                self[CACHE_MASK]]
        result = self.emit(relax.call_tir(self._one_row_kernel, relax.Tuple(args), out_ty=[
            relax.TensorType([1, kv, group, d], "float32"),
            relax.TensorType(list(scores_shape(kv, group, self.capacity)), "float32")]))
        out = self.emit(op.reshape(relax.TupleGetItem(result, 0), [1, 1, cfg.num_heads * d]))
        return out, new_keys, new_values

    def _chunk_attention(self, layer: int, q: relax.Expr, k: relax.Expr, v: relax.Expr) -> tuple[relax.Var, ...]:
        """cache_attention for a chunk of a known size, as one kernel over the filled rows and the chunk's
        own rows causally (chunk_attention.py)."""
        cfg, n = self.cfg, self.n
        kv, d, group = cfg.num_kv_heads, cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
        if self._chunk_kernel is None:
            self._chunk_kernel = self.builder.add_func(chunk_attention(kv, group, d, self.capacity, n),
                                                       "chunk_attention")
        q = self.emit(op.multiply(q, relax.const(1.0 / np.sqrt(d), "float32")))  # [1, n, H, D]
        new_keys = self.emit(op.permute_dims(k, [0, 2, 3, 1]))  # [1, KV, D, n], the cache's layout
        new_values = self.emit(op.permute_dims(v, [0, 2, 1, 3]))  # [1, KV, n, D]
        args = [q, self[key_cache(layer)], self[value_cache(layer)], new_keys, new_values, self[POSITIONS],
                self[CACHE_MASK]]
        result = self.emit(relax.call_tir(self._chunk_kernel, relax.Tuple(args), out_ty=[
            relax.TensorType([1, n, cfg.num_heads, d], "float32"),
            relax.TensorType(list(scratch_shape(self.capacity, n)), "float32")]))
        out = self.emit(op.reshape(relax.TupleGetItem(result, 0), [1, n, cfg.num_heads * d]))
        return out, new_keys, new_values

    def finish(self, hidden: relax.Expr, norm: Any, lm_head: str, new_rows: list[relax.Var]) -> relax.Function:
        """Logits of ``logit_row`` (normed by ``norm(x)``) and the new rows as the function's outputs."""
        last = self.emit(op.take(hidden, self[LOGIT_ROW], axis=1))  # [1, 1, hidden]
        logits = self.linear(norm(last), lm_head)
        return self.emit(relax.Tuple([logits, *new_rows]))


#: Derived weights of RoPE models: cos and sin of every position below the capacity, [C, D].
ROPE_COS = "rope.cos"
ROPE_SIN = "rope.sin"


def rope_tables(cfg: DecoderConfig, capacity: int) -> dict[str, np.ndarray]:
    """The RoPE tables, computed in float32 the way Hugging Face's default rotary embedding does."""
    exponents = np.arange(0, cfg.head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(cfg.head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** exponents)).astype(np.float32)
    freqs = np.arange(capacity, dtype=np.float32)[:, None] * inv_freq[None, :]
    angles = np.concatenate([freqs, freqs], axis=1)
    return {ROPE_COS: np.cos(angles).astype(np.float32), ROPE_SIN: np.sin(angles).astype(np.float32)}


def make_module(graph: GraphBuilder, body: Any) -> tvm.IRModule:
    """Wrap ``body(graph) -> outputs`` into the entry function ``main`` (data inputs first), in a module
    with the kernels it calls (the one-row or the chunk attention's)."""
    with graph.builder.function("main", list(graph.inputs.values())):
        with graph.builder.dataflow():
            outputs = body(graph)
            result = graph.builder.emit_output(outputs)
        graph.builder.emit_func_output(result)
    return graph.builder.get()
