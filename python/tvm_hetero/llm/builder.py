"""``tvm_hetero.llm.build`` (a checkpoint) and ``load`` (an exported directory): the two ways to a
:class:`.LanguageModel`.

The family's entry function has a symbolic chunk length; each chunk size (the prefill chunks and
1 for decode) is bound with ``relax.transform.BindSymbolicVars`` and compiled by the ordinary
static build (``tvm_hetero.build``, oneDNN for the matmuls). The weights are function parameters
(given as ``params``, so no bucket embeds them), stored once and shared by every runtime.

``weights="int8"`` stores the matmul weights in 8 bits (int8_weights.py) and measures, once, how
closely the result follows float32 (int8_agreement.py): a float32 decode graph is built beside it
for that and dropped afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import tvm
from tvm import relax

from ..build_driver import build as build_graph
from .architectures import family_builder
from .buckets import check_sizes
from .checkpoint import load_weights, read_checkpoint
from .entry_graphs import EntryGraph, create_runtimes
from .export import read_exported
from .family import graph_weight_shapes, graph_weights
from .int8_agreement import measure_agreement
from .int8_weights import check_weight_format, quantize_weights, quantized_shapes
from .model import LanguageModel

PHASES = ("prefill", "decode")
DEFAULT_PREFILL_CHUNKS = (16, 64, 256)


def build(model: Any, targets: Any = None, *, capacity: int = 512,
          prefill_chunks: Sequence[int] = DEFAULT_PREFILL_CHUNKS, backends: Any = None,
          device_options: Any = None, progress: Callable[[str], None] | None = None,
          weights: str = "float32", agreement_tokens: int = 64) -> LanguageModel:
    """Compile a decoder-only model for generation.

    model : a Hugging Face checkpoint directory (config.json + safetensors) or a ``transformers``
        model (Llama, Qwen2, GPT-2).
    targets : as for :func:`tvm_hetero.build` (default ``[(tvm.cpu(0), "llvm")]``), for both
        phases, or ``{"prefill": targets, "decode": targets}``.
    capacity : tokens the KV cache holds (prompt plus generated tokens).
    prefill_chunks : the chunk sizes prompts are processed in (the last chunk is padded).
    backends : as for :func:`tvm_hetero.build` (None: oneDNN on CPUs).
    device_options : the runtimes' executor settings, one entry per device (``[{"cores": [0],
        "num_threads": 1}]``: one thread pinned to core 0), for both phases or per phase as ``targets``.
    weights : how the matmul weights are stored: ``"float32"`` (the checkpoint's values) or
        ``"int8"`` (8 bits per weight, a scale per output channel; docs/llm.md).
    agreement_tokens : with ``weights="int8"``, greedy tokens compared with float32 (0: none).
    """
    say = progress or (lambda _msg: None)
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    check_weight_format(weights)
    phase_targets = _per_phase(targets if targets is not None else [(tvm.cpu(0), "llvm")], "targets")
    phase_options = _per_phase(device_options, "device_options")
    sizes = check_sizes(prefill_chunks, capacity)
    checkpoint = read_checkpoint(model)
    cfg = checkpoint.config
    family = family_builder(cfg)
    params = graph_weights(family, cfg, load_weights(checkpoint, family.weight_shapes(cfg)), capacity)
    shapes = graph_weight_shapes(family, cfg, capacity)
    reference = (shapes, params) if weights == "int8" and agreement_tokens > 0 else None  # until compared
    if weights == "int8":
        names = family.matmul_weights(cfg)
        params, shapes = quantize_weights(dict(params), names), quantized_shapes(shapes, names)
    graphs = _compile(family, cfg, capacity, shapes, params, sorted(set(sizes) | {1}), phase_targets, backends, say)
    blob = _params_blob(params)
    create_runtimes(graphs, blob, "weights", phase_options)
    weight_bytes = sum(v.nbytes for v in params.values())
    del params, blob
    lm = LanguageModel(cfg, capacity, graphs, weight_bytes, checkpoint.tokenizer_file, checkpoint.source, weights)
    if reference is not None:
        say("comparing the 8-bit model with float32")
        float_shapes, float_params = reference
        float_graphs = _compile(family, cfg, capacity, float_shapes, float_params, [1], phase_targets, backends, say)
        create_runtimes(float_graphs, _params_blob(float_params), "float32 weights", phase_options)
        float_lm = LanguageModel(cfg, capacity, float_graphs, 0)
        lm.agreement = measure_agreement(lm, float_lm, agreement_tokens)
    return lm


def _compile(family: Any, cfg: Any, capacity: int, shapes: dict, params: dict, sizes: list[int],
             phase_targets: dict, backends: Any, say: Callable[[str], None]) -> list[EntryGraph]:
    """One static graph per chunk size, bound from the family's symbolic entry function."""
    symbolic = tvm.IRModule({"main": family.entry_function(cfg, capacity, shapes)})
    graphs = []
    for size in sizes:
        phase = "decode" if size == 1 else "prefill"
        say(f"building the {phase} graph of {size} row(s)")
        start = time.perf_counter()
        static = relax.transform.BindSymbolicVars({"n": size})(symbolic)
        artifact = build_graph(static, phase_targets[phase], params=params, backends=backends)
        graphs.append(EntryGraph(size, phase, artifact.graph_json, artifact.lib, list(artifact.devices),
                                 artifact.build_report, time.perf_counter() - start))
    return graphs


def _params_blob(params: dict) -> bytes:
    return bytes(tvm.runtime.save_param_dict({k: tvm.runtime.tensor(v) for k, v in params.items()}))


def _per_phase(value: Any, what: str) -> dict[str, Any]:
    """``{"prefill": ..., "decode": ...}`` from one value for both phases or a dict per phase."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(PHASES))
        missing = [p for p in PHASES if p not in value]
        if unknown or missing:
            raise ValueError(f"{what} per phase need exactly the keys {list(PHASES)}; unknown {unknown}, "
                             f"missing {missing}")
        return dict(value)
    return dict.fromkeys(PHASES, value)


def load(path: str | os.PathLike, device_options: Any = None) -> LanguageModel:
    """A model written by ``LanguageModel.export``, every file checked first (docs/llm.md);
    ``device_options`` as for :func:`build`."""
    exported = read_exported(path, _per_phase(device_options, "device_options"))
    lm = LanguageModel(exported.config, exported.capacity, exported.graphs, exported.weight_bytes,
                       exported.tokenizer_file, str(path), exported.weights)
    lm.agreement = exported.agreement
    return lm
