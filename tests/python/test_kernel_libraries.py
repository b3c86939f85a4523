"""One kernel library per architecture: layout, manifest, the local-device error, cross-link errors.

These need only the cross toolchain (g++-aarch64-linux-gnu, installed by scripts/setup.sh); running
the kernels on an aarch64 board is tests/python/test_board.py.
"""

from __future__ import annotations

import json

import pytest
import tvm
import tvm_hetero
from tvm_hetero.compiler import kernel_libraries
from tvm_hetero.testing.board import AARCH64_TARGET
from tvm_hetero.testing.models import mlp

ON_BOARD = {"add": 1, "relu": 1}  # the matmuls stay on the host
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}


def elf_machine(path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF"
    return int.from_bytes(header[18:20], "little")


@pytest.fixture(scope="module")
def board_artifact():
    mod, params = mlp()
    return tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), AARCH64_TARGET)], placement=ON_BOARD,
                            params=params)


def test_target_architecture():
    assert kernel_libraries.target_architecture(tvm.target.Target(AARCH64_TARGET)) == "aarch64"
    assert kernel_libraries.target_architecture(tvm.target.Target("llvm")) == kernel_libraries.host_architecture()
    assert kernel_libraries.cross_compiler_name(tvm.target.Target(AARCH64_TARGET)) == "aarch64-linux-gnu-g++"


def test_foreign_device_kernels_are_in_their_own_library(board_artifact, tmp_path):
    library = board_artifact.device_libs[1]
    assert library.arch == "aarch64" and library.devices == [1]
    graph = board_artifact.graph
    kernels = {n["attrs"]["func_name"]: graph["attrs"]["device_index"][1][i] for i, n in enumerate(graph["nodes"])
               if n["op"] == "tvm_op" and n["attrs"]["func_name"] != "__copy"}
    assert sorted(set(kernels.values())) == [0, 1]
    for name, device in kernels.items():  # the host library holds only host kernels
        assert board_artifact.lib.implements_function(name, True) == (device == 0), name
    out = board_artifact.export(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["host_arch"] == kernel_libraries.host_architecture()
    [entry] = manifest["device_libraries"]
    assert entry["devices"] == [1] and entry["arch"] == "aarch64"
    assert tvm.target.Target(entry["target"]).attrs["mtriple"] == "aarch64-linux-gnu"
    assert elf_machine(out / entry["file"]) == ELF_MACHINE["aarch64"]
    assert elf_machine(out / "lib.so") == ELF_MACHINE[kernel_libraries.host_architecture()]
    loaded = tvm_hetero.load(out)
    assert loaded.device_libs[1].path == out / entry["file"] and loaded.device_libs[1].arch == "aarch64"


def test_same_architecture_keeps_one_library(tmp_path):
    mod, params = mlp()
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], placement=ON_BOARD, params=params)
    assert art.device_libs == {}
    out = art.export(tmp_path)
    assert "device_libraries" not in json.loads((out / "manifest.json").read_text())
    assert sorted(p.name for p in out.glob("*.so")) == ["lib.so"]


def test_a_foreign_device_cannot_be_local(board_artifact, tmp_path):
    message = r"device 1 \(cpu:1\) has kernels for aarch64 .*local device of this .* host"
    with pytest.raises(ValueError, match=message):
        board_artifact.create()
    with pytest.raises(ValueError, match=message):
        tvm_hetero.load(board_artifact.export(tmp_path)).create()


def test_the_primary_device_must_be_the_hosts_architecture():
    mod, params = mlp()
    with pytest.raises(ValueError, match=r"device 0 \(cpu:0\) is the primary device.*not aarch64"):
        tvm_hetero.build(mod, [(tvm.cpu(0), AARCH64_TARGET), (tvm.cpu(1), "llvm")], params=params)


def test_cross_link_errors_name_the_device_and_target(board_artifact, tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_libraries, "cross_compiler_name", lambda target: "false")  # a linker that fails
    with pytest.raises(RuntimeError, match=r"device 1 \(cpu:1\) with target llvm -mtriple=aarch64-linux-gnu "
                                           r"for aarch64: exporting its kernels with false failed"):
        board_artifact.export(tmp_path / "a")
    monkeypatch.setattr(kernel_libraries, "cross_compiler_name", lambda target: "no-such-linux-gnu-g++")
    monkeypatch.setattr(kernel_libraries, "zig_linker", lambda arch: None)  # and no ziglang either
    with pytest.raises(RuntimeError, match=r"device 1 \(cpu:1\) with target llvm -mtriple=aarch64-linux-gnu "
                                           r"for aarch64: cross compiler no-such-linux-gnu-g\+\+ not found"):
        board_artifact.export(tmp_path / "b")


def test_a_missing_board_library_is_named(board_artifact, tmp_path):
    out = board_artifact.export(tmp_path)
    (out / "lib.aarch64.dev1.so").unlink()
    # The manifest lists (and checksums) every library file: the loader names the missing one.
    with pytest.raises((FileNotFoundError, ValueError), match=r"lib.aarch64.dev1.so: listed in the manifest but missing"):
        tvm_hetero.load(out)


def test_kernel_compile_errors_name_the_device_and_target(monkeypatch):
    from tvm_hetero.compiler import compile_kernels as lower

    real_build = lower._build

    def build_failing_for_arm(mod, target):
        if "aarch64" in str(target.attrs.get("mtriple", "")) and len(mod.functions):
            raise RuntimeError("LLVM ERROR: no instruction selected")  # what a codegen failure looks like
        return real_build(mod, target)

    monkeypatch.setattr(lower, "_build", build_failing_for_arm)
    mod, params = mlp()
    with pytest.raises(RuntimeError, match=r"kernel \S+ \(ops .*relu.*\) placed on device 1 cannot be compiled for "
                                           r"target llvm -mtriple=aarch64-linux-gnu: LLVM ERROR"):
        tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), AARCH64_TARGET)], placement=ON_BOARD, params=params)


def test_board_command_prints_how_to_start_the_server(capsys):
    from tvm_hetero.cli import main

    assert main(["board"]) == 0
    text = capsys.readouterr().out
    assert "python -m tvm.exec.rpc_server" in text and "--load-library" in text
    assert "cmake/aarch64-linux-gnu.cmake" in text and "emulated board:" in text
