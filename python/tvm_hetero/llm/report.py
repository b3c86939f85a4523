"""The text of ``LanguageModel.report()``: chunk sizes, graphs, where each phase runs (device and
backend), and the bytes of the weights, of a session's KV cache and of each graph's activations."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..compiler.build import device_name, format_size
from ..ep_offload.backend import FOLDED
from ..ep_offload.region_quantization import CALIBRATED_PRECISIONS
from .entry_graphs import weight_devices
from .graph_io import key_cache_shape, value_cache_shape


def kv_cache_bytes(model: Any) -> int:
    """Bytes of one session's KV cache (keys and values of every layer, at full capacity, float32)."""
    cfg = model.config
    rows = [key_cache_shape(cfg, model.capacity), value_cache_shape(cfg, model.capacity)]
    return 4 * cfg.num_layers * sum(int(np.prod(shape)) for shape in rows)


def _weight_format(model: Any) -> str:
    if model.weights != "int8":
        panels = getattr(model, "weights_in_panels", 0)
        return f"float32, {panels} of them in 16-column panels (one layout for decode and prefill)" if panels else "float32"
    text = "8-bit (uint8, zero point 128, a float32 scale per output channel; rows quantized per call)"
    return text + (f"; {model.agreement.describe()}" if model.agreement is not None else "")


def describe(model: Any) -> str:
    cfg = model.config
    holders = ", ".join(device_name(d) for d in weight_devices(model.graphs))
    lines = [
        (f"tvm-hetero language model: {cfg.model_type} ({cfg.family} family), {cfg.num_layers} layers, hidden "
        f"{cfg.hidden_size}, {cfg.num_heads} heads / {cfg.num_kv_heads} key-value heads, vocab {cfg.vocab_size}"),
        f"  source: {model.source or '-'}",
        f"  prefill chunks {list(model.prefill_chunks)} (last chunk padded), decode 1; capacity {model.capacity} tokens",
        f"  weights: {format_size(model.weight_bytes)} once per device holding them ({holders}); every graph shares them",
        f"  matmul weights: {_weight_format(model)}",
        ("  host kernels compiled for: " + (f"CPU {model.compiled_for['cpu']} (its vector features; checked at load)"
                                             if getattr(model, "compiled_for", None) else "the architecture's baseline")),
        (f"  KV cache: {format_size(kv_cache_bytes(model))} per generation session "
        f"({format_size(kv_cache_bytes(model) // model.capacity)} per token, written in place)"),
        "  graphs:",
    ]
    for graph in model.graphs:
        report = graph.build_report
        where = ", ".join(device_name(d) for d in graph.devices)
        if report is not None:
            backends = "; ".join(f"{name} on device {dev}: {regions} regions, {ops} ops"
                                 for name, dev, regions, ops in report.backend_regions) or "TVM kernels only"
            planned = sum(report.memory["planned_bytes"])
            kernels = sum(report.kernels_per_device)
            lines.append(f"    {graph.phase:<7} {graph.size:>4} rows  on {where}  {kernels} kernels, {backends}; "
                         f"activations {format_size(planned)}; built in {graph.build_seconds:.1f} s")
        else:
            lines.append(f"    {graph.phase:<7} {graph.size:>4} rows  on {where}")
        lines.extend(_accelerator_lines(graph))
    lines.extend(_check_lines(model.phase_check))
    choice = model.decode_choice
    if choice:
        lines.append(f"  decode placed by cost: one step on the {choice['device']} {choice['device_seconds'] * 1e3:.3f} ms "
                     f"({choice['device_source']}), on the host {choice['host_seconds'] * 1e3:.3f} ms "
                     f"({choice['host_source']}): runs on the {choice['device'] if choice['on_device'] else 'host'}")
    return "\n".join(lines)


def _accelerator_lines(graph: Any) -> list[str]:
    """What of one graph runs on an accelerator: its graph executions per call, its share of the
    matmul FLOPs, the ops its vendor refused (with the reason), the verification's worst error."""
    if graph.moved_to_host:
        return [f"             MOVED TO THE HOST: {graph.moved_to_host}"]
    offload = graph.offload
    if not offload:
        return []
    device = offload.device
    moved_back = [f"             {count} op(s) moved back to the host: {reason}"
                  for reason, count in sorted(Counter(offload.excluded.values()).items())]
    if not offload.regions:  # the build took nothing there: said, with why
        return [f"             NOTHING RUNS ON THE {device.upper()}"] + moved_back if moved_back else []
    share = offload.flops_on_device / offload.flops if offload.flops else 0.0
    verification = offload.verification
    worst = max((r.relative_error for r in verification.regions), default=float("nan")) if verification else float("nan")
    precision = offload.options.get("precision")
    if precision in CALIBRATED_PRECISIONS:
        precision = f"{precision}: quantized at build, calibrated on real calls"
    lines = [(f"             {device} ({precision}): {offload.graph_executions} graph execution(s) per call, {share:.1%} of the "
             f"matmul FLOPs; verified per graph: worst relative error {worst:.2e} (tolerance "
             f"{verification.tolerance if verification else float('nan'):g})")]
    refused = [r for r in offload.refused if r.reason != FOLDED]
    for op, reason in sorted({(r.op, r.reason) for r in refused}):
        lines.append(f"             refused by {offload.vendor}, on the host: {op}: {reason}")
    return lines + moved_back


def _check_lines(check: dict | None) -> list[str]:
    if not check:
        return []
    decode = check["decode"]
    buckets = ", ".join(f"{size} rows {error:.2e}" for size, error in sorted(check["buckets"].items()))
    failed = f"; FAILED: {check['failed']} (moved to the host)" if check["failed"] else ""
    return [(f"  whole-path check against the host's fp32 graphs (logits error relative to the largest logit, "
            f"tolerance {check['tolerance']:g}): prefill buckets {buckets}; decode teacher-forced over "
            f"{decode['steps']} tokens after a {decode['prompt']}-token prompt: max error {decode['max_error']:.2e}, "
            f"greedy agreement {decode['agreement']}/{decode['steps']}{failed}")]
