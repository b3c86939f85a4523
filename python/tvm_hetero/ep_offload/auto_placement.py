"""Automatic placement with an offload device (``placement="auto"``): each group stays on the
device only where one call of its vendor graph costs less than the host computing the same ops.

Per group of the verified build (:mod:`.verified_build`): the device's cost is one call of its graph,
measured on a device where the vendor's cost table has it, else modeled from the vendor's cycle
count (the backend's cost module) — never an emulator's wall time; the host's cost is *measured*:
the group's ops (its plain ONNX model) built for the host device alone with the default backends
and timed on it (the fastest of several runs: on a loaded machine a run is only ever slowed down).
A group whose host time is lower goes back to the host, and the build repeats once. Both sides are
host memory, so no copy enters either cost.

Guarantee: the decision is taken once, on the first verified build; every group kept on the device
was predicted faster there, and the report shows both figures, labelled measured or modeled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from ..errors import last_line
from ..kind_record import resolve

#: Timed runs of a group on the host (after one warm-up); the fastest is its cost.
HOST_RUNS = 15


def decide(artifact: Any, offload: dict, checks: dict, host_target: Any) -> list[dict]:
    """Per group its two costs and whether it stays: ``{"region", "ops", "key", "device_seconds",
    "device_source", "host_seconds", "on_device"}``."""
    if not offload.get("costs"):
        raise ValueError(f"placement='auto': the {offload['device']}'s backend has no cost model to weigh its "
                         "groups with")
    graph_key, graph_seconds = resolve(offload["costs"] + ":graph_key"), resolve(offload["costs"] + ":graph_seconds")
    rows = []
    for region in offload["regions"]:
        model = artifact.offload_references.get(region["name"])
        if model is None:
            raise RuntimeError(f"automatic placement: {offload['device']} graph {region['name']} has no ONNX form to time on the host")
        check = checks.get(region["name"])
        key = graph_key(model, offload["options"])
        device_seconds, source = graph_seconds(key, check.cycles if check else float("nan"), offload["options"])
        host_seconds = host_time(model, host_target)
        rows.append({"region": region["name"], "ops": region["ops"], "key": key, "device_seconds": device_seconds,
                     "device_source": source, "host_seconds": host_seconds, "on_device": device_seconds < host_seconds})
    return rows


def host_time(model: bytes, host_target: Any) -> float:
    """Seconds for the host device alone to compute a group (its plain ONNX model) with tvm-hetero,
    timed in a child process: no thread of this one (vendor sessions, executors) shares its cores."""
    from ..devices import parse_spec

    spec = parse_spec(host_target)
    with tempfile.TemporaryDirectory(prefix="tvm_hetero_host_time_") as tmp:
        path = os.path.join(tmp, "group.onnx")
        with open(path, "wb") as f:
            f.write(model)
        job = json.dumps({"model": path, "device": [int(spec.device.dlpack_device_type()), int(spec.device.index)],
                          "target": str(spec.target)})
        done = subprocess.run([sys.executable, "-m", "tvm_hetero.ep_offload.host_timing", job], capture_output=True,
                              text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"automatic placement: timing a group on the host failed: "
                           f"{last_line(done.stderr, 'no output')}")
    return float(done.stdout.strip().splitlines()[-1])
