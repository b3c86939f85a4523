"""The Llama family (Llama, Qwen2): RMSNorm, grouped-query attention with RoPE, SwiGLU MLP.

Weights keep their Hugging Face names, in the graphs' layout (family.py): projections (in, out),
q/k/v fused into ``self_attn.qkv_proj`` and gate/up into ``mlp.gate_up_proj``. Qwen2 differs only
by the bias on q, k and v (``cfg.qkv_bias``). The RoPE tables are derived weights
(:func:`.blocks.rope_tables`).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .blocks import GraphBuilder, make_module, rope_tables
from .config import DecoderConfig
from .family import Family

op = relax.op


def weight_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the graph reads, by Hugging Face name, with its shape."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        for name, rows in (("q", cfg.num_heads * d), ("k", cfg.num_kv_heads * d), ("v", cfg.num_kv_heads * d)):
            shapes[p + f"self_attn.{name}_proj.weight"] = (rows, h)
            if cfg.qkv_bias:
                shapes[p + f"self_attn.{name}_proj.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (h, cfg.num_heads * d)
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        for name, shape in (("gate", (inter, h)), ("up", (inter, h)), ("down", (h, inter))):
            shapes[p + f"mlp.{name}_proj.weight"] = shape
            if cfg.mlp_bias:
                shapes[p + f"mlp.{name}_proj.bias"] = (shape[0],)
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def derived_weights(cfg: DecoderConfig, capacity: int) -> dict[str, np.ndarray]:
    return rope_tables(cfg, capacity)


def transposed(cfg: DecoderConfig) -> set[str]:
    """Every projection and the LM head (the embedding itself when tied): (in, out) in the graphs."""
    names = {name for name, shape in weight_shapes(cfg).items() if len(shape) == 2}
    return names if cfg.tie_word_embeddings else names - {"model.embed_tokens.weight"}


def fused(cfg: DecoderConfig) -> dict[str, list[str]]:
    """q, k, v into one projection and gate, up into another (and their biases, when present)."""
    groups: dict[str, list[str]] = {}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        kinds = ["weight"] + (["bias"] if cfg.qkv_bias else [])
        for kind in kinds:
            groups[p + f"self_attn.qkv_proj.{kind}"] = [p + f"self_attn.{n}_proj.{kind}" for n in ("q", "k", "v")]
        kinds = ["weight"] + (["bias"] if cfg.mlp_bias else [])
        for kind in kinds:
            groups[p + f"mlp.gate_up_proj.{kind}"] = [p + f"mlp.{n}_proj.{kind}" for n in ("gate", "up")]
    return groups


def entry_module(cfg: DecoderConfig, capacity: int, shapes: dict[str, tuple[int, ...]],
                   rows: int | None = None) -> tvm.IRModule:
    """The chunk graph with a symbolic chunk length ``n``, or built for ``rows`` (inputs and outputs:
    :mod:`.graph_io`)."""
    return make_module(GraphBuilder(cfg, capacity, shapes, rows), lambda g: _body(g, cfg))


def _bias(name: str, present: bool) -> str | None:
    return name if present else None


def _body(g: GraphBuilder, cfg: DecoderConfig) -> relax.Var:
    hidden = g.embed("model.embed_tokens.weight", transposed=cfg.tie_word_embeddings)  # [1, n, h]
    cos, sin = g.rope_tables()
    new_rows = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        x = g.rms_norm(hidden, p + "input_layernorm.weight")
        qkv = g.linear(x, p + "self_attn.qkv_proj.weight", _bias(p + "self_attn.qkv_proj.bias", cfg.qkv_bias))
        q_end, k_end = cfg.num_heads * cfg.head_dim, (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim
        parts = g.emit(op.split(qkv, [q_end, k_end], axis=2))
        q, k, v = (g.emit(relax.TupleGetItem(parts, j)) for j in range(3))
        q = g.rope(g.heads(q, cfg.num_heads), cos, sin)
        k = g.rope(g.heads(k, cfg.num_kv_heads), cos, sin)
        attended, new_keys, new_values = g.cache_attention(i, q, k, g.heads(v, cfg.num_kv_heads))
        new_rows += [new_keys, new_values]
        out = g.linear(attended, p + "self_attn.o_proj.weight", _bias(p + "self_attn.o_proj.bias", cfg.o_bias))
        hidden = g.emit(op.add(hidden, out))
        x = g.rms_norm(hidden, p + "post_attention_layernorm.weight")
        gate_up = g.linear(x, p + "mlp.gate_up_proj.weight", _bias(p + "mlp.gate_up_proj.bias", cfg.mlp_bias))
        gate_up = g.emit(op.split(gate_up, 2, axis=2))
        gate, up = g.emit(relax.TupleGetItem(gate_up, 0)), g.emit(relax.TupleGetItem(gate_up, 1))
        x = g.emit(op.multiply(op.nn.silu(gate), up))
        out = g.linear(x, p + "mlp.down_proj.weight", _bias(p + "mlp.down_proj.bias", cfg.mlp_bias))
        hidden = g.emit(op.add(hidden, out))
    lm_head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    return g.finish(hidden, lambda x: g.rms_norm(x, "model.norm.weight"), lm_head, new_rows)


def matmul_weights(cfg: DecoderConfig) -> set[str]:
    """Graph names of the weights ``linear`` reads: the fused and plain projections and the LM head."""
    names = {"model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        names |= {p + "self_attn.qkv_proj.weight", p + "self_attn.o_proj.weight", p + "mlp.gate_up_proj.weight",
                  p + "mlp.down_proj.weight"}
    return names


FAMILY = Family(weight_shapes, transposed, fused, derived_weights, entry_module, matmul_weights)
