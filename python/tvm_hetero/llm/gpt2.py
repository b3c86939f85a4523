"""GPT-2: learned positions, fused qkv projection (Conv1D weights stored (in, out)), LayerNorm,
gelu_new (tanh GELU), LM head tied to the token embedding."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .blocks import GraphBuilder, make_module
from .config import DecoderConfig
from .family import Family
from .graph_io import POSITIONS

op = relax.op


def weight_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the graph reads, by Hugging Face name, with its shape."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.wte.weight": (cfg.vocab_size, h),
        "transformer.wpe.weight": (cfg.max_positions, h),
    }
    for i in range(cfg.num_layers):
        p = f"transformer.h.{i}."
        shapes.update({
            p + "ln_1.weight": (h,), p + "ln_1.bias": (h,),
            p + "attn.c_attn.weight": (h, 3 * h), p + "attn.c_attn.bias": (3 * h,),
            p + "attn.c_proj.weight": (h, h), p + "attn.c_proj.bias": (h,),
            p + "ln_2.weight": (h,), p + "ln_2.bias": (h,),
            p + "mlp.c_fc.weight": (h, inter), p + "mlp.c_fc.bias": (inter,),
            p + "mlp.c_proj.weight": (inter, h), p + "mlp.c_proj.bias": (h,),
        })
    shapes["transformer.ln_f.weight"] = (h,)
    shapes["transformer.ln_f.bias"] = (h,)
    return shapes


def derived_weights(cfg: DecoderConfig, capacity: int) -> dict[str, np.ndarray]:
    return {}


def transposed(cfg: DecoderConfig) -> set[str]:
    """The token embedding, which is also the LM head: (hidden, vocab) in the graphs. Conv1D weights
    are (in, out) already."""
    return {"transformer.wte.weight"}


def fused(cfg: DecoderConfig) -> dict[str, list[str]]:
    """None: GPT-2's q, k, v are one Conv1D already."""
    return {}


def entry_module(cfg: DecoderConfig, capacity: int, shapes: dict[str, tuple[int, ...]],
                   rows: int | None = None) -> tvm.IRModule:
    """The chunk graph with a symbolic chunk length ``n``, or built for ``rows`` (inputs and outputs:
    :mod:`.graph_io`)."""
    if cfg.max_positions is not None and capacity > cfg.max_positions:
        raise ValueError(f"gpt2: a cache capacity of {capacity} tokens exceeds the model's {cfg.max_positions} "
                         "learned positions (n_positions)")
    return make_module(GraphBuilder(cfg, capacity, shapes, rows), lambda g: _body(g, cfg))


def _body(g: GraphBuilder, cfg: DecoderConfig) -> relax.Var:
    heads = cfg.num_heads
    tokens = g.embed("transformer.wte.weight", transposed=True)  # [1, n, h]
    positions = g.emit(op.take(g["transformer.wpe.weight"], g[POSITIONS], axis=0))  # [n, h]
    hidden = g.emit(op.add(tokens, positions))
    new_rows = []
    for i in range(cfg.num_layers):
        p = f"transformer.h.{i}."
        x = g.layer_norm(hidden, p + "ln_1.weight", p + "ln_1.bias")
        qkv = g.linear(x, p + "attn.c_attn.weight", p + "attn.c_attn.bias")
        parts = g.emit(op.split(qkv, 3, axis=2))
        q, k, v = (g.heads(g.emit(relax.TupleGetItem(parts, j)), heads) for j in range(3))
        attended, new_keys, new_values = g.cache_attention(i, q, k, v)
        new_rows += [new_keys, new_values]
        hidden = g.emit(op.add(hidden, g.linear(attended, p + "attn.c_proj.weight", p + "attn.c_proj.bias")))
        x = g.layer_norm(hidden, p + "ln_2.weight", p + "ln_2.bias")
        x = g.emit(op.nn.gelu_tanh(g.linear(x, p + "mlp.c_fc.weight", p + "mlp.c_fc.bias")))
        hidden = g.emit(op.add(hidden, g.linear(x, p + "mlp.c_proj.weight", p + "mlp.c_proj.bias")))
    norm = lambda x: g.layer_norm(x, "transformer.ln_f.weight", "transformer.ln_f.bias")
    return g.finish(hidden, norm, "transformer.wte.weight", new_rows)


def matmul_weights(cfg: DecoderConfig) -> set[str]:
    """Graph names of the weights ``linear`` reads: the four Conv1D weights per layer and the LM head."""
    names = {"transformer.wte.weight"}
    for i in range(cfg.num_layers):
        p = f"transformer.h.{i}."
        names |= {p + "attn.c_attn.weight", p + "attn.c_proj.weight", p + "mlp.c_fc.weight", p + "mlp.c_proj.weight"}
    return names


FAMILY = Family(weight_shapes, transposed, fused, derived_weights, entry_module, matmul_weights)
