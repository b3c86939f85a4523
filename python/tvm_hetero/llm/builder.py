"""``tvm_hetero.llm.build`` (a checkpoint) and ``load`` (an exported directory): the two ways to a
:class:`.LanguageModel`.

The family's entry function has a symbolic chunk length; each chunk size (the prefill chunks and
1 for decode) is bound with ``relax.transform.BindSymbolicVars`` and compiled by the ordinary
static build (``tvm_hetero.build``, oneDNN for the matmuls). The weights are function parameters
(given as ``params``, so no bucket embeds them), stored once and shared by every runtime.

Float32 matmul weights are stored in 16-column panels when every phase runs on local CPUs with
oneDNN (panel_weights.py). ``weights="int8"`` stores the matmul weights in 8 bits (int8_weights.py)
and measures, once, how closely the result follows float32 (int8_agreement.py): a float32 decode graph is built beside it
for that and dropped afterwards. A graph with an accelerator among its devices is checked along the
whole path against the same graphs built for the host (phase_check.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import tvm
from tvm import relax

from ..build_driver import build as build_graph
from .architectures import family_builder
from .buckets import check_sizes
from .calibration import needs_real_calls, real_calls
from .checkpoint import load_weights, read_checkpoint
from .chunk_attention import wanted as chunk_kernel_wanted
from .decode_placement import choose
from .entry_graphs import EntryGraph, create_runtimes
from .export import read_exported
from .family import graph_weight_shapes, graph_weights
from .graph_io import sample_inputs
from .int8_agreement import measure_agreement
from .int8_weights import check_weight_format, quantize_weights, quantized_shapes
from .model import LanguageModel
from .packed_outputs import pack_outputs
from .panel_weights import panelled_names, store_in_panels, wanted_for
from .phase_check import LOGITS_TOLERANCE, teacher_forced
from .this_cpu import compiled_for, for_this_cpu

PHASES = ("prefill", "decode")
#: Build options only a build with an accelerator takes (verified_build.py).
ACCELERATOR_OPTIONS = ("calibration", "offload_tolerance", "verify_offload", "offload_min_group_flops",
                       "offload_exclude")
DEFAULT_PREFILL_CHUNKS = (16, 64, 256)


def build(model: Any, targets: Any = None, *, capacity: int = 512,
          prefill_chunks: Sequence[int] = DEFAULT_PREFILL_CHUNKS, backends: Any = None,
          device_options: Any = None, progress: Callable[[str], None] | None = None,
          weights: str = "float32", agreement_tokens: int = 64, check_tokens: int = 16,
          phase_tolerance: float | None = None, decode_placement: str = "targets",
          **build_options: Any) -> LanguageModel:
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
    check_tokens : when a graph runs on an accelerator, the decode steps of the whole-path check
        against the same graphs built for the host alone (phase_check.py; 0 skips it). A graph that
        fails it runs on the host instead, with a warning; ``lm.report()`` gives the result.
    phase_tolerance : that check's tolerance (logits' error relative to the largest reference logit).
    decode_placement : "targets" (the decode phase runs where its targets put it) or "cost": when the
        decode's targets hold an accelerator, it runs there only if one step costs less there (the
        device's measured or modeled figure) than on the host (measured here); decode_placement.py.
    build_options : passed to :func:`tvm_hetero.build` for every graph (``offload_tolerance``,
        ``verify_offload``, ``offload_min_group_flops``, ...).
    """
    say = progress or (lambda _msg: None)
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    check_weight_format(weights)
    if decode_placement not in ("targets", "cost"):
        raise ValueError(f"decode_placement must be 'targets' or 'cost', got {decode_placement!r}")
    phase_targets = {phase: for_this_cpu(t) for phase, t in
                     _per_phase(targets if targets is not None else [(tvm.cpu(0), "llvm")], "targets").items()}
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
    elif wanted_for(phase_targets, backends):
        params, shapes = store_in_panels(params, shapes, family.matmul_weights(cfg))
    in_panels = len(panelled_names(shapes))
    symbolic = family.entry_module(cfg, capacity, shapes)
    calibrator = _calibrator(symbolic, phase_targets, params, backends, cfg, capacity, say)
    graphs = []
    for size in sorted(set(sizes) | {1}):
        phase = "decode" if size == 1 else "prefill"
        say(f"building the {phase} graph of {size} row(s)")
        # A graph on the host alone is built for its size: its attention is one kernel over the
        # cache's filled rows (one_row_attention.py, chunk_attention.py); an accelerator's graph takes
        # the symbolic module's ops, which have ONNX forms.
        own_kernel = not _has_accelerator(phase_targets[phase]) and (size == 1 or chunk_kernel_wanted())
        module = family.entry_module(cfg, capacity, shapes, size) if own_kernel else symbolic
        graphs.append(_entry_graph(module, size, phase, phase_targets[phase], params, backends, build_options, cfg,
                                   capacity, calibrator))
    del calibrator
    blob = _params_blob(params)
    create_runtimes(graphs, blob, "weights", phase_options)
    weight_bytes = sum(v.nbytes for v in params.values())
    lm = LanguageModel(cfg, capacity, graphs, weight_bytes, checkpoint.tokenizer_file, checkpoint.source, weights)
    lm.weights_in_panels = in_panels
    lm.compiled_for = compiled_for([e for t in phase_targets.values() if isinstance(t, (list, tuple)) for e in t])
    if (check_tokens or decode_placement == "cost") and any(g.accelerator_executions for g in graphs):
        _check_whole_path(lm, symbolic, phase_targets, params, blob, backends, phase_options, check_tokens,
                          phase_tolerance, decode_placement == "cost", say)
    del params, blob  # the runtimes hold the weights now, once
    if reference is not None:
        say("comparing the 8-bit model with float32")
        float_shapes, float_params = reference
        float_symbolic = family.entry_module(cfg, capacity, float_shapes)
        float_graphs = [_entry_graph(float_symbolic, 1, "decode", _host_targets(phase_targets["decode"]), float_params,
                                     backends, {}, cfg, capacity)]
        create_runtimes(float_graphs, _params_blob(float_params), "float32 weights", phase_options)
        lm.agreement = measure_agreement(lm, LanguageModel(cfg, capacity, float_graphs, 0), agreement_tokens)
    return lm


