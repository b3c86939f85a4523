"""A model across the x86 host and an emulated aarch64 board (scripts/board.sh): outputs, remote call
counts, exported artifacts, a hung board and a crashed session worker.

The board takes minutes to prepare the first time, so CI starts it in its own step (scripts/test.sh:
``scripts/board.sh start`` then ``pytest -m board``); without a running board these tests skip.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero import graph_runtime
from tvm_hetero.rpc import connect
from tvm_hetero.testing.board import (
    AARCH64_TARGET,
    board_address,
    connect_board,
    server_pid,
    start_board_server,
)
from tvm_hetero.testing.models import small_cnn

pytestmark = pytest.mark.board

# An NPU-style split: convolutions, pooling and elementwise ops on the board; the rest on the host.
BOARD_OPS = {"conv2d", "add", "relu", "max_pool2d", "avg_pool2d"}
# Different ISAs may fuse and round multiply-adds differently (aarch64 FMA); the outputs are O(1).
RTOL, ATOL = 1e-4, 1e-5


def board_placement(info) -> int:
    return 1 if info.op.split(".")[-1] in BOARD_OPS else 0


@pytest.fixture(scope="module")
def board():
    if board_address() is None:
        pytest.skip("no emulated aarch64 board is running (scripts/board.sh start); CI runs these tests in its "
                    "board step")


@pytest.fixture(scope="module")
def cnn():
    mod, params = small_cnn()
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype("float32")
    host_only = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], params=params).create()
    host_only.run(x=x)
    board_art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), AARCH64_TARGET)],
                                 placement=board_placement, params=params)
    return board_art, x, host_only.get_output(0).numpy()


def remote_kernels(art) -> int:
    graph = art.graph
    devices = graph["attrs"]["device_index"][1]
    return sum(1 for i, n in enumerate(graph["nodes"])
               if n["op"] == "tvm_op" and n["attrs"]["func_name"] != "__copy" and devices[i] == 1)


@pytest.mark.parametrize("offload", ["group", "per_op"])
def test_cnn_across_host_and_board_matches_host_only(board, cnn, offload):
    art, x, expected = cnn
    session = connect_board()
    rt = graph_runtime.create(art.graph_json, art.lib, [tvm.cpu(0), session.cpu(0)], offload=offload,
                              device_libs=art.device_libs)
    rt.load_params(tvm.runtime.save_param_dict(art.params))
    for _ in range(2):  # a second run reuses everything the first prepared
        rt.run(x=x)
        np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=RTOL, atol=ATOL)
    stats = rt.stats()
    remote_groups = stats["group_devices"].count(1)
    assert remote_groups >= 1
    expected_calls = remote_groups if offload == "group" else remote_kernels(art)
    assert stats["remote_compute_calls"] == expected_calls
    assert remote_kernels(art) > remote_groups  # grouping saves calls on this model
    if offload == "group":  # copies travel inside the board groups' calls
        assert stats["round_trips"] == remote_groups
        assert stats["copies_in_remote_calls"] == stats["num_copies"] > 0
    else:
        assert stats["remote_copies"] == stats["num_copies"] > 0


def test_exported_artifact_runs_on_the_board(board, cnn, tmp_path):
    art, x, expected = cnn
    loaded = tvm_hetero.load(art.export(tmp_path))
    rt = loaded.create([tvm.cpu(0), connect_board().cpu(0)])
    rt.run(x=x)
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=RTOL, atol=ATOL)
    assert rt.stats()["remote_compute_calls"] == rt.stats()["group_devices"].count(1)


def test_hung_board_times_out_and_recovers(board, cnn):
    art, x, expected = cnn
    pid = server_pid()
    if pid is None:
        pytest.skip("the board was not started by scripts/board.sh here (no server.pid): cannot pause it")
    rt = graph_runtime.create(art.graph_json, art.lib, [tvm.cpu(0), connect_board().cpu(0)], remote_timeout=20.0,
                              device_libs=art.device_libs)
    rt.load_params(tvm.runtime.save_param_dict(art.params))
    rt.run(x=x)  # within the limit
    os.killpg(pid, signal.SIGSTOP)  # the board hangs: alive, never answers
    try:
        start = time.perf_counter()
        with pytest.raises(TimeoutError, match="did not answer within 20.0 s"):
            rt.run(x=x)
        assert time.perf_counter() - start < 30
    finally:
        os.killpg(pid, signal.SIGCONT)
    again = art.create([tvm.cpu(0), connect_board().cpu(0)])
    again.run(x=x)
    np.testing.assert_allclose(again.get_output(0).numpy(), expected, rtol=RTOL, atol=ATOL)


def test_crashed_board_raises_a_clear_error(board, cnn):
    art, x, _ = cnn
    port = 9290
    server = start_board_server(port)  # its own server: this test kills it
    try:
        rt = art.create([tvm.cpu(0), connect("127.0.0.1", port).cpu(0)])
        rt.run(x=x)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        # The input is already on the board, so the first board group is the first call; the socket's
        # own words vary (reset, broken pipe, lost), the group and device are always named.
        for _ in range(2):  # the second run is still a clean error, not a crash
            with pytest.raises(Exception, match=r"offloaded group starting at node \d+ .* on device 1 \(remote"):
                rt.run()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
