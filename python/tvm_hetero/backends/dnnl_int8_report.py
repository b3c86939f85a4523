"""The build report's line on a QDQ model: how many of its units ran in int8, how many otherwise,
and why each fallback fell back.

Counted from what the build made (the oneDNN region documents and the graph's nodes), per unit of
the model as given (:func:`.qdq.find_qdq_units`):

- **int8 in oneDNN**: a step computing in integers (``quant`` on a conv, matmul, add, pooling,
  concat or scale-shift step), by kind, once per graph node calling its region;
- **float inside oneDNN blocks**: a float step between a dequantize and a quantize step of a block
  (an LRN, a softmax, a layer norm, a batch matmul of two activations);
- **moved on the integers**: a reshape / transpose between a dequantize and a quantize of one scale
  and zero point (exact; ``dnnl_int8_rewrites.simplify_qdq``), and **removed**: an op that computes
  nothing (an inference ``Dropout``);
- **fallback to TVM kernels**: the rest, each with its reason (:func:`fallback_reason`: what the
  int8 patterns do not take). Where fewer reasons are known than units fell back, the remainder is
  said as such ("no int8 pattern matched").
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import tvm

from .qdq import QdqUnit, find_qdq_units

#: Unit kinds the int8 patterns take (through the rewrites: a batch norm, multiply or add by
#: constants becomes a scale-shift, a global mean a pooling).
INT8_KINDS = frozenset({"conv2d", "matmul", "add", "max_pool2d", "avg_pool2d", "mean", "concat", "batch_norm",
                        "multiply", "divide"})
#: The float ops an int8 unit may hold (an anchor and what the patterns fuse with it).
_INT8_OPS = frozenset({"relax.nn.conv2d", "relax.matmul", "relax.add", "relax.nn.relu", "relax.clip",
                       "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.mean", "relax.concat",
                       "relax.nn.batch_norm", "relax.multiply", "relax.divide", "relax.reshape",
                       "relax.permute_dims", "relax.broadcast_to", "relax.stack", "relax.sum"})  # ONNX Sum
#: Unit kinds that only move values, and those that compute nothing at inference.
MOVE_KINDS = frozenset({"reshape", "permute_dims", "squeeze", "expand_dims", "flatten"})
NO_OP_KINDS = frozenset({"dropout"})


def fallback_reason(unit: QdqUnit) -> str | None:
    """Why ``unit`` cannot run as a oneDNN int8 step, or None when a pattern should take it."""
    other = sorted({n.removeprefix("relax.").removeprefix("nn.") for n in unit.op_names
                    if n is not None and n not in _INT8_OPS})
    if unit.kind not in INT8_KINDS or other:
        return f"no oneDNN int8 form for {', '.join(other or [unit.kind])}"
    if unit.kind in ("add", "multiply", "divide"):
        rank = getattr(unit.anchor_call.ty, "ndim", -1)
        if len(unit.activations) == 2 and unit.kind != "add":
            return f"{unit.kind} of two activations"
        if len(unit.activations) == 1 and rank != 4:
            return f"{unit.kind} of a constant on a rank-{rank} tensor (the int8 scale-shift is per channel of NCHW)"
    if any(a.per_channel for a in unit.activations):
        return "per-channel activation scale"
    if unit.quantize is not None and unit.quantize.per_channel:
        return "per-channel output scale"
    if unit.kind == "matmul" and unit.weight is None:
        return "matmul of two activations (no int8 batch matmul)"
    if unit.weight is not None and (unit.weight.dtype != "int8" or np.any(unit.weight.zero_point)):
        return "weights not int8 with zero point 0 (run in float)"
    return None


def qdq_report(mod: tvm.IRModule, region_docs: list[str], node_funcs: list[str], entry: str = "main") -> str | None:
    """One line on how the QDQ units of ``mod`` (the module as given to the build) ran, or None for a
    model without any (see the module docstring). ``region_docs``: the oneDNN region documents the
    build's libraries hold; ``node_funcs``: the function each graph node calls."""
    units = find_qdq_units(mod[entry])
    if not units:
        return None
    calls = Counter(node_funcs)
    int8: Counter = Counter()
    in_block: Counter = Counter()
    for doc in region_docs:
        for region in json.loads(doc).get("regions", []):
            n = calls.get(region["name"], 0)
            steps = region["steps"] if region.get("op") == "block" else [region]
            for k, step in enumerate(steps):
                op = step["op"]
                if "quant" in step and op not in ("quantize", "dequantize"):
                    int8[op] += n
                elif op == "quantize" and k > 0 and steps[k - 1]["op"] not in ("quantize", "dequantize"):
                    in_block[steps[k - 1]["op"]] += n
    moved = Counter(u.kind for u in units if u.kind in MOVE_KINDS and _one_scale(u))
    removed = Counter(u.kind for u in units if u.kind in NO_OP_KINDS)
    done = sum(int8.values()) + sum(in_block.values()) + sum(moved.values()) + sum(removed.values())
    fallback = max(len(units) - done, 0)
    reasons: Counter = Counter()
    # Units that ran as float steps inside a block are no fallbacks.
    block_left = Counter(in_block)
    for u in units:
        if u.kind in MOVE_KINDS and _one_scale(u) or u.kind in NO_OP_KINDS:
            continue
        if block_left[_block_step(u)] > 0:
            block_left[_block_step(u)] -= 1
            continue
        reason = fallback_reason(u) if u.kind not in MOVE_KINDS else "a move that requantizes"
        if reason is not None and sum(reasons.values()) < fallback:
            reasons[f"{u.kind}: {reason}"] += 1
    if sum(reasons.values()) < fallback:
        reasons["no int8 pattern matched"] += fallback - sum(reasons.values())

    def kinds(d: Counter) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

    why = "; ".join(f"{k} x{v}" for k, v in sorted(reasons.items()))
    return (f"QDQ units: {len(units)}; int8 in oneDNN {sum(int8.values())} ({kinds(int8)}); "
            f"float inside oneDNN blocks {sum(in_block.values())} ({kinds(in_block)}); "
            f"moved on the integers {sum(moved.values())} ({kinds(moved)}); removed {sum(removed.values())} "
            f"({kinds(removed)}); fallback to TVM kernels {fallback}" + (f" ({why})" if why else ""))


def _block_step(unit: QdqUnit) -> str:
    """The oneDNN step before the quantize step when ``unit`` runs in float inside a block: the
    step of its last op (an LRN ends in the frontends' divide)."""
    last = unit.op_names[unit.ops.index(unit.output)] if unit.output in unit.ops else None
    name = (last or unit.kind).removeprefix("relax.").removeprefix("nn.")
    if name == "divide" and "relax.nn.avg_pool3d" in unit.op_names:
        return "lrn"
    if name == "matmul" and unit.weight is None:
        return "batch_matmul"
    return {"mean": "avg_pool2d"}.get(name, name)


def _one_scale(unit: QdqUnit) -> bool:
    """A move whose dequantize and quantize share one scale and zero point (it moves integers)."""
    if len(unit.activations) != 1 or unit.quantize is None:
        return False
    a, q = unit.activations[0], unit.quantize
    return all(x is not None and y is not None and x.size == 1 and y.size == 1 and x.reshape(-1)[0] == y.reshape(-1)[0]
               for x, y in ((a.scale, q.scale), (a.zero_point, q.zero_point))) and a.dtype == q.dtype


__all__ = ["INT8_KINDS", "fallback_reason", "qdq_report"]
