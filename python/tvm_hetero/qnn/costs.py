"""What one HTP graph costs: measured on a real device where a table says so, else modeled.

Never the emulator's wall time. A QNN graph (one HTP group) is named by its *key*: the SHA-256 of
its plain ONNX model (the region as built, weights included) and the device's options, so a cost
measured for one graph on one SoC is never used for another. The device cost table
(``~/.cache/tvm-hetero/qnn_costs.json``, ``TVM_HETERO_CACHE`` moves it) holds, per key, the seconds
one execution of that graph took on a device, as QNN's profile reports it (its "Accelerator
(execute) time"); ``tvm-hetero qnn-costs import`` fills it. Without an entry, the cost is modeled:
QNN's cycle count on the emulator times the device's microseconds per cycle (``qnn_ep.us_per_cycle``,
fitted with ``tvm-hetero qnn-fit``). Either way each graph call adds the fixed per-call cost
(``qnn_ep.CALL_SECONDS``, the host-side dispatch a profile of the graph does not see).
"""

from __future__ import annotations

import hashlib
import json
import math
import os

from ..cache_dir import cache_root
from ..ep_offload.sdk import ModeledLatency
from ..placement_judgement import MEASURED_ON_A_DEVICE, MODELED, Cost
from .ep import CALL_SECONDS, read_profile, us_per_cycle


def graph_key(model: bytes, options: dict) -> str:
    """The key of one QNN graph on one device."""
    text = json.dumps({k: str(v) for k, v in sorted(options.items())}).encode()
    return hashlib.sha256(model + b"\0" + text).hexdigest()


def table_path() -> str:
    return str(cache_root() / "qnn_costs.json")


def device_table() -> dict[str, dict]:
    try:
        with open(table_path()) as f:
            table = json.load(f)
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def import_costs(path: str, key: str | None = None) -> dict[str, dict]:
    """Add measured graph costs to the device table; returns what was added. ``path`` is a JSON
    object ``{key: seconds}`` (or ``{key: {"seconds": s}}``), or, with ``key``, a QNN profile CSV
    taken on the device (``profiling_level=detailed``) whose execute time is that graph's."""
    added: dict[str, dict] = {}
    if key is not None:
        _cycles, micros = read_profile(path)
        if math.isnan(micros) or micros <= 0:  # NaN: no execute time in the profile
            raise ValueError(f"qnn-costs: {path} has no 'Accelerator (execute) time' in microseconds")
        added[key] = {"seconds": micros * 1e-6, "source": os.path.basename(path)}
    else:
        with open(path) as f:
            given = json.load(f)
        if not isinstance(given, dict):
            raise ValueError(f"qnn-costs: {path} must hold a JSON object {{graph key: seconds}}")
        for k, value in given.items():
            seconds = value.get("seconds") if isinstance(value, dict) else value
            if not isinstance(seconds, (int, float)) or not seconds > 0:
                raise ValueError(f"qnn-costs: {path}: the cost of graph {k[:12]} is not a positive number of "
                                 f"seconds ({value!r})")
            if len(k) != 64 or any(c not in "0123456789abcdef" for c in k):
                raise ValueError(f"qnn-costs: {path}: {k!r} is not a graph key (the build report's HTP "
                                 "section lists each graph's key)")
            added[k] = {"seconds": float(seconds), "source": os.path.basename(path)}
    table = device_table()
    table.update(added)
    os.makedirs(os.path.dirname(table_path()), exist_ok=True)
    with open(table_path(), "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    return added


def graph_seconds(key: str, cycles: float, options: dict) -> Cost:
    """One call of a graph on the device, labelled with where the figure comes from."""
    entry = device_table().get(key)
    if entry is not None:
        return Cost(float(entry["seconds"]) + CALL_SECONDS, MEASURED_ON_A_DEVICE, entry.get("source", "table"))
    if math.isnan(cycles):  # the graph was not profiled
        raise ValueError(f"HTP graph {key[:12]}: no device cost and no cycle count to model one from")
    factor, source = us_per_cycle(options)
    return Cost(cycles * factor * 1e-6 + CALL_SECONDS, MODELED, f"{cycles / 1e6:.1f} M cycles x {factor:.3g} us ({source})")



def modeled(options: dict, cycles: float, calls: int) -> ModeledLatency:
    """The HTP's modeled time per inference: its cycles (QNN's profile) times the device's us per
    cycle, plus a fixed cost per graph call. Never the emulator's wall time."""
    factor, source = us_per_cycle(options)
    return ModeledLatency(cycles * factor * 1e-6 + calls * CALL_SECONDS, cycles, factor, source, calls, CALL_SECONDS)
