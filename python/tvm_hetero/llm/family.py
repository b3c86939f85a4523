"""What each decoder family's file provides to the builder, and the graph's weights made from it.

Weights reach the graphs in the layout oneDNN multiplies fastest: every projection weight (and the
LM head) as (in, out), so ``x @ W`` reads no transposed operand (an (out, in) LM head made the
one-row decode matmul 1.09x slower, interleaved median). A tied LM head is that one (hidden, vocab)
tensor, which the token embedding also gathers from (columns), so the largest tensor is held once.
Projections that read the same input are fused into one weight, concatenated along the outputs
(Llama's q, k, v and gate, up): fewer, larger matmuls per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import tvm

from .config import DecoderConfig


class Family(NamedTuple):
    """A family's graph builder: the checkpoint tensors it reads (Hugging Face name -> shape), which
    of them the graphs take transposed to (in, out), which are fused (graph name -> the checkpoint
    names concatenated along their last axis, after transposing), the weights it derives from the
    configuration, its entry function (symbolic chunk length) given the graph's weight shapes, and
    the graph weights its matmuls read (every projection and the LM head: what ``weights="int8"``
    stores in 8 bits)."""

    weight_shapes: Callable[[DecoderConfig], dict[str, tuple[int, ...]]]
    transposed: Callable[[DecoderConfig], set[str]]
    fused: Callable[[DecoderConfig], dict[str, list[str]]]
    derived_weights: Callable[[DecoderConfig, int], dict[str, np.ndarray]]
    #: (config, capacity, weight shapes, rows=None) -> the module of ``main`` (symbolic chunk length,
    #: or built for ``rows``) and the kernels it calls.
    entry_module: Callable[..., tvm.IRModule]
    matmul_weights: Callable[[DecoderConfig], set[str]]


def graph_weights(family: Family, cfg: DecoderConfig, checkpoint_weights: dict[str, np.ndarray],
                  capacity: int) -> dict[str, np.ndarray]:
    """The graphs' parameters: the checkpoint's tensors (the transposed ones as contiguous (in, out)
    copies) and the derived tables."""
    transposed = family.transposed(cfg)
    weights = {name: np.ascontiguousarray(value.T) if name in transposed else value
               for name, value in checkpoint_weights.items()}
    for fused, parts in family.fused(cfg).items():
        weights[fused] = np.concatenate([weights.pop(part) for part in parts], axis=-1)
    weights.update(family.derived_weights(cfg, capacity))
    return weights


def graph_weight_shapes(family: Family, cfg: DecoderConfig, capacity: int) -> dict[str, tuple[int, ...]]:
    transposed = family.transposed(cfg)
    shapes = {name: tuple(reversed(shape)) if name in transposed else shape
              for name, shape in family.weight_shapes(cfg).items()}
    for fused, parts in family.fused(cfg).items():
        first = shapes[parts[0]]
        shapes[fused] = (*first[:-1], sum(shapes.pop(part)[-1] for part in parts))
    shapes.update({name: table.shape for name, table in family.derived_weights(cfg, capacity).items()})
    return shapes
