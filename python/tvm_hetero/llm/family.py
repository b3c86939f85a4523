"""What each decoder family's file provides to the builder."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from tvm import relax

from .config import DecoderConfig


class Family(NamedTuple):
    """A family's graph builder: the checkpoint tensors it reads (Hugging Face name -> shape), the
    weights it derives from the configuration, and its entry function (symbolic chunk length)."""

    weight_shapes: Callable[[DecoderConfig], dict[str, tuple[int, ...]]]
    derived_weights: Callable[[DecoderConfig, int], dict[str, np.ndarray]]
    entry_function: Callable[[DecoderConfig, int], relax.Function]
