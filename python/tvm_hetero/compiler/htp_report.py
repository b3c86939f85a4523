"""The build report's HTP section: loud about everything a user of an NPU needs to know.

Every op QNN refused, with QNN's reason; every QNN graph (group) and the ops in it; the graph
executions per inference; each region's verification against the CPU; every op moved back to the
CPU and why. Latencies for the HTP, where shown, are labelled *modeled*: the emulator's wall time
is never a cost.
"""

from __future__ import annotations

from collections import Counter

from ..backends.qnn import FOLDED


def explain_htp(htp: dict, devices: list[str]) -> list[str]:
    lines = []
    options = htp.get("options", {})
    precision = (f"QDQ units quantized, other ops {options.get('precision')}" if htp.get("quantized")
                 else options.get("precision"))
    # What QNN accepts and what the build put on the HTP are two numbers: verification, the gate and
    # automatic placement move accepted ops back (each with its reason, under "moved back").
    placed = sum(region["ops"] for region in htp["regions"])
    moved = len(htp.get("excluded", {}))
    lines.append(f"  HTP (QNN; soc {options.get('soc_model')}, v{options.get('htp_arch')}, "
                 f"{precision}): {htp['accepted']} of {htp['asked']} Relax ops accepted by QNN, {placed} placed on "
                 f"the HTP{f' ({moved} moved back to the CPU, below)' if moved else ''}; "
                 f"{len(htp['regions'])} QNN graphs, {htp['graph_executions']} graph executions per inference")
    if htp.get("flops"):
        scale, unit = (1e9, "GFLOP") if htp["flops"] >= 1e9 else (1e6, "MFLOP")
        lines.append(f"  HTP: {htp['flops_on_htp'] / htp['flops']:.1%} of conv/matmul FLOPs "
                     f"({htp['flops_on_htp'] / scale:.2f} of {htp['flops'] / scale:.2f} {unit})")
    if htp.get("in_context"):
        lines.append(f"  HTP: {htp['in_context']} ops QNN refuses alone are accepted together with the op "
                     "reading them (asked in context)")
    for region in htp["regions"]:
        lines.append(f"    graph {region['name']} on {devices[region['device']]}: {region['ops']} ops")
    refused = [r for r in htp["refused"] if r["binding"] not in htp.get("excluded", {}) and r["reason"] != FOLDED]
    if refused:
        lines.append(f"  HTP: {len(refused)} ops refused by QNN, run on the CPU:")
        grouped = Counter((r["op"], r["reason"]) for r in refused)
        for (op, reason), count in sorted(grouped.items()):
            lines.append(f"    {count} x {op}: {reason}")
    unplaced = htp.get("unplaced", [])
    if unplaced:
        lines.append(f"  HTP: {len(unplaced)} ops QNN accepts are in no HTP graph (no HTP pattern takes them; "
                     "they run on the CPU):")
        for op, count in sorted(Counter(r["op"] for r in unplaced).items()):
            lines.append(f"    {count} x {op}")
    excluded = htp.get("excluded", {})
    if excluded:
        lines.append(f"  HTP: {len(excluded)} ops moved back to the CPU:")
        for reason, count in sorted(Counter(excluded.values()).items()):
            lines.append(f"    {count} ops: {reason}")
    if htp.get("auto"):
        lines.append("  HTP automatic placement (each group: one call of its QNN graph against the host "
                     "computing it, measured on the host):")
    for row in htp.get("auto") or []:
        lines.append(f"    {row['region']} ({row['ops']} ops, key {row['key'][:12]}): HTP "
                     f"{row['htp_seconds'] * 1e3:.3f} ms ({row['htp_source']}), host {row['host_seconds'] * 1e3:.3f} ms: "
                     f"{'stays on the HTP' if row['on_htp'] else 'moved to the host'}")
    modeled = htp.get("modeled")
    if modeled:
        lines.append(f"  HTP modeled latency {modeled['seconds'] * 1e3:.2f} ms per inference (modeled, not measured: "
                     f"{modeled['cycles'] / 1e6:.1f} M cycles x {modeled['us_per_cycle']:.3g} us/cycle, "
                     f"{modeled['factor_source']}; + {modeled['calls']} call(s) x {modeled['call_seconds'] * 1e3:.2f} ms)")
    verification = htp.get("verification")
    if verification:
        lines.append(f"  HTP verification ({verification['inputs']}, tolerance {verification['tolerance']:g} "
                     f"relative to the largest CPU value, {verification['rounds']} build round(s)):")
        for check in verification["regions"]:
            verdict = "ok" if check["ok"] else "MOVED BACK"
            why = (", non-finite values (fp16 overflow)" if not check["finite"] else
                   f", fp16 underflow (the CPU's values are at most {check['reference_scale']:.1e})"
                   if check.get("underflow") else "")
            lines.append(f"    {check['region']} ({check['ops']} ops): relative error {check['relative_error']:.2e}"
                         f"{why}: {verdict}")
    return lines
