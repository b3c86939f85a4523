"""Local and remote (TVM RPC) devices in one runtime, with one cross-process call per remote group.

The host runtime owns every tensor, including those that live in the remote process (allocated
there through TVM's RPC device API). For each remote device the host exports the *segments* of its
groups (maximal runs of kernels) and the tensors they use; the remote process builds an
``OffloadRunner`` (src/offload_runner.cc) holding each segment's kernels and packed arguments, and
from then on the host calls ``run_segment(i)`` once per segment instead of once per kernel. Tensors
cross only through the graph's ``__copy`` nodes.

A server lost during set-up or a run is a ConnectionError, one that does not answer within
``remote_timeout`` a TimeoutError, both naming the remote devices and their servers' ``host:port``
(:class:`RemoteCalls`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tvm
import tvm_ffi

from ..devices import name_of
from ..errors import last_line


class MixedRuntime(NamedTuple):
    """What :func:`create_mixed` makes; ``graph_runtime.create`` wraps it in a GraphModule."""

    #: The host's runtime module.
    module: tvm.runtime.Module
    #: Sessions, uploaded libraries and runners the module needs alive.
    keep_alive: tuple
    #: What bounds (``remote_timeout``) and names a run's remote calls: a :class:`RemoteCalls`.
    watchdog: Any


def _session_of(device: tvm.runtime.Device):
    session = getattr(device, "_rpc_sess", None)
    if session is None:
        raise ValueError(f"device {name_of(device)} is remote but carries no RPC session (make it with session.cpu(0) etc.)")
    return session


def _remote_library(session, lib: tvm.runtime.Module, cache: dict, library_file=None) -> tvm.runtime.Module:
    """The kernel library loaded in the remote process (uploaded once per session)."""
    from .rpc import upload_library

    key = id(session)
    if key not in cache:
        cache[key] = upload_library(session, lib, name="tvm_hetero_kernels.so", library_file=library_file)
    return cache[key]


def _address(session) -> str:
    return getattr(session, "address", None) or "the RPC server"


def create_mixed(
    graph_json: str,
    lib: tvm.runtime.Module,
    devices: Sequence[tvm.runtime.Device],
    remote: Sequence[bool],
    device_index_kind: str,
    offload: str,
    remote_timeout: float | None = None,
    remote_library: Callable[[tvm.runtime.Device], Any] | None = None,
    device_libs=None,
) -> MixedRuntime:
    """A runtime over local and remote devices (``remote[i]``: whether ``devices[i]`` is an RPC
    session's); see the module docstring.

    With ``remote_timeout`` (seconds), set-up (kernel upload, runtime and runner creation) and every
    run are bounded: past it the connections to the remote servers are closed and TimeoutError names
    them, instead of waiting forever on a hung or stopped server. ``remote_library(device)`` gives
    the exported library file a remote device uploads (None: ``lib`` exported on the fly);
    ``device_libs[position]`` is the library of a device of another architecture.
    """
    sessions = list(dict.fromkeys(_session_of(dev) for dev, away in zip(devices, remote) if away))
    watchdog = None
    if remote_timeout is not None:
        from .rpc import RemoteSession, RunWatchdog

        if not all(isinstance(s, RemoteSession) for s in sessions):
            raise ValueError(
                "remote_timeout needs sessions from tvm_hetero.rpc.connect, connect_tracker or LocalServer.connect"
            )
        watchdog = RunWatchdog([s.peer for s in sessions], remote_timeout, ", ".join(s.address for s in sessions))
    guard = RemoteCalls(_remote_devices(devices, remote, sessions), watchdog)
    stage = "uploading the kernel library"
    try:
        with watchdog if watchdog is not None else contextlib.nullcontext():
            remote_libs: dict = {}
            libs = []
            for position, dev in enumerate(devices):
                if not remote[position]:
                    libs.append(lib)
                elif device_libs and position in device_libs:  # another architecture: its own library
                    libs.append(device_libs[position].upload(_session_of(dev), remote_libs))
                else:
                    library_file = remote_library(dev) if remote_library is not None else None
                    libs.append(_remote_library(_session_of(dev), lib, remote_libs, library_file))
            stage = "creating the runtime"
            fcreate = tvm_ffi.get_global_func("tvm_hetero.graph_runtime.create")
            module = fcreate(graph_json, libs, device_index_kind, *devices)
            runners = []
            if offload == "group":
                stage = "creating the remote runners"
                for position, dev in enumerate(devices):
                    if remote[position]:
                        runner = _attach_runner(module, position, _session_of(dev), libs[position])
                        if runner is not None:
                            runners.append(runner)
    except (OSError, RuntimeError, ValueError) as err:
        servers = ", ".join(_address(s) for s in sessions)
        if watchdog is not None and watchdog.fired:
            raise TimeoutError(
                f"{servers} did not answer within {remote_timeout} s while {stage}; the connection was closed"
            ) from None
        if not _connection_lost(err):
            raise
        raise ConnectionError(
            f"{servers}: the connection was lost while {stage} (server stopped or gone?): "
            f"{last_line(err)}"
        ) from None
    return MixedRuntime(module, (tuple(sessions), tuple(libs), tuple(runners)), guard)


def _remote_devices(devices: Sequence[tvm.runtime.Device], remote: Sequence[bool], sessions: list) -> str:
    """``device 1 (remote:cpu:0) at 127.0.0.1:9091``, per server, for messages."""
    from ..devices import cost_key

    named = []
    for session in sessions:
        where = [f"device {p} ({cost_key(dev)})" for p, (dev, away) in enumerate(zip(devices, remote))
                 if away and _session_of(dev) is session]
        named.append(f"{', '.join(where)} at {_address(session)}")
    return "; ".join(named)


class RemoteCalls:
    """Names (and, with a watchdog, bounds) a run that calls remote devices. Used as a context
    manager around ``run``: on the way out, an error that is the connection failing becomes a
    ConnectionError naming every remote device and its server's ``host:port``, and one after the
    watchdog fired a TimeoutError naming them (the transport reports both only in its message).
    The runtime stays usable: a later run raises the same way, and ``close`` releases it."""

    def __init__(self, address: str, watchdog: Any = None) -> None:
        #: The remote devices and their servers, for messages.
        self.address = address
        self.watchdog = watchdog

    @property
    def fired(self) -> bool:
        """Whether the watchdog closed the connections (the run took longer than ``timeout``)."""
        return self.watchdog is not None and self.watchdog.fired

    @property
    def timeout(self) -> float | None:
        return None if self.watchdog is None else self.watchdog.timeout

    def __enter__(self) -> RemoteCalls:  # noqa: PYI034
        if self.watchdog is not None:
            self.watchdog.__enter__()
        return self

    def __exit__(self, exc_type, exc, _tb) -> None:
        if self.watchdog is not None:
            self.watchdog.__exit__(None, None, None)
        if exc is None or isinstance(exc, (TimeoutError, ConnectionError)):
            return  # nothing raised, or already named
        if self.fired:
            raise TimeoutError(f"{self.address} did not answer within {self.timeout} s during run; "
                               "the connection was closed (create a new runtime after reconnecting)") from exc
        if isinstance(exc, Exception) and _connection_lost(exc):
            raise ConnectionError(f"{self.address}: the connection was lost during run (server stopped or gone?); "
                                  f"create a new runtime after reconnecting: {last_line(exc)}") from exc


def _connection_lost(err: BaseException) -> bool:
    """Whether an error is the connection failing (TVM reports it only in the message; the runtime
    says so of a remote step that failed other than by an error raised remotely)."""
    if isinstance(err, (ConnectionError, BrokenPipeError)):
        return True
    text = str(err)
    return any(sign in text for sign in ("kShutdown", "RPCCode", "Broken pipe", "Connection reset", "Socket", "socket",
                                         "connection to the remote device was lost"))


def _attach_runner(module, position: int, session, remote_lib):
    plan = json.loads(module["offload_plan"](position))
    if not plan["segments"]:
        return None
    tensors = [module["get_entry"](eid) for eid in plan["entries"]]
    create_runner = session.get_function("tvm_hetero.offload.create_runner")
    runner = create_runner(remote_lib, json.dumps(plan), *tensors)
    module["attach_offload_runner"](position, runner["run_segment"])
    return runner


__all__ = ["MixedRuntime", "RemoteCalls", "create_mixed"]
