"""One output per graph for a phase on an accelerator: the logits and every layer's new rows packed
into one flat tensor.

An accelerator graph (a region) has one output. The entry graph's outputs -- the logits and, per
layer, the new keys and values, each also read inside the graph by that layer's attention -- would
each end an accelerator graph: two or more graph executions per layer. Packed into one tensor at the
end of the graph, they are all read inside one region whose sink is the packing concat, so a chunk
can run as one accelerator graph execution.

The packed output is ``[1, total]``: the logits [1, 1, vocab], then per layer the new keys
[1, KV, D, n] and the new values [1, KV, n, D], each flattened in row-major order
(:func:`packed_layout`). The session takes views of it (no copy) where it took separate outputs.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .config import DecoderConfig
from .graph_io import key_cache_shape, value_cache_shape


def packed_layout(cfg: DecoderConfig, rows: int) -> list[tuple[int, tuple[int, ...]]]:
    """(offset, shape) of each output inside the packed tensor, in the graph's output order."""
    shapes = [(1, 1, cfg.vocab_size)]
    for _ in range(cfg.num_layers):
        shapes.append(key_cache_shape(cfg, rows))
        shapes.append(value_cache_shape(cfg, rows))
    layout, offset = [], 0
    for shape in shapes:
        layout.append((offset, shape))
        offset += int(np.prod(shape))
    return layout


def packed_size(cfg: DecoderConfig, rows: int) -> int:
    offset, shape = packed_layout(cfg, rows)[-1]
    return offset + int(np.prod(shape))


def pack_outputs(mod: tvm.IRModule, entry: str = "main") -> tvm.IRModule:
    """``mod`` with ``entry``'s returned tuple of static-shaped tensors replaced by their flattened
    concatenation ``[1, total]`` (module docstring)."""
    func = mod[entry]
    body = func.body
    values = {b.var: b for block in body.blocks for b in block.bindings}
    result = body.body
    tuple_var = values[result].value if result in values and isinstance(values[result].value, relax.Var) else result
    if tuple_var not in values or not isinstance(values[tuple_var].value, relax.Tuple):
        raise ValueError(f"pack_outputs: {entry} does not return a tuple made in its body")
    fields = list(values[tuple_var].value.fields)
    blocks = list(body.blocks)
    last = blocks[-1]
    bindings = [b for b in last.bindings if b.var not in (result, tuple_var)]
    flat = []
    for k, field in enumerate(fields):
        shape = [int(d) for d in field.ty.shape.values]
        var = relax.DataflowVar(f"packed_part{k}", relax.TensorType([1, int(np.prod(shape))], field.ty.dtype))
        bindings.append(relax.VarBinding(var, relax.op.reshape(field, [1, int(np.prod(shape))])))
        flat.append(var)
    total = sum(int(v.ty.shape.values[1]) for v in flat)
    packed = relax.Var("packed", relax.TensorType([1, total], fields[0].ty.dtype))
    bindings.append(relax.VarBinding(packed, relax.op.concat(flat, axis=1)))
    blocks[-1] = relax.DataflowBlock(bindings)
    new = relax.Function(func.params, relax.SeqExpr(blocks, packed), packed.ty, func.is_pure, func.attrs)
    mod = mod.clone()
    mod[entry] = new
    return relax.transform.Normalize()(mod)
