"""An HTP in a process of its own (``{"kind": "qnn-htp", "process": "separate"}``): a crash in the
vendor library is an error naming the region, not a dead host.

One child process per HTP (per device options) holds the QNN sessions; each graph execution is
one round trip over a pipe with the data inside (the region's inputs there, its output back), so
it costs two copies of the region's boundary tensors that the in-process runner does not make.
When the child dies (a signal in QNN, the OOM killer), the call that met it raises an error naming
the region and how the process ended; the next call starts a new child, which opens its graphs
again from their EP-context models (no finalization). Calls are serialized: the HTP runs one graph
at a time, as on a device.

The build's own calls into the vendor library for such a device go there too (:func:`vendor_call`):
finalizing each graph, naming the nodes QNN will not take, the per-step values verification
compares, QNN's cycle profile. A crash in any of them is then an error naming the region (a region
QNN crashed finalizing stays on the CPU), not a dead build. Capability probes always run in child
processes of their own (:mod:`.qnn_probe`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

#: Test hook: region names whose next call makes the child die with SIGSEGV (a vendor crash).
CRASH_NEXT: set[str] = set()
#: Test hook: vendor functions (:func:`vendor_call` names) whose next call dies the same way.
CRASH_NEXT_CALL: set[str] = set()


class HtpProcessDied(RuntimeError):
    """The HTP's process ended while it worked for a call (a signal in the vendor library)."""

    def __init__(self, message: str, ended: str) -> None:
        super().__init__(message)
        self.ended = ended


def vendor_call(process: str, options: dict, function: str, what: str, model: bytes, *args: Any) -> Any:
    """``qnn_ep.<function>(model, options, *args)`` in this process (``process="same"``) or in the
    HTP's own (``"separate"``); ``what`` names the region in errors."""
    run = _vendor_function(function)  # an unknown name is an error here, before any process is asked
    if process == "separate":
        return process_for(options).call(what, function, model, *args)
    return run(model, options, *args)


def _vendor_function(name: str) -> Any:
    """What the build may ask of the vendor library, by name: ``name(model, options, *args)``."""
    from .qnn_ep import finalize, htp_outputs, profiled_cycles, unsupported_nodes

    functions = {"finalize": finalize, "unsupported_nodes": unsupported_nodes, "profiled_cycles": profiled_cycles,
                 "htp_outputs": htp_outputs}
    if name not in functions:
        raise ValueError(f"vendor_call: unknown function {name!r}; one of {sorted(functions)}")
    return functions[name]


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
            if self._process is None or self._process.poll() is not None:
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
                raise HtpProcessDied(f"HTP region {region}: the HTP process died ({ended}) running its QNN graph; "
                                     "a new one starts at the next call", ended) from None

    def call(self, what: str, function: str, model: bytes, *args: Any) -> Any:
        """A vendor function (:func:`vendor_call`'s names) run in this HTP's process."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                if function in CRASH_NEXT_CALL:
                    CRASH_NEXT_CALL.discard(function)
                    self._conn.send(("crash",))
                else:
                    self._conn.send(("call", function, model, args))
                return self._answer(what, f"QNN's {function}")
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                ended = self._reap()
                raise HtpProcessDied(f"HTP region {what}: the HTP process died ({ended}) in QNN's {function}; "
                                     "a new one starts at the next call", ended) from None

    def close(self) -> None:
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                self._conn.send(("stop",))
            self._reap()

    def _start(self) -> None:
        # A fresh interpreter (never a fork of a process with running threads) that imports only this
        # module: unlike multiprocessing's spawn, it does not import the user's main script again, so
        # a script without a ``__main__`` guard works.
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(theirs.fileno()), json.dumps(self.options)],
            pass_fds=[theirs.fileno()], env=_child_env())
        theirs.close()
        self._conn = Connection(ours.detach())
        self._opened = set()

    def _answer(self, region: str, doing: str = "QNN graph execution") -> Any:
        kind, value = self._conn.recv()
        if kind == "error":
            raise RuntimeError(f"HTP region {region}: {doing} failed in the HTP process: {value}")
        return value

    def _reap(self) -> str:
        if self._process is None:
            return "not started"
        try:
            code = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn, self._opened = None, None, set()
        if code is not None and code < 0:
            return f"signal {-code}, {signal.Signals(-code).name}"
        return f"exit code {code}"


def _serve(conn: Any, options: dict) -> None:
    """The child: open graphs, run them, answer; until told to stop."""
    from .qnn_ep import htp_session

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
            elif message[0] == "call":
                _kind, function, model, args = message
                conn.send(("ok", _vendor_function(function)(model, options, *args)))
        except Exception as err:  # noqa: BLE001 (ONNX Runtime's own error types, reported to the caller)
            conn.send(("error", f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"))


def _child_env() -> dict[str, str]:
    """The child finds this package where the parent found it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, path) if p))



def serve_child(argv: list[str]) -> None:
    """The child's entry: ``argv`` is its end of the socket (a descriptor) and the options (JSON)."""
    _serve(Connection(int(argv[0])), json.loads(argv[1]))


_CHILD = "import sys; from tvm_hetero.htp_process import serve_child; serve_child(sys.argv[1:])"
