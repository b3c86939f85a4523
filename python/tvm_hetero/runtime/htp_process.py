"""An HTP in a process of its own (``{"kind": "qnn-htp", "process": "separate"}``): a crash in the
vendor library is an error naming the region, not a dead host.

One child process per HTP (per device options) holds the QNN sessions; each graph execution is
one round trip over a pipe with the data inside (the region's inputs there, its output back), so
it costs two copies of the region's boundary tensors that the in-process runner does not make.
When the child dies (a signal in QNN, the OOM killer), the call that met it raises an error naming
the region and how the process ended; the next call starts a new child, which opens its graphs
again from their EP-context models (no finalization). Calls are serialized: the HTP runs one graph
at a time, as on a device.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from typing import Any

import numpy as np

#: Test hook: region names whose next call makes the child die with SIGSEGV (a vendor crash).
CRASH_NEXT: set[str] = set()

_processes: dict[str, HtpProcess] = {}
_registry_lock = threading.Lock()


def process_for(options: dict) -> HtpProcess:
    """The HTP process of a device (its options): started at its first call."""
    key = repr(sorted(options.items()))
    with _registry_lock:
        if key not in _processes:
            _processes[key] = HtpProcess(options)
        return _processes[key]


class HtpProcess:
    def __init__(self, options: dict) -> None:
        self.options = dict(options)
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None
        self._opened: set[str] = set()

    def run(self, region: str, model: bytes, feeds: dict[str, np.ndarray], output: str) -> np.ndarray:
        with self._lock:
            if self._process is None or not self._process.is_alive():
                self._start()
            try:
                if region not in self._opened:
                    self._conn.send(("open", region, model))
                    self._answer(region)
                    self._opened.add(region)
                if region in CRASH_NEXT:
                    CRASH_NEXT.discard(region)
                    self._conn.send(("crash",))
                else:
                    self._conn.send(("run", region, feeds, output))
                return self._answer(region)
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                ended = self._reap()
                raise RuntimeError(f"HTP region {region}: the HTP process died ({ended}) running its QNN graph; "
                                   "a new one starts at the next call") from None

    def close(self) -> None:
        with self._lock:
            if self._process is not None and self._process.is_alive():
                self._conn.send(("stop",))
                self._process.join(timeout=10)
            self._reap()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process with running threads
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, self.options), daemon=True,
                                        name="tvm-hetero-htp")
        self._process.start()
        child.close()
        self._opened = set()

    def _answer(self, region: str) -> Any:
        kind, value = self._conn.recv()
        if kind == "error":
            raise RuntimeError(f"HTP region {region}: QNN graph execution failed in the HTP process: {value}")
        return value

    def _reap(self) -> str:
        if self._process is None:
            return "not started"
        self._process.join(timeout=10)
        code = self._process.exitcode
        self._process, self._conn, self._opened = None, None, set()
        if code is not None and code < 0:
            return f"signal {-code}, {signal.Signals(-code).name}"
        return f"exit code {code}"


def _serve(conn: Any, options: dict) -> None:
    """The child: open graphs, run them, answer; until told to stop."""
    from ..qnn_ep import htp_session

    sessions: dict[str, Any] = {}
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        try:
            if message[0] == "stop":
                return
            if message[0] == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            if message[0] == "open":
                sessions[message[1]] = htp_session(message[2], options)
                conn.send(("ok", None))
            elif message[0] == "run":
                _kind, region, feeds, output = message
                conn.send(("ok", sessions[region].run([output], feeds)[0]))
        except Exception as err:  # noqa: BLE001 (ONNX Runtime's own error types, reported to the caller)
            conn.send(("error", f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"))
