"""Calibration inputs of a decoder's graphs: real calls, as the generation loop makes them.

A graph quantized at build (an accelerator with a calibrated precision, e.g. ``"a16w8"``) takes its
ranges from the values it sees in calibration (:mod:`tvm_hetero.ep_offload.region_quantization`),
and the build verifies it on the first of them. Random cache rows (``graph_io.sample_inputs``) are
not what a layer's attention reads; so the inputs here come from the decoder itself: a random prompt
runs through the host's fp32 decode graph, token by token, and each sample is the ``n``-row call
that continues it -- the prompt's next tokens, their positions and masks, and the cache exactly as
the host wrote it. Samples differ in their prompt and in how full the cache is (from empty to all but
the call's rows), so the ranges cover a first chunk as well as a late one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph_io import chunk_inputs, key_cache, value_cache

#: Calibration calls per graph. On the tiny Llama's 8-row A16W8 graph, 8 calls it was not calibrated
#: on were 5-22e-2 off fp32 after 4 calibration calls, 3-12e-2 after 16 and the same after 32.
SAMPLES = 16


def needs_real_calls(phase_targets: dict) -> bool:
    """Whether a phase's targets hold a device whose graphs the build quantizes (calibrated)."""
    from ..devices import parse_spec
    from ..ep_offload.region_quantization import quantizes

    return any(quantizes(parse_spec(t).options) for targets in phase_targets.values() for t in targets)


def real_calls(host_model: Any, size: int, samples: int = SAMPLES, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``samples`` inputs of the ``size``-row graph, each a real call after a prompt that
    ``host_model`` (a model whose decode graph runs on the host in fp32) processed (module docstring)."""
    cfg, capacity = host_model.config, host_model.capacity
    rng = np.random.default_rng(seed)
    most = max(0, capacity - size)
    out = []
    session = host_model.session()
    for sample in range(samples):
        filled = most * sample // max(samples - 1, 1)
        tokens = rng.integers(0, cfg.vocab_size, filled + size).astype(np.int32)
        session.cache.reset()
        for token in tokens[:filled]:
            session.decode(int(token))
        call = chunk_inputs(tokens[filled:], filled, capacity)
        for layer, (keys, values) in enumerate(session.cache.tensors):
            call[key_cache(layer)], call[value_cache(layer)] = keys.numpy().copy(), values.numpy().copy()
        out.append(call)
    return out
