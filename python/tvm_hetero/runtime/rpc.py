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
import uuid
from pathlib import Path

import tvm
from tvm import rpc as tvm_rpc

from ..errors import last_line
from ..native import library_path
from ..toolchain import linker as shared_library_linker

#: Seconds :func:`connect` waits for a server's handshake by default (None: forever). A server on
#: a network answers in milliseconds; one that accepts and says nothing should fail fast.
DEFAULT_CONNECT_TIMEOUT = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """A ``tvm.exec.rpc_server`` child process on 127.0.0.1 with libtvm_hetero loaded.

    It is a real second process: tensors on its devices cross a socket. Use as a context manager,
    or call :meth:`stop`.
    """

    def __init__(
        self,
        port: int | None = None,
        threads: int | None = None,
        startup_timeout: float = 60.0,
        tracker: tuple[str, int] | None = None,
        key: str = "",
    ):
        self.port = port or _free_port()
        env = dict(os.environ)
        if threads is not None:  # TVM's pool and OpenMP's (oneDNN regions)
            env["TVM_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
        # The server shares this machine with the host process: OpenMP threads that spin while idle
        # (libgomp's default) take the cores the host computes on; a 2-core run of SqueezeNet's oneDNN
        # regions in the server took 132 ms spinning, 5 ms passive.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the server; closed in stop)
        cmd = [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(self.port),
               "--port-end", str(self.port + 1), "--load-library", str(Path(library_path()).resolve())]
        if tracker is not None:  # register with a tracker under `key`, as a board would
            cmd += ["--tracker", f"{tracker[0]}:{tracker[1]}", "--key", key]
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

    def connect(
        self, session_timeout: float = 0, connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT
    ) -> RemoteSession:
        """A session to this server. It serves one session at a time: close (drop) the last one first."""
        return connect("127.0.0.1", self.port, session_timeout=session_timeout, connect_timeout=connect_timeout)

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


class RemoteSession(tvm_rpc.RPCSession):
    """A TVM RPC session that knows its server's address, so set-up and runs can be bounded in
    time (``remote_timeout``) and errors can name the server."""

    def __init__(self, session: tvm_rpc.RPCSession, peer: tuple[str, int], address: str):
        super().__init__(session._sess)
        #: (IP, port) of the server's end of the connection.
        self.peer = peer
        #: ``host:port`` as given, for messages.
        self.address = address


def connect(
    host: str,
    port: int,
    key: str = "",
    session_timeout: float = 0,
    connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
) -> RemoteSession:
    """Connect to an RPC server directly.

    ``connect_timeout`` (seconds, default :data:`DEFAULT_CONNECT_TIMEOUT`; None: forever) bounds the
    handshake: a server that accepts and never answers (or is stopped) gives TimeoutError naming
    host and port; one that answers junk gives ConnectionError.
    """
    address = f"{host}:{port}"
    try:
        peer = (socket.gethostbyname(host), int(port))
    except (OSError, ValueError) as err:
        raise ConnectionError(f"RPC server {address}: cannot resolve the address ({err})") from None
    watchdog = RunWatchdog([peer], connect_timeout, address) if connect_timeout is not None else None
    try:
        if watchdog is None:
            session = tvm_rpc.connect(host, port, key=key, session_timeout=session_timeout)
        else:
            with watchdog:
                session = tvm_rpc.connect(host, port, key=key, session_timeout=session_timeout)
    except Exception as err:  # noqa: BLE001 (whatever the handshake raised, the connection failed)
        if watchdog is not None and watchdog.fired:
            raise TimeoutError(
                f"RPC server {address} did not complete the handshake within {connect_timeout:g} s (a TVM RPC "
                "server serves one session at a time: is another session to it still open?)"
            ) from None
        raise ConnectionError(
            f"RPC server {address}: connection failed (not a TVM RPC server, wrong key, or it closed): "
            f"{last_line(err)}"
        ) from None
    return RemoteSession(session, peer, address)


def _inet_peers() -> set[tuple[str, int]]:
    """Peers of this process's IPv4 TCP connections (Linux /proc)."""
    peers = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            probe = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if probe.family == socket.AF_INET:
                peers.add(probe.getpeername()[:2])
        except OSError:
            pass
        finally:
            probe.close()
    return peers


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
    """Bounds a call that involves remote devices (connect, set-up, run): past ``timeout`` seconds
    the connections to the remote servers are shut down, so the blocked RPC call returns with an
    error instead of hanging."""

    def __init__(self, peers: list[tuple[str, int]], timeout: float, address: str | None = None):
        self.peers = peers
        self.timeout = timeout
        #: The servers, ``host:port``, for messages.
        self.address = address or ", ".join(f"{h}:{p}" for h, p in peers)
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


def connect_tracker(host: str, port: int, key: str, priority: int = 1, session_timeout: float = 0) -> RemoteSession:
    """Ask a tracker for a server registered under ``key`` (a board's name).

    The session knows its server's address (the one connection it opened), so ``remote_timeout``
    works for it as for :func:`connect`.
    """
    tracker = tvm_rpc.connect_tracker(host, port)
    before = _inet_peers()
    session = tracker.request(key, priority=priority, session_timeout=session_timeout)
    opened = _inet_peers() - before
    if len(opened) != 1:
        raise ConnectionError(
            f"tracker {host}:{port}: cannot tell which connection is the session for {key!r} ({len(opened)} opened)"
        )
    peer = opened.pop()
    return RemoteSession(session, peer, f"{peer[0]}:{peer[1]}")


def upload_library(
    session: tvm_rpc.RPCSession, lib: tvm.runtime.Module, name: str = "kernels.so", library_file: str | None = None
):
    """Send a kernel library to the remote and load it there: ``library_file`` (an exported
    library, e.g. an artifact's lib.so) as it is, else ``lib`` exported on the fly. The remote
    file gets a fresh name every time (``name`` with a unique suffix): overwriting a library the
    remote process has mapped would crash it."""
    stem, ext = os.path.splitext(name)
    name = f"{stem}_{uuid.uuid4().hex}{ext or '.so'}"
    if library_file is not None:
        session.upload(str(library_file), target=name)
        return session.load_module(name)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        lib.export_library(path, fcompile=shared_library_linker().fcompile())
        session.upload(path)
    return session.load_module(name)
