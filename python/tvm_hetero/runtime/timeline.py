"""A run's timeline: step spans recorded by the runtime (``GraphModule.trace``) turned into a Chrome
trace-event file (opens in Perfetto or chrome://tracing), per-device busy/wait/overlap figures, and
a Gantt picture (matplotlib, optional).

Spans come from the runtime as ``{"devices": [name...], "runs": [[span...]...]}``, each span
``{"step", "node", "name", "kind", "device", "start_us", "end_us"}`` with times from the start of
its run. A gap between two spans of one device is time that device waited (for another device's
result, or for nothing left to do).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Gap between successive runs in the trace file, so that runs do not touch.
RUN_GAP_US = 50.0


def _by_device(spans: list[dict]) -> dict[int, list[dict]]:
    tracks: dict[int, list[dict]] = {}
    for span in sorted(spans, key=lambda s: s["start_us"]):
        tracks.setdefault(span["device"], []).append(span)
    return tracks


def chrome_trace(recorded: dict) -> dict:
    """The Chrome trace-event JSON of every recorded run: a track per device (``tid``), ``X`` events
    for kernels, copies and offloaded groups, and ``wait`` events for the gaps between them."""
    names = recorded["devices"]
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "tvm-hetero"}},
    ]
    for d, name in enumerate(names):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": d, "args": {"name": f"{d}: {name}"}})
    offset = 0.0
    for r, spans in enumerate(recorded["runs"]):
        end = 0.0
        for d, track in _by_device(spans).items():
            previous_end = 0.0
            for span in track:
                if span["start_us"] > previous_end:
                    events.append(_event("wait", "wait", d, offset + previous_end, span["start_us"] - previous_end, r))
                events.append(
                    _event(span["name"], span["kind"], d, offset + span["start_us"],
                           span["end_us"] - span["start_us"], r, node=span["node"], step=span["step"])
                )
                previous_end = span["end_us"]
            end = max(end, previous_end)
        offset += end + RUN_GAP_US
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _event(name: str, kind: str, device: int, ts: float, dur: float, run: int, **args: Any) -> dict:
    return {"name": name, "cat": kind, "ph": "X", "pid": 0, "tid": device, "ts": round(ts, 3),
            "dur": round(max(dur, 0.0), 3), "args": {"run": run, **args}}


def summarize(recorded: dict) -> dict:
    """Of the last recorded run: its length, each device's busy and waiting time, and the overlap
    (time two or more devices were busy at once, counted once per extra device)."""
    spans = recorded["runs"][-1] if recorded["runs"] else []
    total = max((s["end_us"] for s in spans), default=0.0)
    devices = []
    intervals = []
    for d, name in enumerate(recorded["devices"]):
        track = [s for s in spans if s["device"] == d]
        busy = sum(s["end_us"] - s["start_us"] for s in track)
        last = max((s["end_us"] for s in track), default=0.0)
        devices.append({"device": d, "name": name, "busy_us": busy, "wait_us": max(last - busy, 0.0), "steps": len(track)})
        intervals += [(s["start_us"], s["end_us"]) for s in track]
    busy_total = sum(dev["busy_us"] for dev in devices)
    return {"total_us": total, "devices": devices, "overlap_us": max(busy_total - _union_length(intervals), 0.0)}


def _union_length(intervals: list[tuple[float, float]]) -> float:
    length, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                length += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        length += current_end - current_start
    return length


def draw(recorded: dict, path: str | Path) -> Path:
    """A Gantt picture of the last recorded run (needs matplotlib: ``pip install matplotlib``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("drawing a timeline needs matplotlib (pip install matplotlib)") from err
    spans = recorded["runs"][-1] if recorded["runs"] else []
    names = recorded["devices"]
    colours = {"kernel": "tab:blue", "copy": "tab:orange", "group": "tab:green", "nop": "tab:gray"}
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * len(names)))
    for span in spans:
        ax.barh(span["device"], (span["end_us"] - span["start_us"]) / 1000.0, left=span["start_us"] / 1000.0,
                color=colours.get(span["kind"], "tab:purple"), edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(len(names)), [f"{d}: {n}" for d, n in enumerate(names)])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the start of the run")
    summary = summarize(recorded)
    ax.set_title(f"{summary['total_us'] / 1000:.2f} ms; overlap {summary['overlap_us'] / 1000:.2f} ms "
                 "(blue kernels, orange copies, green offloaded groups)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
