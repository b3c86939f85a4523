"""The board an RPC session reaches: the emulated ARM board of scripts/board.sh, or instructions for
a real one.

``scripts/board.sh start`` writes ``host:port`` of its server into ``$TVM_HETERO_BOARD_DIR/server``
(default ``~/.cache/tvm-hetero/board/server``); ``TVM_HETERO_BOARD=host:port`` names any other board.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

AARCH64_TARGET = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}


def board_dir() -> Path:
    return Path(os.environ.get("TVM_HETERO_BOARD_DIR", Path.home() / ".cache" / "tvm-hetero" / "board"))


def board_address() -> tuple[str, int] | None:
    """``(host, port)`` of a board that accepts connections now, else None."""
    text = os.environ.get("TVM_HETERO_BOARD")
    if not text:
        state = board_dir() / "server"
        text = state.read_text().strip() if state.is_file() else ""
    if not text:
        return None
    host, _, port = text.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return host, int(port)
    except (OSError, ValueError):
        return None


def server_pid() -> int | None:
    """The emulated board's server process (its session workers are its children)."""
    path = board_dir() / "server.pid"
    return int(path.read_text()) if path.is_file() else None


def start_board_server(port: int, startup_timeout: float = 120.0) -> subprocess.Popen:
    """A second RPC server in the prepared board root (scripts/board.sh start must have run), in its own
    process group: tests that crash a board kill it, not the shared one (TVM's server stops listening
    when a session process dies)."""
    root = board_dir() / "root"
    site = "/opt/venv/lib/python3.11/site-packages"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{site}/tvm/lib:{site}/tvm_ffi/lib", "TVM_NUM_THREADS": "1"}
    cmd = ["chroot", str(root), "/opt/venv/bin/python", "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
           "--port", str(port), "--port-end", str(port + 1), "--load-library", "/opt/tvm-hetero/libtvm_hetero.so"]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"board server on port {port} exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.5)
    os.killpg(process.pid, 9)
    raise TimeoutError(f"board server did not listen on port {port} within {startup_timeout} s")


def connect_board(session_timeout: float = 0):
    """An RPC session on the running board (RuntimeError naming how to start one if none runs)."""
    from ..runtime.rpc import connect

    address = board_address()
    if address is None:
        raise RuntimeError("no board is running: start the emulated one with scripts/board.sh start, or set "
                           "TVM_HETERO_BOARD=host:port")
    return connect(*address, session_timeout=session_timeout)


REAL_BOARD_INSTRUCTIONS = """\
Running the offload side on a real 64-bit ARM Linux board (aarch64):

1. On the board (Python 3.11):
     python3 -m venv ~/tvm && ~/tvm/bin/pip install apache-tvm==0.27.0.post1
2. On this machine, cross-compile the board's libtvm_hetero against the aarch64 wheels
   (apt-get install g++-aarch64-linux-gnu):
     pip download apache-tvm==0.27.0.post1 --platform manylinux_2_28_aarch64 --only-binary=:all: \\
         --python-version 3.11 -d wheels
     mkdir wheel-root && for w in wheels/apache_tvm*.whl; do python -m zipfile -e $w wheel-root; done
     cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \\
         -DTVM_WHEEL_ROOT=$PWD/wheel-root -DTVM_HETERO_WITH_ONEDNN=OFF && cmake --build build-aarch64
     scp build-aarch64/libtvm_hetero.so board:~/libtvm_hetero.so
3. On the board, start the server:
     ~/tvm/bin/python -m tvm.exec.rpc_server --host 0.0.0.0 --port 9090 --load-library ~/libtvm_hetero.so
4. On this machine, build with the board's target and run:
     art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"),
                                  (tvm.cpu(1), {"kind": "llvm", "mtriple": "aarch64-linux-gnu"})], ...)
     session = tvm_hetero.rpc.connect("BOARD-IP", 9090)
     rt = art.create([tvm.cpu(0), session.cpu(0)])   # the board's kernel library is uploaded

An emulated board on this machine (QEMU user mode, needs root): scripts/board.sh start
"""
