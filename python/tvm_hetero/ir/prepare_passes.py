"""Graph rewrites a backend runs before matching its patterns (its ``prepare``): inference-time
simplifications that let a whole chain of ops become one region, for any backend (oneDNN and the
accelerators behind a vendor SDK use them alike).

Each pass rewrites only what computes the same values: dropout at inference and broadcasts to a
tensor's own shape are identities, a stack of two broadcasts summed over the stacked axis is their
sum, and a batch norm or channel-wise affine after a convolution folds into its weights and bias
(in float64, then float32: the folded model differs from the original by float32 rounding only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, is_tuple, is_tuple_get_item, rewrite_call, wildcard

from .relax_helpers import all_float32, expr_shape, same_kind_block, use_counts, with_entry_body


def DropNoOps(entry: str = "main") -> tvm.transform.Pass:
    """``dropout(x)[0]`` and ``broadcast_to(x, shape of x)`` -> ``x``: inference ignores dropout
    (and the tuple it makes would cut a chain of regions in two); torch's attention broadcasts
    to the shape a tensor already has, which would be a copy kernel between two regions."""
    x = wildcard()
    dropout = is_tuple_get_item(is_op("relax.nn.dropout")(x), 0)
    broadcast = is_op("relax.broadcast_to")(x, wildcard())

    def rewrite(orig: Any, m: dict) -> Any:
        if isinstance(orig, relax.TupleGetItem):
            return m[x]
        same = expr_shape(orig) is not None and expr_shape(orig) == expr_shape(m[x]) and orig.ty.dtype == m[x].ty.dtype
        return m[x] if same else orig

    return _rewrite_pass(dropout | broadcast, rewrite, entry, "DropNoOps")


def SimplifyStackSum(entry: str = "main") -> tvm.transform.Pass:
    """``sum(stack([broadcast_to(a), broadcast_to(b)]), axis=0)`` with equal shapes -> ``add(a, b)``."""
    a, b = wildcard(), wildcard()
    stacked = is_op("relax.stack")(
        is_tuple([is_op("relax.broadcast_to")(a, wildcard()), is_op("relax.broadcast_to")(b, wildcard())])
    )
    pattern = is_op("relax.sum")(stacked)

    def rewrite(orig: relax.Call, m: dict) -> Any:
        out = expr_shape(orig)
        axis = orig.attrs.axis
        if axis is None or [int(v) for v in axis] != [0] or bool(orig.attrs.keepdims):
            return orig
        if int(m[stacked].attrs.axis) != 0 or expr_shape(m[a]) != out or expr_shape(m[b]) != out:
            return orig
        return relax.op.add(m[a], m[b])

    return _rewrite_pass(pattern, rewrite, entry, "SimplifyStackSum")


def FoldConvAffine(entry: str = "main", rounds: int = 8) -> tvm.transform.Pass:
    """Fold inference batch norm and per-channel multiply/add constants into a conv2d's weights.

    ``conv2d(x, W) [+ b]`` followed by ``batch_norm(...)[0]``, ``* c`` or ``+ c`` (``c`` constant,
    per output channel or scalar) becomes ``conv2d(x, W') + b'``; repeated (at most ``rounds``
    times, until nothing changes) so chains (batch norm, then multiply, then add) fold whole.
    Legal because the conv weights are constants. A conv (or its bias add) whose output has
    another user is left alone, so a fold never gives a conv a second user.
    """
    x, w = wildcard(), is_const()
    conv = is_op("relax.nn.conv2d")(x, w)
    bias_src = is_const()
    bias = is_op("relax.reshape")(bias_src, wildcard()) | bias_src
    with_bias = is_op("relax.add")(conv, bias)
    base = with_bias | conv
    bn_call = is_op("relax.nn.batch_norm")(base, *[is_const() for _ in range(4)])
    bn = is_tuple_get_item(bn_call, 0)
    scale = is_const()
    mul = is_op("relax.multiply")(base, scale)
    shift = is_const()
    add = is_op("relax.add")(with_bias, shift)
    pattern = bn | mul | add

    def rewrite(orig: Any, m: dict, uses: dict) -> Any:
        conv_call = m[conv]
        if conv_call.attrs.kernel_layout != "OIHW" or conv_call.attrs.data_layout != "NCHW":
            return orig
        # Only a conv (and bias add) known to have this one user may change: a value made
        # earlier in this round is not in ``uses`` and waits for the next round's count.
        if uses.get(conv_call) != 1 or (with_bias in m and uses.get(m[with_bias]) != 1):
            return orig
        weight = conv_call.args[1].value.numpy().astype(np.float64)
        channels = weight.shape[0]
        b = (
            np.zeros(channels)
            if bias_src not in m
            else m[bias_src].value.numpy().reshape(-1).astype(np.float64)
        )
        if b.size != channels:
            return orig
        if isinstance(orig, relax.TupleGetItem):
            call = m[bn_call]
            a = call.attrs
            if bool(a.training) or int(a.axis) != 1:
                return orig
            gamma, beta, mean, var = (s.value.numpy().astype(np.float64) for s in call.args[1:5])
            s = (gamma if bool(a.scale) else 1.0) / np.sqrt(var + float(a.epsilon))
            new_w, new_b = weight * s[:, None, None, None], (b - mean) * s + (beta if bool(a.center) else 0.0)
        elif orig.op.name == "relax.multiply":
            c = _channel_vector(m[scale], channels)
            if c is None:
                return orig
            new_w, new_b = weight * c[:, None, None, None], b * c
        else:
            c = _channel_vector(m[shift], channels)
            if c is None:
                return orig
            new_w, new_b = weight, b + c
        new_conv = relax.Call(
            conv_call.op, [conv_call.args[0], relax.const(new_w.astype(np.float32))], conv_call.attrs
        )
        return relax.op.add(new_conv, relax.const(new_b.astype(np.float32).reshape(1, channels, 1, 1)))

    return _rounds_pass(pattern, rewrite, entry, rounds, "FoldConvAffine")


def FoldChannelAffine(entry: str = "main", rounds: int = 8) -> tvm.transform.Pass:
    """Inference batch norms that no convolution took, and the per-channel multiplies and adds
    by constants after them, become one ``x * scale + shift`` (constants of shape (1, C, 1, 1)).

    ``batch_norm(x)[0]`` -> ``x * s + t``; then ``(x * s + t) * c`` -> ``x * (s c) + t c`` and
    ``(x * s + t) + c`` -> ``x * s + (t + c)`` when the inner values have no other user; repeated
    (at most ``rounds`` times, until nothing changes). Run after :func:`FoldConvAffine`, so a batch
    norm after a convolution is folded into its weights first.
    """
    x = wildcard()
    stats = [is_const() for _ in range(4)]
    bn_call = is_op("relax.nn.batch_norm")(x, *stats)
    bn = is_tuple_get_item(bn_call, 0)
    s, t, c = is_const(), is_const(), is_const()
    mul = is_op("relax.multiply")(x, s)
    affine = is_op("relax.add")(mul, t)
    pattern = bn | is_op("relax.multiply")(affine, c) | is_op("relax.add")(affine, c)

    def rewrite(orig: Any, m: dict, uses: dict) -> Any:
        shape = expr_shape(m[x])
        if shape is None or len(shape) != 4 or not all_float32(m[x]):
            return orig
        channels = shape[1]
        if isinstance(orig, relax.TupleGetItem):
            a = m[bn_call].attrs
            if bool(a.training) or int(a.axis) != 1:
                return orig
            gamma, beta, mean, var = (v.value.numpy().astype(np.float64) for v in m[bn_call].args[1:5])
            scale = (gamma if bool(a.scale) else 1.0) / np.sqrt(var + float(a.epsilon))
            shift = (beta if bool(a.center) else 0.0) - mean * scale
        else:
            if uses.get(m[affine]) != 1 or uses.get(m[mul]) != 1:
                return orig
            scale, shift = _channel_vector(m[s], channels), _channel_vector(m[t], channels)
            other = _channel_vector(m[c], channels)
            if scale is None or shift is None or other is None:
                return orig
            if orig.op.name == "relax.multiply":
                scale, shift = scale * other, shift * other
            else:
                shift = shift + other
        if scale.shape != (channels,) or shift.shape != (channels,):
            return orig
        as_const = lambda v: relax.const(v.astype(np.float32).reshape(1, channels, 1, 1))
        return relax.op.add(relax.op.multiply(m[x], as_const(scale)), as_const(shift))

    return _rounds_pass(pattern, rewrite, entry, rounds, "FoldChannelAffine")


def _rounds_pass(pattern: Any, rewrite: Any, entry: str, rounds: int, name: str) -> tvm.transform.Pass:
    """Rewrite ``pattern`` matches with ``rewrite(orig, match, use_counts)`` in rounds (use counts
    taken afresh each round) until a round changes nothing, at most ``rounds`` times."""

    def fold(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        for _ in range(rounds):
            uses = _use_counts(mod[entry])
            folded = []

            def fold_one(orig: Any, m: dict, uses: dict = uses, folded: list = folded) -> Any:
                new = rewrite(orig, m, uses)
                if new is not orig:
                    folded.append(new)
                return new

            mod = _rewrite(mod, entry, pattern, fold_one)
            if not folded:
                break
        return mod

    return tvm.transform.module_pass(fold, opt_level=0, name=name)


def _channel_vector(const: tvm.ir.Constant, channels: int) -> np.ndarray | None:
    """A per-output-channel (or scalar) constant of an NCHW tensor as a length-C vector."""
    value = const.value.numpy().astype(np.float64)
    if value.ndim > 4:
        return None
    padded = value.reshape((1,) * (4 - value.ndim) + value.shape)
    if padded.shape == (1, 1, 1, 1):
        return np.full(channels, padded.item())
    if padded.shape == (1, channels, 1, 1):
        return padded.reshape(-1)
    return None


def _use_counts(func: relax.Function) -> dict[Any, int]:
    """Number of uses of each bound value (keyed by the value, as DPL matches return values)."""
    value_of = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    return {value_of[var]: n for var, n in use_counts(func).items() if var in value_of}


def _rewrite(mod: tvm.IRModule, entry: str, pattern: Any, rewriter: Any) -> tvm.IRModule:
    func = rewrite_call(pattern, rewriter, mod[entry])
    mod = mod.clone()
    mod[entry] = func
    return relax.transform.DeadCodeElimination([entry])(mod)


def _rewrite_pass(pattern: Any, rewriter: Any, entry: str, name: str) -> tvm.transform.Pass:
    return tvm.transform.module_pass(
        lambda mod, _ctx: _rewrite(mod, entry, pattern, rewriter), opt_level=0, name=name
    )


def UnshareConstantReshapes(entry: str = "main") -> tvm.transform.Pass:
    """Give every reader of a ``reshape`` / ``permute_dims`` of a constant its own copy.

    A region must not take in a value that something outside also reads; with one copy per
    reader, each conv + bias match keeps its bias. The copies are of constants, so they cost
    nothing once fused (and a reshape kernel of a bias otherwise).
    """

    def unshare(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        func = mod[entry]
        shared = {
            b.var: b.value
            for block in func.body.blocks
            for b in block.bindings
            if isinstance(b.value, relax.Call)
            and isinstance(b.value.op, tvm.ir.Op)
            and b.value.op.name in ("relax.reshape", "relax.permute_dims")
            and isinstance(b.value.args[0], tvm.ir.Constant)
        }
        read: set[relax.Var] = set()
        blocks, changed = [], False
        for block in func.body.blocks:
            bindings: list[relax.Binding] = []
            for b in block.bindings:
                value = b.value
                if isinstance(value, relax.Call) and isinstance(block, relax.DataflowBlock):
                    args = []
                    for arg in value.args:
                        if isinstance(arg, relax.Var) and arg in shared and arg in read:
                            copy = relax.DataflowVar(arg.name, arg.ty)
                            bindings.append(relax.VarBinding(copy, shared[arg]))
                            arg, changed = copy, True
                        elif isinstance(arg, relax.Var) and arg in shared:
                            read.add(arg)
                        args.append(arg)
                    value = relax.Call(value.op, args, value.attrs, value.ty_args)
                bindings.append(relax.VarBinding(b.var, value) if isinstance(b, relax.VarBinding) else b)
            blocks.append(same_kind_block(block, bindings))
        return with_entry_body(mod.clone(), entry, func, blocks) if changed else mod

    return tvm.transform.module_pass(unshare, opt_level=0, name="UnshareConstantReshapes")