def _params_blob(params: dict) -> bytes:
    return bytes(tvm.runtime.save_param_dict({k: tvm.runtime.tensor(v) for k, v in params.items()}))


def _calibrator(symbolic: tvm.IRModule, phase_targets: dict, weights: dict, backends: Any, cfg: Any, capacity: int,
                say: Callable[[str], None]) -> LanguageModel | None:
    """When an accelerator's graphs are quantized at build: the fp32 host decode graph whose real
    calls calibrate them (calibration.py); else None."""
    if not needs_real_calls(phase_targets):
        return None
    say("building the host's fp32 decode graph (the quantized graphs' calibration runs prompts through it)")
    graph = _entry_graph(symbolic, 1, "decode", _host_targets(phase_targets["decode"] + phase_targets["prefill"]),
                         weights, backends, {}, cfg, capacity)
    create_runtimes([graph], _params_blob(weights), "weights")
    return LanguageModel(cfg, capacity, [graph], 0)


def _entry_graph(symbolic: tvm.IRModule, size: int, phase: str, targets: Any, weights: dict, backends: Any,
                 build_options: dict, cfg: Any, capacity: int, calibrator: LanguageModel | None = None) -> EntryGraph:
    """The static graph of ``size`` rows, built for ``targets`` (an accelerator's graph calibrated on
    real calls through ``calibrator`` when given, else verified on :func:`sample_inputs`)."""
    start = time.perf_counter()
    free = relax.analysis.defined_symbolic_vars(symbolic["main"])
    static = relax.transform.BindSymbolicVars({"n": size})(symbolic) if free else symbolic  # else built for `size`
    packed = _has_accelerator(targets)  # one graph output for an accelerator
    if packed:
        static = pack_outputs(static)
        # the accelerator's graphs are verified on the inputs of a real call (ids in the vocabulary, ...);
        # one graph holds most of the decoder, so its error compounds over its layers as the whole path's
        # does: the same tolerance
        calibration = real_calls(calibrator, size) if calibrator is not None else [sample_inputs(cfg, capacity, size)]
        build_options = {"calibration": calibration, "offload_tolerance": LOGITS_TOLERANCE, **build_options}
    else:  # a phase on the host alone: the accelerator's options are not its build's
        build_options = {k: v for k, v in build_options.items() if k not in ACCELERATOR_OPTIONS}
    artifact = build_graph(static, targets, params=weights, backends=backends, **build_options)
    constants = {name: value for name, value in (artifact.params or {}).items() if name not in weights}
    return EntryGraph(size, phase, artifact.graph_json, artifact.lib, list(artifact.devices), artifact.build_report,
                      time.perf_counter() - start, constants=constants, packed=packed,
                      accelerator_models=dict(getattr(artifact, "offload_device_models", None) or {}))


