"""An accelerator in a process of its own (``{"kind": ..., "process": "separate"}``): a crash in the
vendor library is an error naming the region, not a dead host.

One child process per device (per vendor SDK and device options) holds the vendor's sessions; each
graph execution is one round trip over a pipe with the data inside (the region's inputs there, its
output back), so it costs two copies of the region's boundary tensors that the in-process runner
does not make. When the child dies (a signal in the vendor library, the OOM killer), the call that
met it raises an error naming the region and how the process ended; the next call starts a new
child, which opens its graphs again from their compiled models (no finalization). Calls are
serialized: the device runs one graph at a time.

The build's own calls into the vendor library for such a device go there too (:func:`vendor_call`):
finalizing each graph, naming the nodes the vendor will not take, the per-step values verification
compares, the vendor's cycle profile. A crash in any of them is then an error naming the region (a
region the vendor crashed finalizing stays on the CPU), not a dead build. Capability probes always
run in child processes of their own (:mod:`.capability_probe`).
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

from . import sdk as vendor_sdk
from .child_process import ChildFailed, child_env, error, how_it_ended, ok, unwrap

#: Test hook: region names whose next call makes the child die with SIGSEGV (a vendor crash).
CRASH_NEXT: set[str] = set()
#: Test hook: vendor functions (:func:`vendor_call` names) whose next call dies the same way.
CRASH_NEXT_CALL: set[str] = set()


class VendorProcessDied(ChildFailed):
    """The device's process ended while it worked for a call (a signal in the vendor library)."""


def vendor_call(sdk: str, process: str, options: dict, function: str, what: str, model: bytes, *args: Any) -> Any:
    """``<sdk>.<function>(model, options, *args)`` in this process (``process="same"``) or in the
    device's own (``"separate"``); ``what`` names the region in errors."""
    run = vendor_sdk.function(sdk, function)  # an unknown name is an error here, before any process is asked
    if process == "separate":
        return process_for(sdk, options).call(what, function, model, *args)
    return run(model, options, *args)


_processes: dict[str, VendorProcess] = {}
_registry_lock = threading.Lock()


def process_for(sdk: str, options: dict) -> VendorProcess:
    """The process of a device (its vendor SDK and options): started at its first call."""
    key = repr((sdk, sorted(options.items())))
    with _registry_lock:
        if key not in _processes:
            _processes[key] = VendorProcess(sdk, options)
        return _processes[key]


class VendorProcess:
    """One device's child process: it opens the device's graphs and runs them, one call at a time."""

    def __init__(self, sdk: str, options: dict) -> None:
        #: The vendor's SDK module (what the child imports).
        self.sdk = sdk
        #: The device's options.
        self.options = dict(options)
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None
        self._opened: set[str] = set()

    def run(self, region: str, model: bytes, feeds: dict[str, np.ndarray], output: str, what: str = "") -> np.ndarray:
        """Region ``region``'s graph run once here; ``what`` names it in errors (default: its name)."""
        what = what or region
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                if region not in self._opened:
                    self._conn.send(("open", region, model))
                    self._answer(what)
                    self._opened.add(region)
                if region in CRASH_NEXT:
                    CRASH_NEXT.discard(region)
                    self._conn.send(("crash",))
                else:
                    self._conn.send(("run", region, feeds, output))
                return self._answer(what)
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                ended = self._reap()
                raise VendorProcessDied(what, f"the device's process died ({ended}) running its graph; "
                                        "a new one starts at the next call", ended) from None

    def call(self, what: str, function: str, model: bytes, *args: Any) -> Any:
        """A vendor function (:func:`vendor_call`'s names) run in this device's process."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                if function in CRASH_NEXT_CALL:
                    CRASH_NEXT_CALL.discard(function)
                    self._conn.send(("crash",))
                else:
                    self._conn.send(("call", function, model, args))
                return self._answer(what, f"the vendor's {function}")
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                ended = self._reap()
                raise VendorProcessDied(what, f"the device's process died ({ended}) in the vendor's "
                                        f"{function}; a new one starts at the next call", ended) from None

    def close(self) -> None:
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                self._conn.send(("stop",))
            self._reap()

    def _start(self) -> None:
        # The protocol's fresh interpreter (child_process.py), importing only this module.
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(theirs.fileno()), self.sdk, json.dumps(self.options)],
            pass_fds=[theirs.fileno()], env=child_env())
        theirs.close()
        self._conn = Connection(ours.detach())
        self._opened = set()

    def _answer(self, region: str, doing: str = "its graph's execution") -> Any:
        return unwrap(self._conn.recv(), f"{region}: {doing}")

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
        return how_it_ended(code)


def _serve(conn: Any, sdk: str, options: dict) -> None:
    """The child: open graphs, run them, answer; until told to stop."""
    accelerator_session = vendor_sdk.load(sdk).accelerator_session

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
                sessions[message[1]] = accelerator_session(message[2], options)
                conn.send(ok(None))
            elif message[0] == "run":
                _kind, region, feeds, output = message
                conn.send(ok(sessions[region].run([output], feeds)[0]))
            elif message[0] == "call":
                _kind, function, model, args = message
                conn.send(ok(vendor_sdk.function(sdk, function)(model, options, *args)))
        except Exception as err:  # noqa: BLE001 (ONNX Runtime's own error types, reported to the caller)
            conn.send(error(err))


def serve_child(argv: list[str]) -> None:
    """The child's entry: ``argv`` is its end of the socket (a descriptor), the vendor's SDK module
    and the options (JSON)."""
    _serve(Connection(int(argv[0])), argv[1], json.loads(argv[2]))


_CHILD = "import sys; from tvm_hetero.ep_offload.vendor_process import serve_child; serve_child(sys.argv[1:])"
