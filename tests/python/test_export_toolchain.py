"""The linker behind Artifact.export (tvm_hetero.toolchain): its one choice, ziglang's zig cc linking
real kernel libraries (oneDNN regions included, and a board's aarch64 kernels) that TVM loads, and a
machine with no linker at all getting an error that says what to install."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero import toolchain
from tvm_hetero.testing import models

needs_ziglang = pytest.mark.skipif(toolchain.zig_executable() is None, reason="ziglang is a dependency: pip install")


@pytest.fixture
def no_system_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A PATH with no compiler on it and no $CXX, $CC or $TVM_HETERO_CC."""
    for var in ("CXX", "CC", toolchain.ENV_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def test_the_system_compiler_is_chosen_first_when_present(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for var in ("CXX", "CC", toolchain.ENV_VAR):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "clang"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert toolchain.linker().command == (str(fake),)
    monkeypatch.setenv("CXX", "my-g++ -fuse-ld=gold")
    assert toolchain.linker().command == ("my-g++", "-fuse-ld=gold")
    assert toolchain.linker().source == "$CXX"
    monkeypatch.setenv(toolchain.ENV_VAR, "other-cc")
    assert toolchain.linker().command == ("other-cc",)
    if toolchain.zig_executable() is not None:  # a host compiler command never links a board's kernels
        assert toolchain.linker("aarch64").source == "ziglang"


@needs_ziglang
def test_without_a_system_compiler_ziglang_is_chosen(no_system_compiler, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = toolchain.linker()
    assert chosen.source == "ziglang"
    assert chosen.command[1:] == ("cc", "-target", f"{toolchain.host_architecture()}-linux-gnu")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv(toolchain.ENV_VAR, "zig")
    assert toolchain.linker().command[1:3] == ("cc", "-target")


def test_with_no_linker_at_all_export_names_what_to_install(no_system_compiler, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(toolchain, "zig_executable", lambda: None)
    mod, params = models.mlp()
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], params=params)
    with pytest.raises(toolchain.LinkerNotFoundError, match=r"no linker for x86_64.*pip install ziglang==.*apt-get install g\+\+"):
        art.export(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # nothing written
    monkeypatch.setenv(toolchain.ENV_VAR, "zig")
    with pytest.raises(toolchain.LinkerNotFoundError, match="TVM_HETERO_CC=zig but the ziglang package is not installed"):
        toolchain.linker()


@needs_ziglang
def test_zig_cc_links_a_library_with_onednn_regions_that_tvm_loads_and_runs(no_system_compiler, tmp_path) -> None:
    mod, params = models.small_cnn()
    built = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], params=params, backends=["dnnl"])
    assert "tvm_hetero_dnnl" in [m.kind for m in built.lib.imports]
    built.export(tmp_path / "out")
    assert tvm_hetero.load(tmp_path / "out").lib.imports[0].kind == "tvm_hetero_dnnl"
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    outputs = []
    for art in (built, tvm_hetero.load(tmp_path / "out")):
        with art.create() as runtime:
            runtime.run(x=x)
            outputs.append(runtime.get_output(0).numpy())
    np.testing.assert_array_equal(outputs[1], outputs[0])


@needs_ziglang
@pytest.mark.slow
def test_zig_cc_links_a_boards_aarch64_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A board's library (another architecture) links with no cross toolchain: an aarch64 ELF."""
    monkeypatch.setenv(toolchain.ENV_VAR, "zig")
    mod, _params = models.mlp()
    lib = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}))
    path = tmp_path / "board.so"
    lib.export_library(str(path), fcompile=toolchain.linker("arm64").fcompile())
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], check=True, capture_output=True, text=True).stdout
    assert "__tvm_ffi_" in symbols


def test_a_failing_linker_names_itself_and_its_message(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv(toolchain.ENV_VAR, "false")
    with pytest.raises(RuntimeError, match=r"linking .*out.so with false \(from \$TVM_HETERO_CC\) failed \(exit 1\)"):
        toolchain.linker().link_shared(str(tmp_path / "out.so"), ["a.o"])


@needs_ziglang
@pytest.mark.slow
def test_a_board_artifact_exports_with_no_cross_toolchain(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Export's board library (lib.aarch64.dev1.so) falls back to zig cc when no aarch64 g++ is there."""
    from tvm_hetero.compiler import kernel_libraries

    monkeypatch.setattr(kernel_libraries, "cross_compiler_name", lambda target: "no-such-linux-gnu-g++")
    mod, params = models.mlp()
    board = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), board)], placement={"matmul": 1}, params=params)
    out = art.export(tmp_path / "out")
    header = (out / "lib.aarch64.dev1.so").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    assert tvm_hetero.load(out).device_libs[1].path.name == "lib.aarch64.dev1.so"


def test_tvm_hetero_compile_with_no_linker_says_what_to_install(no_system_compiler, monkeypatch, tmp_path, capsys) -> None:
    """The reported failure: `tvm-hetero compile` on a machine with no C compiler ended in a TypeError."""
    import onnx
    from onnx import TensorProto, helper
    from tvm_hetero import cli

    monkeypatch.setattr(toolchain, "zig_executable", lambda: None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    assert cli.main(["compile", str(model), "-o", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert "LinkerNotFoundError" in error and "pip install ziglang" in error and "TypeError" not in error, error
    assert not (tmp_path / "out").exists()
