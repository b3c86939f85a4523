"""An average pool whose one window covers its whole input is a global mean: write it as one.

Inception-v1 ends with a 7x7 AveragePool, stride 1, padded by one row and column at the bottom and
right and not counting the padding, over a 6x6 map (the light model's): one output, the mean of all
36 values. QNN computes that pool wrongly (about 50% off at 32-128 channels; at 256 channels and
more the emulator's process dies), ONNX Runtime + QNN EP returns it without a word, and our
verification moves it back to the host, which cuts the model's QNN graph in two. As
``mean(x, axis=[2, 3], keepdims=True)`` (ONNX ReduceMean) QNN computes it right.

Rule: ``avg_pool2d`` in NCHW with a 1x1 output whose single window, placed at ``-pad_top,
-pad_left``, covers every row and column of the input, with padding not counted (or no padding),
becomes the mean over axes 2 and 3. Guarantee: the same value, element for element (the window
holds exactly the input's values, and the divisor is their count, since padding is not counted).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from ..ir.relax_helpers import static_shape


def PoolAsMean(entry: str = "main") -> tvm.transform.Pass:
    pattern = is_op("relax.nn.avg_pool2d")(wildcard())

    def rewrite(call: relax.Call, _m: dict) -> Any:
        return relax.op.mean(call.args[0], axis=[2, 3], keepdims=True) if covers_whole_input(call) else call

    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        mod = mod.clone()
        mod[entry] = rewrite_call(pattern, rewrite, mod[entry])
        return mod

    return tvm.transform.module_pass(run, opt_level=0, name="PoolAsMean")


def covers_whole_input(call: relax.Call) -> bool:
    """Whether ``call`` (an ``avg_pool2d``) is one window over its whole input (module rule)."""
    attrs = call.attrs
    if str(attrs.layout) != "NCHW" or str(attrs.out_layout) != "NCHW":
        return False
    shape = static_shape(call.args[0].ty)
    out = static_shape(call.ty)
    if shape is None or out is None or out[2:] != (1, 1):
        return False
    top, left, bottom, right = (int(p) for p in attrs.padding)
    if (top or left or bottom or right) and bool(attrs.count_include_pad):
        return False
    if any(int(d) != 1 for d in attrs.dilation):
        return False
    kh, kw = (int(k) for k in attrs.pool_size)
    height, width = shape[2], shape[3]
    # The window [-top, -top + kh) must hold every row [0, height), and likewise for columns.
    return top >= 0 and left >= 0 and kh - top >= height and kw - left >= width
