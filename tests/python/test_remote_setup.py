"""Remote set-up is bounded and its failures name the server; loaded artifacts offload.

Each case uses a real second process (tvm.exec.rpc_server with libtvm_hetero), stopped with SIGSTOP
or killed where the case needs it, or a plain socket that accepts and never answers.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero import rpc
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()
TWO_CPUS = [("cpu:0", "llvm"), ("cpu:1", "llvm")]
X = np.random.default_rng(4).standard_normal((4, 16)).astype("float32")
EXPECTED = np.maximum(X @ PARAMS["w1"] + PARAMS["b1"], 0) @ PARAMS["w2"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    art = tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 1}, params=PARAMS)
    return art.export(tmp_path_factory.mktemp("remote") / "a")


@pytest.fixture
def server():
    with rpc.start_local_server() as s:
        yield s


def stop(server: rpc.LocalServer) -> None:
    os.killpg(server.process.pid, signal.SIGSTOP)


def test_a_loaded_artifact_offloads_its_library_file(exported, server):
    session = server.connect()
    loaded = tvm_hetero.load(exported)
    assert loaded.library_file_for(session.cpu(0)) == exported / "lib.so"
    rt = loaded.create([tvm.cpu(0), session.cpu(0)], remote_timeout=60)
    rt.run(x=X)
    np.testing.assert_allclose(rt.get_output(0).numpy(), EXPECTED, rtol=1e-5, atol=1e-5)
    stats = rt.stats()
    assert stats["offload_segments"] >= 1 and stats["remote_compute_calls"] >= 1


def test_a_stopped_server_before_create_is_a_timeout_naming_it(exported, server):
    session = server.connect()
    loaded = tvm_hetero.load(exported)
    stop(server)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"127\.0\.0\.1:{server.port} did not answer within 2 s while uploading"):
        loaded.create([tvm.cpu(0), session.cpu(0)], remote_timeout=2)
    assert time.monotonic() - start < 30


def test_a_killed_server_before_create_is_a_connection_error_naming_it(exported, server):
    session = server.connect()
    loaded = tvm_hetero.load(exported)
    server.kill()
    with pytest.raises(ConnectionError, match=rf"127\.0\.0\.1:{server.port}: the connection was lost while uploading"):
        loaded.create([tvm.cpu(0), session.cpu(0)])


class SilentPort:
    """A socket that accepts connections and then either says nothing or answers junk."""

    def __init__(self, reply: bytes | None = None):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.reply = reply
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.conns.append(conn)
        if self.reply is not None:
            conn.recv(64)
            conn.sendall(self.reply)
            conn.close()

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.listener.close()


@pytest.mark.parametrize("timeout", [1.0, None])
def test_connect_to_a_port_that_never_answers_is_a_timeout_naming_it(timeout):
    # None: the default, a few seconds (users expect a connect to fail fast, not after a minute)
    limit = rpc.DEFAULT_CONNECT_TIMEOUT if timeout is None else timeout
    assert limit <= 5.0
    port = SilentPort()
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"RPC server 127\.0\.0\.1:{port.port} did not complete the handshake "
                                               rf"within {limit:g} s"):
            rpc.connect("127.0.0.1", port.port, **({} if timeout is None else {"connect_timeout": timeout}))
        assert limit <= time.monotonic() - start < limit + 2.0
    finally:
        port.close()


def test_connect_to_a_port_answering_junk_is_a_connection_error_naming_it():
    port = SilentPort(reply=b"HTTP/1.1 400 Bad Request\r\n\r\n" * 4)
    try:
        with pytest.raises(ConnectionError, match=rf"RPC server 127\.0\.0\.1:{port.port}: connection failed"):
            rpc.connect("127.0.0.1", port.port, connect_timeout=10)
    finally:
        port.close()


def test_remote_timeout_works_for_tracker_sessions(exported):
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
    try:
        with rpc.LocalServer(tracker=("127.0.0.1", tracker.port), key="board") as server:
            session = None
            deadline = time.monotonic() + 30
            while session is None:  # the server registers with the tracker shortly after it listens
                try:
                    session = rpc.connect_tracker("127.0.0.1", tracker.port, "board")
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            assert isinstance(session, rpc.RemoteSession)
            loaded = tvm_hetero.load(exported)
            rt = loaded.create([tvm.cpu(0), session.cpu(0)], remote_timeout=5)
            rt.run(x=X)
            np.testing.assert_allclose(rt.get_output(0).numpy(), EXPECTED, rtol=1e-5, atol=1e-5)
            # The timeout applies to this session's runs: a stopped server is reported, not waited on.
            stop(server)
            with pytest.raises(TimeoutError, match=rf"{session.address} did not answer within 5 s during run"):
                rt.run()
    finally:
        tracker.terminate()


def test_two_libraries_uploaded_under_one_name_both_run(rpc_server):
    # The remote process maps what it loads: a second library written over the first one's file
    # crashed the server (automatic placement uploads one library per measuring round).
    session = rpc_server.connect()
    device = session.cpu(0)
    x = tvm.runtime.tensor(np.arange(4, dtype="float32"), device)
    results = []
    for offset in (1.0, 2.0):
        a = tvm.te.placeholder((4,), "float32", name="a")
        b = tvm.te.compute((4,), lambda i: a[i] + offset, name="b")  # noqa: B023 (used at once)
        func = tvm.te.create_prim_func([a, b]).with_attr("global_symbol", "add_offset")
        lib = tvm.compile(tvm.IRModule({"add_offset": func}), target="llvm")
        remote = rpc.upload_library(session, lib, "same_name.so")
        y = tvm.runtime.empty((4,), "float32", device)
        remote["add_offset"](x, y)
        results.append(y.numpy())
    np.testing.assert_allclose(results[0], np.arange(4) + 1.0)
    np.testing.assert_allclose(results[1], np.arange(4) + 2.0)


def test_a_second_session_to_a_busy_server_times_out_saying_why():
    # TVM's RPC server serves one session at a time: a second one waits for the first to close.
    with rpc.start_local_server() as server:
        first = server.connect()
        with pytest.raises(TimeoutError, match=rf"127\.0\.0\.1:{server.port} did not complete the handshake "
                                               r"within 1 s \(a TVM RPC server serves one session at a time"):
            server.connect(connect_timeout=1)
        del first
