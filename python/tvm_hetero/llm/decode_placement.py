"""Where the decode graph runs when its targets hold an accelerator and the build is asked to place
it by cost (``llm.build(..., decode_placement="cost")``).

One decode step is one call of the decode graph. Its two costs:

- on the **accelerator**: the device's own figure for its graph(s), never the emulator's wall time:
  measured on a device where the vendor's cost table has the graph (by its key), else modeled from
  the cycles its profile counted at build (the vendor's cost module, named by the backend's kind);
  each figure is labelled "measured on a device" or "modeled";
- on the **host**: the host build of the same graph (built for the whole-path check) timed here,
  the fastest of ``HOST_RUNS`` calls after a warm-up, labelled "measured" with the load average.

The cheaper one runs the decode phase; the report states both figures and their labels. Forcing
either side is done with the phase's targets (``{"decode": [host]}`` or the default ``"targets"``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..kind_record import resolve

HOST_RUNS = 20


def accelerator_seconds(graph: Any) -> tuple[float, str]:
    """One call of ``graph``'s accelerator work: ``(seconds, where the figure comes from)``."""
    offload = graph.offload
    modeled = offload.modeled
    if not offload.costs or not modeled:
        raise ValueError("the accelerator has no cost model (its backend names no costs module)")
    if len(graph.accelerator_models) == 1:  # one graph: the device table may hold its measured cost
        (model,) = graph.accelerator_models.values()
        key = resolve(offload.costs + ":graph_key")(model, offload.options)
        cost = resolve(offload.costs + ":graph_seconds")(key, modeled.cycles, offload.options)
        return cost.seconds, cost.source + (f": {cost.detail}" if cost.detail else "")
    return modeled.seconds, (f"modeled: {modeled.cycles / 1e6:.1f} M cycles x {modeled.us_per_cycle:.3g} us "
                             f"+ {modeled.calls} call(s)")


def host_seconds(session: Any) -> float:
    """The fastest of ``HOST_RUNS`` calls of ``session``'s decode frame (after a prompt and a warm-up)."""
    session.prefill([0])
    runner = session.runners[1]
    runner.frame.run()
    times = []
    for _ in range(HOST_RUNS):
        start = time.perf_counter()
        runner.frame.run()
        times.append(time.perf_counter() - start)
    return float(np.min(times))


def choose(graph: Any, host_session: Any) -> dict:
    """Both costs of one decode step and the side that is cheaper."""
    device, source = accelerator_seconds(graph)
    load = os.getloadavg()[0]
    host = host_seconds(host_session)
    return {"device": graph.offload.device, "device_seconds": device, "device_source": source,
            "host_seconds": host, "host_source": f"measured here (fastest of {HOST_RUNS}, load {load:.1f})",
            "on_device": device < host}
