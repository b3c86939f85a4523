"""Relax patterns that more than one backend matches: the one statement of each decomposition's shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.transform import FusionPattern

from .constant_values import scalar_value

#: Attribute of an LRN composite: its alpha, beta and k as JSON.
LRN_ATTR = "tvm_hetero.lrn"


def lrn_pattern(name: str, check: Callable[[Any], bool]) -> FusionPattern:
    """The frontends' local response norm across channels: ``x / (k + alpha * avg_pool3d(x * x
    over a window of channels))**beta`` (ONNX LRN, Inception-v1), one region named ``name`` where
    ``check`` accepts the match; the composite records its scalars under :data:`LRN_ATTR`."""
    x = wildcard()
    alpha, k, beta = is_const(), is_const(), is_const()
    pooled = is_op("relax.nn.avg_pool3d")(is_op("relax.expand_dims")(is_op("relax.multiply")(x, x)))
    scaled = is_op("relax.add")(is_op("relax.multiply")(is_op("relax.squeeze")(pooled), alpha), k)
    out = is_op("relax.divide")(x, is_op("relax.power")(scaled, beta))
    ann = {"anchor": pooled, "data": x, "alpha": alpha, "k": k, "beta": beta, "pool": pooled}

    def constants(matched: dict) -> dict[str, str]:
        """The scalars, recorded on the composite: it receives constants as parameters."""
        return {LRN_ATTR: json.dumps({n: scalar_value(matched[n]) for n in ("alpha", "beta", "k")})}

    return FusionPattern(name, out, ann, check, constants)
