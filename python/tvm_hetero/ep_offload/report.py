"""The build report's section for an accelerator reached through its vendor's SDK: loud about
everything a user of an NPU needs to know.

Every op the vendor refused, with its reason; every vendor graph (group) and the ops in it; the
graph executions per inference; each region's verification against the CPU; every op moved back to
the CPU and why. Latencies of the device, where shown, are labelled *modeled*: an emulator's wall
time is never a cost.
"""

from __future__ import annotations

from collections import Counter

from .backend import FOLDED
from .offload_report import MoveBack, OffloadReport
from .region_quantization import quantizes


def explain(offload: OffloadReport, devices: list[str]) -> list[str]:
    """The report's lines for one accelerator's section."""
    lines = []
    options = offload.options
    vendor, device = offload.vendor, offload.device
    precision = (f"{options.get('precision')}: quantized at build, calibrated on the graph's own values"
                 if quantizes(options) else f"QDQ units quantized, other ops {options.get('precision')}"
                 if offload.quantized else options.get("precision"))
    # What the vendor accepts and what the build put on the device are two numbers: verification, the gate and
    # automatic placement move accepted ops back (each with its reason, under "moved back").
    placed = sum(region.ops for region in offload.regions)
    moved = len(offload.excluded)
    lines.append(f"  {device} ({vendor}; {offload.options_text}{', ' if offload.options_text else ''}"
                 f"{precision}): {offload.accepted} of {offload.asked} Relax ops accepted by {vendor}, {placed} placed on "
                 f"the {device}{f' ({moved} moved back to the CPU, below)' if moved else ''}; "
                 f"{len(offload.regions)} {vendor} graphs, {offload.graph_executions} graph executions per inference")
    if offload.flops:
        scale, unit = (1e9, "GFLOP") if offload.flops >= 1e9 else (1e6, "MFLOP")
        lines.append(f"  {device}: {offload.flops_on_device / offload.flops:.1%} of conv/matmul FLOPs "
                     f"({offload.flops_on_device / scale:.2f} of {offload.flops / scale:.2f} {unit})")
    if offload.in_context:
        lines.append(f"  {device}: {offload.in_context} ops {vendor} refuses alone are accepted together with the op "
                     "reading them (asked in context)")
    for region in offload.regions:
        lines.append(f"    graph {region.name} on {devices[region.device]}: {region.ops} ops")
    refused = [r for r in offload.refused if r.binding not in offload.excluded and r.reason != FOLDED]
    if refused:
        lines.append(f"  {device}: {len(refused)} ops refused by {vendor}, run on the CPU:")
        grouped = Counter((r.op, r.reason) for r in refused)
        for (op, reason), count in sorted(grouped.items()):
            lines.append(f"    {count} x {op}: {reason}")
    if offload.unplaced:
        lines.append(f"  {device}: {len(offload.unplaced)} ops {vendor} accepts are in no {device} graph (no pattern "
                     "takes them; they run on the CPU):")
        for op, count in sorted(Counter(r.op for r in offload.unplaced).items()):
            lines.append(f"    {count} x {op}")
    # Ops verification moved back step by step are listed with their step below, not once more here.
    by_step = {key for row in (offload.move_back.steps if offload.move_back else []) if row.step is not None
               for key in row.bindings} & set(offload.excluded)
    if offload.excluded:
        lines.append(f"  {device}: {len(offload.excluded)} ops moved back to the CPU:")
        for reason, count in sorted(Counter(r for key, r in offload.excluded.items() if key not in by_step).items()):
            lines.append(f"    {count} ops: {reason}")
        if by_step:
            lines.append(f"    {len(by_step)} ops: verification, each step listed below")
    if offload.auto:
        lines.append(f"  {device} automatic placement (each group: one call of its {vendor} graph against the host "
                     "computing it, measured on the host):")
    for choice in offload.auto or []:
        lines.append(f"    {choice.region} ({choice.ops} ops, key {choice.key[:12]}): {choice.verdict.explain()}: "
                     f"{f'stays on the {device}' if choice.on_device else 'moved to the host'}")
    modeled = offload.modeled
    if modeled:
        lines.append(f"  {device} modeled latency {modeled.seconds * 1e3:.2f} ms per inference (modeled, not measured: "
                     f"{modeled.cycles / 1e6:.1f} M cycles x {modeled.us_per_cycle:.3g} us/cycle, "
                     f"{modeled.factor_source}; + {modeled.calls} call(s) x {modeled.call_seconds * 1e3:.2f} ms)")
    verification = offload.verification
    if verification:
        lines.append(f"  {device} verification ({verification.inputs}, tolerance {verification.tolerance:g} "
                     f"relative to the largest CPU value, {verification.rounds} build round(s)):")
        for check in verification.regions:
            verdict = "ok" if check.ok else "MOVED BACK"
            why = (", non-finite values (fp16 overflow)" if not check.finite else
                   f", fp16 underflow (the CPU's values are at most {check.reference_scale:.1e})"
                   if check.underflow else "")
            lines.append(f"    {check.region} ({check.ops} ops): relative error {check.relative_error:.2e}"
                         f"{why}: {verdict}")
    lines.extend(_move_back_lines(offload.move_back, device))
    return lines


def _move_back_lines(move_back: MoveBack | None, device: str) -> list[str]:
    """Each step verification moved back and why; each round's FLOPs on the device against its worst error."""
    if not move_back or not move_back.steps:
        return []
    lines = [f"  {device} steps moved back by verification (rule {move_back.rule!r}; own error: the step fed the "
             "CPU's inputs; inherited: in the device's own chain):"]
    for row in move_back.steps:
        what = f"step {row.step} ({', '.join(row.ops)})" if row.step is not None else row.rule
        lines.append(f"    {row.region} {what}, {len(row.bindings)} op(s): {row.reason}")
    lines.append(f"  {device} conv/matmul FLOPs on the {device} against the worst graph error, per verification round:")
    for row in move_back.rounds:
        share = row.flops_on_device / row.flops if row.flops else 0.0
        lines.append(f"    round {row.round}: {share:.1%} in {row.graphs} graph(s), worst error "
                     f"{row.worst_error:.2e} ({row.bad_graphs} over the tolerance)")
    return lines
