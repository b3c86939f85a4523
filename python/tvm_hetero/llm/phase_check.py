"""The whole-path check of a decoder whose graphs run (partly) on an accelerator: teacher-forced
against the same graphs built for the host alone, in fp32.

The build verifies each accelerator graph on its own inputs (:mod:`tvm_hetero.ep_offload.verified_build`);
errors that pass there can still add up over layers, chunks and steps. This check runs the model
itself:

1. **Per prefill bucket**: a prompt of exactly that many tokens runs as one call of that bucket, in
   both models; the logits of the last row are compared.
2. **Decode, teacher-forced**: after a prompt, both models are fed the *reference's* greedy token at
   every step (so one early disagreement does not send the two down different paths), for
   ``tokens`` steps; the logits are compared at every step, and the greedy tokens the model would
   have chosen are counted where they agree with the reference's.

An error is ``max |logits - reference| / max |reference|`` per step. A graph on the accelerator
whose worst error exceeds the tolerance fails; the builder then moves that bucket (or the decode graph) to the host
graph it built for the reference, with a warning (builder.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: Logits' error relative to the largest reference logit that a phase on an fp16 accelerator may have.
#: fp16 keeps 11 bits: over a whole decoder (every layer in one graph, then 64 decode steps reading
#: rows it wrote) the tiny test models reach 1-4e-2 with every greedy token but a few agreeing
#: (docs/performance.md, the decoders section); a wrong op is off by the logits' own size.
LOGITS_TOLERANCE = 5e-2


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    scale = max(float(np.abs(expected).max()), 1e-30)
    return float(np.abs(got.astype(np.float64) - expected).max()) / scale


def teacher_forced(model: Any, reference: Any, tokens: int, tolerance: float = LOGITS_TOLERANCE,
                   seed: int = 0) -> dict:
    """Both checks (module docstring) of ``model`` against ``reference`` (the same graphs on the
    host). Returns ``{"tolerance", "buckets": {size: error}, "decode": {"steps", "errors", "max_error",
    "agreement", "prompt"}, "failed": [sizes]}`` (size 1 is the decode graph)."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    session, ref_session = model.session(), reference.session()
    buckets = {}
    for size in model.prefill_chunks:
        ids = rng.integers(0, vocab, size).astype(np.int32)
        buckets[size] = relative_error(_one_chunk(session, size, ids), _one_chunk(ref_session, size, ids))
    prompt_length = max(1, min(max(model.prefill_chunks, default=1), model.capacity - tokens))
    prompt = rng.integers(0, vocab, prompt_length).astype(np.int32)
    steps = _decode_steps(session, ref_session, prompt, min(tokens, model.capacity - prompt_length + 1))
    decode = {"prompt": int(prompt_length), **steps}
    # only a graph on the accelerator can fail (the host's graphs are the reference's own)
    on_device = {g.size for g in model.graphs if g.accelerator_executions}
    failed = [size for size, error in buckets.items() if error > tolerance and size in on_device]
    if 1 in on_device and decode["steps"] > 1 and max(decode["errors"][1:]) > tolerance:
        failed.append(1)
    return {"tolerance": tolerance, "buckets": buckets, "decode": decode, "failed": failed}


def _one_chunk(session: Any, size: int, ids: np.ndarray) -> np.ndarray:
    """The logits of ``ids`` run as one call of the ``size`` bucket on an empty cache."""
    session.cache.reset()
    runner = session.runners[size]
    runner.run(ids, session.cache)
    return runner.logits.copy()


def _decode_steps(session: Any, ref_session: Any, prompt: Sequence[int], tokens: int) -> dict:
    """Step 0 is the prompt's logits; every later step decodes the reference's previous greedy token."""
    got, expected = session.prefill(prompt).copy(), ref_session.prefill(prompt).copy()
    errors, agree = [], 0
    for step in range(tokens):
        errors.append(relative_error(got, expected))
        token = int(np.argmax(expected))
        agree += int(np.argmax(got)) == token
        if step == tokens - 1:
            break
        got, expected = session.decode(token).copy(), ref_session.decode(token).copy()
    return {"steps": tokens, "errors": errors, "max_error": max(errors), "agreement": agree}
