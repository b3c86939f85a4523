"""8-bit weights with one scale per output channel, in the forms QNN's HTP takes (precision "a16w8").

ONNX Runtime's QNN configuration quantizes a MatMul's weight with one scale for the whole matrix.
Asked of the HTP emulator (onnxruntime-qnn 2.7.0; docs/performance.md), QNN takes a weight with a
scale per output channel when the scales are symmetric (zero point 128 for uint8) and the weight is
one of these inputs:

- a MatMul's constant 2-D ``(in, out)`` weight (input 1), channels on axis 1 (the QNN EP makes it a
  FullyConnected);
- a Gemm's weight (input 1): axis 0 with ``transB``, else axis 1;
- a 2-D Conv's weight (input 1, depthwise included): axis 0.

It refuses asymmetric per-channel weights ("backendValidateOpConfig() failed for node ... of type
FullyConnected" / "Conv2d" / "DepthWiseConv2d" "with error code 3110"), and a per-channel tensor read
by a Gather (its DequantizeLinear is then unsupported). A weight that other ops read too (a tied
embedding: the same table for the Gather and the output projection) therefore gets a copy of its own
for the ops above (:func:`per_channel_weights` rewrites the model); the other readers keep the
original, quantized as QNN's configuration says.

Guarantee: every override :func:`per_channel_weights` returns names an initializer that only inputs
of the list above read, each along the axis the override gives.
"""

from __future__ import annotations

import itertools
from typing import Any


def channel_axis(node: Any, index: int, rank: int) -> int | None:
    """The output-channel axis of input ``index`` of ``node`` if QNN takes it per channel, else None."""
    if index != 1:
        return None
    if node.op_type == "MatMul" and rank == 2:
        return 1
    if node.op_type == "Gemm" and rank == 2:
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    if node.op_type == "Conv" and rank == 4:
        return 0
    return None


def per_channel_weights(proto: Any) -> dict[str, list[dict]]:
    """The quantizer's overrides giving each weight QNN takes per channel a symmetric uint8 scale per
    output channel; ``proto`` (an ``onnx.ModelProto``) is rewritten in place so that no such weight is
    shared with another kind of reader (module docstring)."""
    from onnxruntime.quantization import QuantType

    initializers = {init.name: init for init in proto.graph.initializer}
    readers: dict[str, list[tuple[Any, int, int | None]]] = {}
    for node in proto.graph.node:
        for index, name in enumerate(node.input):
            if name in initializers:
                axis = channel_axis(node, index, len(initializers[name].dims))
                readers.setdefault(name, []).append((node, index, axis))
    overrides: dict[str, list[dict]] = {}
    taken = set(initializers)
    for name, uses in readers.items():
        for axis in sorted({axis for _node, _index, axis in uses if axis is not None}):
            own = name
            if any(a != axis for _node, _index, a in uses):  # shared with another reader: a copy of its own
                base = f"{name}_per_channel_axis{axis}"
                own = next(c for c in (f"{base}_{n}" if n else base for n in itertools.count()) if c not in taken)
                taken.add(own)
                copy = proto.graph.initializer.add()
                copy.CopyFrom(initializers[name])
                copy.name = own
                for node, index, a in uses:
                    if a == axis:
                        node.input[index] = own
            overrides[own] = [{"axis": axis, "quant_type": QuantType.QUInt8, "symmetric": True}]
    return overrides