def _has_accelerator(targets: Any) -> bool:
    """Whether an entry of ``targets`` runs no TVM kernels (an accelerator reached through its vendor)."""
    from ..devices import parse_spec, runs_tvm_kernels

    return any(not runs_tvm_kernels(parse_spec(t).device) for t in targets)


def _host_targets(targets: Any) -> list:
    """The entries of ``targets`` that run TVM kernels (an accelerator's entries left out)."""
    from ..devices import parse_spec, runs_tvm_kernels

    host = [t for t in targets if runs_tvm_kernels(parse_spec(t).device)]
    if not host:
        raise ValueError("a phase with an accelerator needs a host device that runs TVM kernels in its targets "
                         "(the graph's other ops, and the reference of the whole-path check)")
    return host


def _check_whole_path(lm: LanguageModel, symbolic: tvm.IRModule, phase_targets: dict, weights: dict, blob: bytes,
                      backends: Any, phase_options: dict, tokens: int, tolerance: float | None, by_cost: bool,
                      say: Callable[[str], None]) -> None:
    """Build every accelerator graph again for the host alone; run the teacher-forced check
    (phase_check.py) and move each graph that fails it to its host build, with a warning; with
    ``by_cost``, place the decode graph on the cheaper side (decode_placement.py)."""
    reference_graphs = []
    for graph in lm.graphs:
        if not graph.accelerator_executions:
            reference_graphs.append(dataclasses.replace(graph, runtime=None))
            continue
        say(f"building the {graph.phase} graph of {graph.size} row(s) for the host alone (the whole-path check's reference)")
        reference_graphs.append(_entry_graph(symbolic, graph.size, graph.phase, _host_targets(phase_targets[graph.phase]),
                                             weights, backends, {}, lm.config, lm.capacity))
    create_runtimes(reference_graphs, blob, "weights")
    reference = LanguageModel(lm.config, lm.capacity, reference_graphs, lm.weight_bytes)
    moved = False
    if tokens:
        moved = _move_failed_graphs(lm, reference, tokens, tolerance, say)
    decode = next(g for g in lm.graphs if g.size == 1)
    if by_cost and decode.accelerator_executions:
        choice = lm.decode_choice = choose(decode, reference.session())
        figures = (f"{choice['device']} {choice['device_seconds'] * 1e3:.3f} ms ({choice['device_source']}), host "
                   f"{choice['host_seconds'] * 1e3:.3f} ms ({choice['host_source']})")
        say(f"decode placed by cost: {figures}")
        if not choice["on_device"]:
            index = lm.graphs.index(decode)
            lm.graphs[index] = dataclasses.replace(reference_graphs[index], runtime=None,
                                                   moved_to_host=f"placed by cost: {figures}")
            moved = True
    if moved:
        create_runtimes(lm.graphs, blob, "weights", phase_options)


def _move_failed_graphs(lm: LanguageModel, reference: LanguageModel, tokens: int, tolerance: float | None,
                        say: Callable[[str], None]) -> bool:
    """The teacher-forced check (phase_check.py); each graph that fails it moves to its host build
    (``reference``'s), with a warning. Whether any moved."""
    say(f"whole-path check: each prefill bucket, then {tokens} teacher-forced decode steps, against the host's fp32 graphs")
    check = teacher_forced(lm, reference, tokens, LOGITS_TOLERANCE if tolerance is None else tolerance)
    lm.phase_check = check
    for size in check["failed"]:
        index = next(i for i, g in enumerate(lm.graphs) if g.size == size)
        graph = lm.graphs[index]
        error = check["buckets"][size] if size in check["buckets"] else max(check["decode"]["errors"][1:])
        reason = (f"whole-path check: logits error {error:.2e} > {check['tolerance']:g} (relative to the largest "
                  "logit of the host's fp32 graph)")
        warnings.warn(f"tvm_hetero.llm: the {graph.phase} graph of {size} row(s) runs on the host: {reason}",
                      RuntimeWarning, stacklevel=4)  # the caller of llm.build
        say(f"the {graph.phase} graph of {size} row(s) moves to the host ({reason})")
        lm.graphs[index] = dataclasses.replace(reference.graphs[index], runtime=None, moved_to_host=reason)
    return bool(check["failed"])


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
    lm.phase_check, lm.decode_choice = exported.phase_check, exported.decode_choice
    lm.compiled_for = exported.compiled_for
    lm.weights_in_panels = exported.weights_in_panels
    return lm
