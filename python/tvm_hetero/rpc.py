"""Remote devices over TVM RPC: start a local server with the tvm-hetero library, connect to it.

A real board runs the same server (``python -m tvm.exec.rpc_server --load-library
/abs/path/libtvm_hetero.so``, optionally registered with a tracker); from the host, connect with
:func:`connect` (direct) or :func:`connect_tracker` and pass ``session.cpu(0)`` (or another device of
the session) to ``graph_runtime.create``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import tvm
from tvm import rpc as tvm_rpc

from ._lib import library_path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """A ``tvm.exec.rpc_server`` child process on 127.0.0.1 with libtvm_hetero loaded.

    It is a real second process: tensors on its devices cross a socket. Use as a context manager,
    or call :meth:`stop`.
    """

    def __init__(self, port: int | None = None, threads: int | None = None, startup_timeout: float = 60.0):
        self.port = port or _free_port()
        env = dict(os.environ)
        if threads is not None:
            env["TVM_NUM_THREADS"] = str(threads)
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the server; closed in stop)
        cmd = [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(self.port),
               "--port-end", str(self.port + 1), "--load-library", str(Path(library_path()).resolve())]
        # The server forks a worker per session: a new process group lets stop() end them all.
        self.process = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._wait_ready(startup_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"RPC server exited with code {self.process.returncode}: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"RPC server did not listen on port {self.port} within {timeout} s")

    def connect(self, session_timeout: float = 0) -> tvm_rpc.RPCSession:
        return connect("127.0.0.1", self.port, session_timeout=session_timeout)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def kill(self) -> None:
        """End the server and its session workers at once (SIGKILL), as a crash would."""
        try:
            os.killpg(self.process.pid, 9)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.kill()
        self._log.close()

    def __enter__(self) -> LocalServer:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_local_server(port: int | None = None, threads: int | None = None) -> LocalServer:
    """Start a local RPC server with the tvm-hetero library loaded (tests, demos, benchmarks)."""
    return LocalServer(port=port, threads=threads)


def connect(host: str, port: int, key: str = "", session_timeout: float = 0) -> tvm_rpc.RPCSession:
    """Connect to an RPC server directly (the session remembers its peer, for run timeouts)."""
    session = tvm_rpc.connect(host, port, key=key, session_timeout=session_timeout)
    session._tvm_hetero_peer = (socket.gethostbyname(host), int(port))
    return session


def peer_sockets(peer: tuple[str, int]) -> list[int]:
    """File descriptors of this process's TCP connections to ``peer`` (Linux /proc)."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if probe.family == socket.AF_INET and probe.getpeername()[:2] == peer:
                fds.append(fd)
        except OSError:
            pass
        finally:
            probe.close()
    return fds


class RunWatchdog:
    """Bounds a run that involves remote devices: past ``timeout`` seconds the connections to the
    remote servers are shut down, so the blocked RPC call returns with an error instead of hanging."""

    def __init__(self, peers: list[tuple[str, int]], timeout: float):
        self.peers = peers
        self.timeout = timeout
        self.fired = False
        self._timer: threading.Timer | None = None

    def _fire(self) -> None:
        self.fired = True
        for peer in self.peers:
            for fd in peer_sockets(peer):
                try:
                    socket.socket(fileno=os.dup(fd)).shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> RunWatchdog:  # noqa: PYI034
        self.fired = False
        self._timer = threading.Timer(self.timeout, self._fire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()


def connect_tracker(host: str, port: int, key: str, priority: int = 1, session_timeout: float = 0):
    """Ask a tracker for a server registered under ``key`` (a board's name)."""
    tracker = tvm_rpc.connect_tracker(host, port)
    return tracker.request(key, priority=priority, session_timeout=session_timeout)


def upload_library(session: tvm_rpc.RPCSession, lib: tvm.runtime.Module, name: str = "kernels.so"):
    """Export ``lib`` as a shared library, send it to the remote and load it there."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        lib.export_library(path)
        session.upload(path)
    return session.load_module(name)
