"""The automatic placement's choice explained, as data (a plain dict for the build report and
the artifact's manifest; :mod:`.report` writes it as text): per device the units, ops and backends
chosen and its busy time, the predicted latency and bottleneck, the predicted latency of the
placements a person would try, and the units whose choice mattered most."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..schedule_model import CostModel, simulate
from .units import Units


def alternatives(model: CostModel, allowed: Callable[[int, int], bool]) -> dict[str, float]:
    """Predicted latency of the placements a person would try: everything on one device (each
    that can run it all), and everything capable on each other device (the rest on device 0).
    ``allowed(unit, device)``: the capability table lets the device run the unit."""
    n, num_devices = model.num_kernels, model.num_devices
    result: dict[str, float] = {}
    for d in range(num_devices):
        if model.feasible([d] * n):
            result[f"all on device {d}"] = simulate(model, [d] * n).makespan
    for d in range(1, num_devices):
        capable = [d if allowed(k, d) else 0 for k in range(n)]
        if capable != [d] * n and model.feasible(capable):
            result[f"everything capable on device {d}"] = simulate(model, capable).makespan
    return result


def unit_label(units: Units, u: int) -> str:
    """``conv2d #17``: the unit's main op (the first that is no elementwise helper) and its number."""
    helpers = ("relax.add", "relax.reshape", "relax.nn.relu", "relax.multiply", "relax.subtract", "relax.clip")
    ops = units.relax_ops[u]
    main = next((op for op in ops if op not in helpers), ops[0] if ops else "?")
    more = f" (+{len(ops) - 1} ops)" if len(ops) > 1 else ""
    return f"{main.removeprefix('relax.').removeprefix('nn.')} #{u}{more}"


def explain_choice(model: CostModel, units: Units, assignment: list[int], unit_variants: list[str],
                   variant_costs: list[list[dict[str, float]]], device_names: list[str], objective: str,
                   counts: dict[str, int]) -> dict[str, Any]:
    """The explanation of ``assignment`` (a device per unit) with ``unit_variants`` (a backend per
    unit), from the costs it was chosen on."""
    schedule = simulate(model, assignment)
    num_devices = model.num_devices
    per_device = []
    for d in range(num_devices):
        mine = [u for u, dev in enumerate(assignment) if dev == d]
        by_variant: dict[str, int] = {}
        for u in mine:
            by_variant[unit_variants[u]] = by_variant.get(unit_variants[u], 0) + 1
        per_device.append({
            "device": device_names[d],
            "kernels": len(mine),
            "ops": sum(len(units.ops[u]) for u in mine),
            "busy_seconds": schedule.device_busy[d] if schedule.device_busy else 0.0,
            "call_seconds": model.call_latency[d],
            "variants": by_variant,
        })
    decisions = []
    for u, d in enumerate(assignment):
        chosen = unit_variants[u]
        others = [(seconds, o, variant) for o in range(num_devices) for variant, seconds in variant_costs[u][o].items()
                  if (o, variant) != (d, chosen)]
        if not others:
            continue
        other_cost, other, other_variant = max(others)
        decisions.append({
            "kernel": unit_label(units, u), "index": u, "device": device_names[d], "backend": chosen,
            "seconds": variant_costs[u][d][chosen], "other_device": device_names[other], "other_backend": other_variant,
            "other_seconds": other_cost,
        })
    decisions.sort(key=lambda x: -abs(x["other_seconds"] - x["seconds"]))
    return {
        "objective": objective,
        "predicted_seconds": schedule.makespan,
        "bottleneck_seconds": schedule.bottleneck,
        "measured_seconds": None,
        "remote_calls": schedule.remote_calls,
        "per_device": per_device,
        "alternatives": alternatives(model, lambda u, d: math.isfinite(model.kernel_cost[u][d])),
        "decisions": decisions[:5],
        "kernels_measured": counts["measured"],
        "kernels_cached": counts["cached"],
    }
