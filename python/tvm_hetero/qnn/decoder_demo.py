"""The decoder part of ``tvm-hetero demo-htp``: a tiny Llama-shaped checkpoint's prompt prefilled on
the HTP, its tokens decoded on the CPU (where the anchors' phone measurements, and our cost model
for this size, put a decode step), beside ONNX Runtime + QNN EP running the same prefill graph.

What it prints, per phase: the device, the graphs and their HTP executions (per chunk, per token),
the errors of the whole-path check against the host's fp32 graphs, and the speed -- modeled for the
HTP (QNN's cycles; the emulator's wall time is no HTP's), measured here for the CPU. Then the tokens
against ``transformers``' fp32 greedy ones, and the peer: the ONNX model our build handed QNN for the
prefill chunk, run by ONNX Runtime with the QNN EP (its default CPU fallback) on the inputs of the
demo's own first chunk, with its partitions and its error against ONNX Runtime's CPU EP in fp32,
beside ours on the same inputs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CAPACITY = 64
PREFILL_CHUNK = 8
PROMPT_TOKENS = 13
NEW_TOKENS = 16
CHECK_TOKENS = 16


@dataclass
class DecoderDemo:
    """What the decoder part found (the CLI prints it; tests read it)."""

    checkpoint: Path
    report: str
    tokens: list[int]
    reference: list[int]
    #: Per phase: the device names, HTP graph executions per call, calls made, and the speed line.
    phases: dict[str, dict] = field(default_factory=dict)
    #: The whole-path check (phase_check.py's result).
    check: dict | None = None
    #: Our HTP graph's error on the first chunk's inputs against ONNX Runtime's CPU EP in fp32.
    ours_error: float = float("nan")
    #: The peer on the same graph and inputs (qnn/peer.py's PeerResult) and its error.
    peer: Any = None
    peer_error: float = float("nan")
    build_seconds: float = 0.0

    @property
    def same_tokens(self) -> bool:
        return self.tokens == self.reference


def run(checkpoint: Path, reference: Callable[[list[int], int], list[int]], *, with_peer: bool = True,
        say: Callable[[str], None] = print, check_tokens: int = CHECK_TOKENS) -> DecoderDemo:
    """Build ``checkpoint`` (a Llama-shaped Hugging Face directory) with the prefill on the CPU and the
    HTP and the decode on the CPU, generate, and compare with ``reference(prompt, new_tokens)`` (the
    float greedy tokens) and the peer (module docstring)."""
    import tvm

    from .. import llm

    host = (tvm.cpu(0), "llvm")
    start = time.perf_counter()
    lm = llm.build(str(checkpoint), {"prefill": [host, "qnn-htp"], "decode": [host]}, capacity=CAPACITY,
                   prefill_chunks=(PREFILL_CHUNK,), check_tokens=check_tokens, progress=say)
    build_seconds = time.perf_counter() - start
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, lm.config.vocab_size, PROMPT_TOKENS)]
    session = lm.session()
    start = time.perf_counter()
    logits = session.prefill(prompt)
    prefill_seconds = time.perf_counter() - start
    tokens, decode_seconds = [], 0.0
    for step in range(NEW_TOKENS):
        tokens.append(int(np.argmax(logits)))
        if step == NEW_TOKENS - 1:
            break
        start = time.perf_counter()
        logits = session.decode(tokens[-1])
        decode_seconds += time.perf_counter() - start
    load = os.getloadavg()[0]
    demo = DecoderDemo(Path(checkpoint), lm.report(), tokens, reference(prompt, NEW_TOKENS),
                       check=lm.phase_check, build_seconds=build_seconds)
    stats = session.stats()
    for phase in ("prefill", "decode"):
        graph = [g for g in lm.graphs if g.phase == phase][-1]  # the largest prefill chunk
        demo.phases[phase] = {"devices": [_device_name(d) for d in graph.devices], "calls": stats[phase]["calls"],
                              "executions_per_call": graph.accelerator_executions,
                              "executions": stats[phase]["accelerator_graph_executions"], "graph": graph}
    demo.phases["prefill"]["speed"] = _speed(demo.phases["prefill"], len(prompt), prefill_seconds, load)
    demo.phases["decode"]["speed"] = _speed(demo.phases["decode"], NEW_TOKENS - 1, decode_seconds, load)
    if with_peer:
        _side_by_side(demo, lm, prompt)
    return demo


def _device_name(device: Any) -> str:
    from ..compiler.build import device_name

    return device_name(device)


def _speed(phase: dict, tokens: int, seconds: float, load: float) -> str:
    """Tokens/s: modeled for a phase on the HTP (its graph's QNN cycles; host work not counted),
    measured here for one on the host alone."""
    graph = phase["graph"]
    modeled = (graph.offload or {}).get("modeled") if graph.accelerator_executions else None
    if modeled:
        per_call = modeled["seconds"]
        return (f"{graph.size / per_call:,.0f} tok/s modeled on the HTP per full chunk ({per_call * 1e3:.3f} ms per "
                f"graph execution: {modeled['cycles'] / 1e6:.2f} M cycles x {modeled['us_per_cycle']:.3g} us + the "
                "call; the emulator's wall time is no HTP's)")
    return f"{tokens / seconds:,.0f} tok/s measured here ({tokens} tokens in {seconds * 1e3:.1f} ms, load {load:.1f})"


def _side_by_side(demo: DecoderDemo, lm: Any, prompt: list[int]) -> None:
    """Our prefill graph's HTP part and the peer on the same ONNX model and the same inputs: those of
    the demo's first chunk, taken under verification (which also gives our error against fp32)."""
    from ..ep_offload.region_runner import verifying
    from . import peer

    graph = demo.phases["prefill"]["graph"]
    if not graph.accelerator_models:
        return
    session = lm.session()
    with verifying(graph.accelerator_models) as results:
        session.runners[graph.size].run(np.asarray(prompt[:graph.size], np.int32), session.cache)
    region, check = next(iter(results.items()))
    demo.ours_error = check.relative_error
    model = graph.accelerator_models[region]
    demo.peer = peer.run_peer(model, check.feeds, repeat=1, warmup=0, isolated=True, timeout=600)
    if demo.peer.ran and demo.peer.outputs:
        demo.peer_error = peer.relative_error(demo.peer.outputs, peer.cpu_reference(model, check.feeds))


def print_demo(demo: DecoderDemo) -> None:
    """The decoder part's lines (after the build's progress)."""
    print(demo.report)
    print(f"\ndecoder: {PROMPT_TOKENS}-token prompt, {NEW_TOKENS} new tokens (greedy), capacity {CAPACITY}, "
          f"built in {demo.build_seconds:.1f} s")
    for phase in ("prefill", "decode"):
        p = demo.phases[phase]
        unit = f"chunk of {p['graph'].size}" if phase == "prefill" else "token"
        print(f"  {phase:<7} on {' + '.join(p['devices'])}: {p['calls']} call(s), {p['executions_per_call']} HTP graph "
              f"execution(s) per {unit} ({p['executions']} in all); {p['speed']}")
    if demo.check:
        check = demo.check
        buckets = ", ".join(f"{size} rows {e:.1e}" for size, e in sorted(check["buckets"].items()))
        decode = check["decode"]
        print(f"  errors (whole-path check against the host's fp32 graphs, logits relative to the largest): prefill "
              f"{buckets}; decode over {decode['steps']} teacher-forced tokens {decode['max_error']:.1e}, "
              f"greedy agreement {decode['agreement']}/{decode['steps']}")
    verdict = "the same" if demo.same_tokens else "DIFFERENT"
    print(f"  tokens: {demo.tokens}: {verdict} as transformers' fp32 greedy tokens")
    if demo.peer is None:
        return
    print(f"  our prefill graph's HTP part on the first chunk: 1 QNN graph, relative error vs ONNX Runtime CPU fp32 "
          f"{demo.ours_error:.1e}")
    result = demo.peer
    if result.ran:
        verdict = "WRONG, without a warning" if demo.peer_error > 5e-2 else "right"
        print(f"  ONNX Runtime + QNN EP on the same graph and inputs: {result.partitions} QNN partition(s), "
              f"{result.nodes_qnn} nodes on QNN, {result.nodes_cpu} on its CPU EP, relative error "
              f"{demo.peer_error:.1e} ({verdict})")
    else:
        print(f"  ONNX Runtime + QNN EP on the same graph: did not finish: {result.error}")
