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
from typing import Any

from ..kind_record import resolve
from ..placement_judgement import MEASURED, MODELED, Cost, judge
from ..runtime.measure import wall_times

HOST_RUNS = 20


def accelerator_cost(graph: Any) -> Cost:
    """One call of ``graph``'s accelerator work, labelled with where the figure comes from."""
    offload = graph.offload
    modeled = offload.modeled
    if not offload.costs or not modeled:
        raise ValueError("the accelerator has no cost model (its backend names no costs module)")
    if len(graph.accelerator_models) == 1:  # one graph: the device table may hold its measured cost
        (model,) = graph.accelerator_models.values()
        key = resolve(offload.costs + ":graph_key")(model, offload.options)
        return resolve(offload.costs + ":graph_seconds")(key, modeled.cycles, offload.options)
    return Cost(modeled.seconds, MODELED, f"{modeled.cycles / 1e6:.1f} M cycles x {modeled.us_per_cycle:.3g} us "
                                          f"+ {modeled.calls} call(s)")


def host_seconds(session: Any) -> float:
    """The fastest of ``HOST_RUNS`` calls of ``session``'s decode frame (after a prompt and a warm-up)."""
    session.prefill([0])
    runner = session.runners[1]
    runner.frame.run()
    return min(wall_times(runner.frame.run, HOST_RUNS))


def choose(graph: Any, host_session: Any) -> dict:
    """Both costs of one decode step, judged as every placement is (placement_judgement.py): the
    accelerator runs the decode only where it is faster than the host."""
    device = accelerator_cost(graph)
    load = os.getloadavg()[0]
    host = Cost(host_seconds(host_session), MEASURED, f"fastest of {HOST_RUNS}, load {load:.1f}")
    verdict = judge(device, host, candidate_name=f"the {graph.offload.device}", baseline_name="the host")
    return {"device": graph.offload.device, "device_seconds": device.seconds,
            "device_source": device.source + (f": {device.detail}" if device.detail else ""),
            "host_seconds": host.seconds, "host_source": f"measured here ({host.detail})",
            "on_device": verdict.kept, "judged": verdict.explain()}
