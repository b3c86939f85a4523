"""Measured costs kept on disk, so that a rebuild measures only what is new.

One SQLite file (``costs.sqlite`` in the cache folder, tvm_hetero/cache_dir.py)
with two tables. ``costs``: ``(kind, key, target, settings) -> seconds``; ``kind`` is ``"kernel"``
(``key``: the kernel's structural hash, or a region's backend and description), ``"copy_latency"``,
``"copy_per_byte"``, ``"sync_latency"``, ``"call_latency"``, ``"spin_window"`` or
``"graph_latency"`` (a built graph's measured latency);
``target`` is the target string and ``settings`` the device and its executor settings (cores,
threads) as JSON. A measurement taken with other settings is another row, never a hit. ``plans``:
``(kind, key) -> JSON``, what a rebuild of the same module need not work out again: its units
(keyed by the module's structural hash, targets and backends) and the solver's answer (keyed by
the cost model's content and the objective), both pure functions of their key.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi

from ...cache_dir import cache_root
from ...devices import cost_key

_SCHEMA = """CREATE TABLE IF NOT EXISTS costs (
    kind TEXT NOT NULL, key TEXT NOT NULL, target TEXT NOT NULL, settings TEXT NOT NULL,
    seconds REAL NOT NULL, PRIMARY KEY (kind, key, target, settings))"""
_PLANS = """CREATE TABLE IF NOT EXISTS plans (kind TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (kind, key))"""


def default_path() -> Path:
    return cache_root() / "costs.sqlite"


def settings_key(device: str | tvm.runtime.Device, options: dict | None) -> str:
    """The device and its executor settings, written the same way every time. A remote device is
    named without its RPC session (``remote:cpu(0)``), so a new session to a server of the same
    target finds what an earlier one measured (two remote boards of one target therefore share
    their costs: give each its own ``cost_cache`` file)."""
    return json.dumps({"device": device_key(device), "options": options or {}}, sort_keys=True)


#: A device as the cache names it (see :func:`settings_key`).
device_key = cost_key


class CostCache:
    """``get``/``put`` of measured seconds; ``CostCache(None)`` keeps them in memory only."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(str(self.path))
                self._db.execute(_SCHEMA)
                self._db.execute(_PLANS)
            except (OSError, sqlite3.Error) as err:
                raise ValueError(f"cost_cache {str(self.path)!r}: cannot open ({err})") from err
        else:
            self._db = sqlite3.connect(":memory:")
            self._db.execute(_SCHEMA)
            self._db.execute(_PLANS)

    def get(self, kind: str, key: str, target: str, settings: str) -> float | None:
        row = self._db.execute(
            "SELECT seconds FROM costs WHERE kind=? AND key=? AND target=? AND settings=?",
            (kind, key, target, settings),
        ).fetchone()
        return None if row is None else float(row[0])

    def put(self, kind: str, key: str, target: str, settings: str, seconds: float) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO costs VALUES (?, ?, ?, ?, ?)", (kind, key, target, settings, float(seconds))
        )
        self._db.commit()

    def table(self, kind: str, target: str, settings: str) -> dict[str, float]:
        """Every ``key -> seconds`` of one kind, target and settings (one query for a whole model)."""
        rows = self._db.execute(
            "SELECT key, seconds FROM costs WHERE kind=? AND target=? AND settings=?", (kind, target, settings)
        )
        return {key: float(seconds) for key, seconds in rows}

    def put_many(self, kind: str, rows: list[tuple[str, str, str, float]]) -> None:
        """``(key, target, settings, seconds)`` rows of one kind, in one transaction."""
        self._db.executemany(
            "INSERT OR REPLACE INTO costs VALUES (?, ?, ?, ?, ?)", [(kind, k, t, s, float(x)) for k, t, s, x in rows]
        )
        self._db.commit()

    def get_plan(self, kind: str, key: str) -> Any:
        """A JSON document kept under ``(kind, key)`` (what a rebuild need not work out again), or None."""
        row = self._db.execute("SELECT body FROM plans WHERE kind=? AND key=?", (kind, key)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_plan(self, kind: str, key: str, body: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO plans VALUES (?, ?, ?)", (kind, key, json.dumps(body)))
        self._db.commit()

    def close(self) -> None:
        self._db.close()


def open_cache(spec: Any) -> CostCache:
    """``cost_cache=`` as given to build: None (the default file), False (memory only), or a path."""
    if spec is False:
        return CostCache(None)
    if spec is None or spec is True:
        return CostCache(default_path())
    if isinstance(spec, (str, os.PathLike)):
        return CostCache(spec)
    raise TypeError(f"cost_cache must be None, False or a path, got {type(spec).__name__}")


def kernel_key(prim_func: tvm.tirx.PrimFunc) -> str:
    """The measurement key of a kernel: its structural hash, names left out (two fused kernels with
    the same computation share one measurement)."""
    if prim_func.attrs is not None and "global_symbol" in prim_func.attrs:
        prim_func = prim_func.without_attr("global_symbol")
    return f"{tvm_ffi.structural_hash(prim_func) & 0xFFFFFFFFFFFFFFFF:016x}"


def node_key(lowered: Any, node_id: int, graph: Any = None) -> str | None:
    """The measurement key of node ``node_id`` of ``graph`` (default: the lowering's own graph):
    :func:`kernel_key` of its kernel, or for a backend region its backend, pattern, description and
    argument types (equal regions share one measurement); None for a node that calls neither
    (a copy). Automatic placement and the pipeline's ``auto_split`` key their measurements this
    way, so each finds what the other measured."""
    graph = graph if graph is not None else lowered.graph
    node = graph.nodes[node_id]
    region = lowered.regions.get(node.func_name)
    if region is None:
        names = {gv.name_hint for gv in lowered.kernels.get_global_vars()}
        return kernel_key(lowered.kernels[node.func_name]) if node.func_name in names else None
    inputs = [(list(graph.nodes[e.node].shapes[e.index]), graph.nodes[e.node].dtypes[e.index]) for e in node.inputs]
    outputs = [(list(shape), dtype) for shape, dtype in zip(node.shapes, node.dtypes)]
    spec = {k: v for k, v in region.spec.items() if k != "name"}
    text = json.dumps([region.backend, region.pattern, spec, inputs, outputs], sort_keys=True)
    return f"{region.backend}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
