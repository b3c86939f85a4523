"""Local and remote (TVM RPC) devices in one runtime, with one cross-process call per remote group.

The host runtime owns every tensor, including those that live in the remote process (allocated
there through TVM's RPC device API). For each remote device the host exports the *segments* of its
groups (maximal runs of kernels) and the tensors they use; the remote process builds an
``OffloadRunner`` (src/offload_runner.cc) holding each segment's kernels and packed arguments, and
from then on the host calls ``run_segment(i)`` once per segment instead of once per kernel. Tensors
cross only through the graph's ``__copy`` nodes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

import tvm
import tvm_ffi

from .graph_runtime import RPC_SESS_MASK, GraphModule, is_remote


def _session_of(device: tvm.runtime.Device):
    session = getattr(device, "_rpc_sess", None)
    if session is None:
        raise ValueError(f"device {device} is remote but carries no RPC session (make it with session.cpu(0) etc.)")
    return session


def _remote_library(session, lib: tvm.runtime.Module, cache: dict) -> tvm.runtime.Module:
    """The kernel library loaded in the remote process (exported and uploaded once per session)."""
    from .rpc import upload_library

    key = id(session)
    if key not in cache:
        # A fresh name each time: overwriting a library the remote process has mapped would crash it.
        cache[key] = upload_library(session, lib, name=f"tvm_hetero_kernels_{uuid.uuid4().hex}.so")
    return cache[key]


def create_mixed(
    graph_json: str,
    lib: tvm.runtime.Module,
    devices: Sequence[tvm.runtime.Device],
    device_index_kind: str,
    offload: str,
    remote_timeout: float | None = None,
    device_libs=None,
) -> GraphModule:
    """A runtime over local and remote devices; see the module docstring.

    With ``remote_timeout`` (seconds), a run that has not finished in time closes the connections to
    the remote servers and raises TimeoutError instead of waiting forever on a hung device.
    """
    remote_libs: dict = {}
    libs, sessions = [], []
    for position, dev in enumerate(devices):
        if is_remote(dev):
            session = _session_of(dev)
            sessions.append(session)
            if device_libs and position in device_libs:  # another architecture: its own library
                libs.append(device_libs[position].upload(session, remote_libs))
            else:
                libs.append(_remote_library(session, lib, remote_libs))
        else:
            libs.append(lib)
    fcreate = tvm_ffi.get_global_func("tvm_hetero.graph_runtime.create")
    module = fcreate(graph_json, libs, device_index_kind, *devices)
    runners = []
    if offload == "group":
        for position, dev in enumerate(devices):
            if is_remote(dev):
                runner = _attach_runner(module, position, _session_of(dev), libs[position])
                if runner is not None:
                    runners.append(runner)
    watchdog = None
    if remote_timeout is not None:
        from .rpc import RunWatchdog

        peers = []
        for session in dict.fromkeys(sessions):
            peer = getattr(session, "_tvm_hetero_peer", None)
            if peer is None:
                raise ValueError("remote_timeout needs sessions opened with tvm_hetero.rpc.connect (or LocalServer)")
            peers.append(peer)
        watchdog = RunWatchdog(peers, remote_timeout)
    rt = GraphModule(module, devices[0], keep_alive=(tuple(sessions), tuple(libs), tuple(runners)))
    rt._watchdog = watchdog
    return rt


def _attach_runner(module, position: int, session, remote_lib):
    plan = json.loads(module["offload_plan"](position))
    if not plan["segments"]:
        return None
    tensors = [module["get_entry"](eid) for eid in plan["entries"]]
    create_runner = session.get_function("tvm_hetero.offload.create_runner")
    runner = create_runner(remote_lib, json.dumps(plan), *tensors)
    module["attach_offload_runner"](position, runner["run_segment"])
    return runner


__all__ = ["RPC_SESS_MASK", "create_mixed"]
