"""The CLI answers bad input with one clear line on stderr and a non-zero exit, never a traceback;
``--debug`` shows the traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm_hetero
from tvm_hetero import cli
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory) -> Path:
    import onnx
    from test_byoc import conv_model

    path = tmp_path_factory.mktemp("cli") / "conv.onnx"
    onnx.save(conv_model(), str(path))
    return path


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    art = tvm_hetero.build(MLP, [("cpu:0", "llvm"), ("cpu:1", "llvm")], placement={"matmul": 1}, params=PARAMS)
    return art.export(tmp_path_factory.mktemp("cli") / "a")


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """(exit code, stderr) of ``tvm-hetero argv`` run in this process."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        if not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    err = capsys.readouterr().err
    return code, err


def assert_one_line(code: int, err: str, *fragments: str) -> None:
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_bad_place(capsys, onnx_file, tmp_path):
    assert_one_line(*run_cli(capsys, "compile", str(onnx_file), "-o", str(tmp_path / "o"), "--place", "conv2d=x"),
                    "--place 'conv2d=x'")


def test_bad_target(capsys, onnx_file, tmp_path):
    assert_one_line(*run_cli(capsys, "compile", str(onnx_file), "-o", str(tmp_path / "o"), "--device", "cpu:0=banana"),
                    "tvm-hetero compile: error:", "banana")


def test_missing_model(capsys, tmp_path):
    assert_one_line(*run_cli(capsys, "compile", str(tmp_path / "none.onnx"), "-o", str(tmp_path / "o")),
                    "none.onnx: no such file")


def test_empty_model(capsys, tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert_one_line(*run_cli(capsys, "compile", str(tmp_path / "empty.onnx"), "-o", str(tmp_path / "o")),
                    "empty.onnx: the file is empty")


def test_a_file_that_is_not_onnx(capsys, tmp_path):
    (tmp_path / "junk.onnx").write_bytes(os.urandom(200))
    assert_one_line(*run_cli(capsys, "compile", str(tmp_path / "junk.onnx"), "-o", str(tmp_path / "o")),
                    "junk.onnx: not an ONNX model")


def test_output_onto_a_file(capsys, onnx_file, tmp_path):
    (tmp_path / "taken").write_text("x")
    assert_one_line(*run_cli(capsys, "compile", str(onnx_file), "-o", str(tmp_path / "taken")),
                    "exists and is not a directory")


def test_bad_input_spec(capsys, artifact):
    assert_one_line(*run_cli(capsys, "run", str(artifact), "--input", "x.npy"), "--input 'x.npy': expected NAME=FILE.npy")


def test_unreadable_input_file(capsys, artifact, tmp_path):
    (tmp_path / "x.npy").write_text("not numpy")
    assert_one_line(*run_cli(capsys, "run", str(artifact), "--input", f"x={tmp_path / 'x.npy'}"),
                    "--input x: cannot read")


def test_unknown_input(capsys, artifact, tmp_path):
    np.save(tmp_path / "y.npy", np.ones((4, 16), "float32"))
    assert_one_line(*run_cli(capsys, "run", str(artifact), "--input", f"nope={tmp_path / 'y.npy'}"),
                    "--input nope: the model has no input of that name")


def test_damaged_params(capsys, artifact, tmp_path):
    import shutil

    damaged = tmp_path / "a"
    shutil.copytree(artifact, damaged)
    data = (damaged / "params.bin").read_bytes()
    (damaged / "params.bin").write_bytes(data[:-100])
    assert_one_line(*run_cli(capsys, "run", str(damaged)), "params.bin: checksum mismatch")


def test_not_an_artifact(capsys, tmp_path):
    assert_one_line(*run_cli(capsys, "run", str(tmp_path)), "is not a tvm-hetero artifact")


def test_unknown_demo_model(capsys):
    assert_one_line(*run_cli(capsys, "demo", "--model", "nosuchnet"), "no light model 'nosuchnet'")


def test_a_real_process_prints_one_line_and_debug_shows_the_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tvm_hetero.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "tvm_hetero.cli", "run", str(tmp_path)]
    plain = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 1
    expected = (
        f"tvm-hetero run: error: FileNotFoundError: {tmp_path} is not a tvm-hetero artifact: "
        "missing graph.json, lib.so, params.bin, manifest.json"
    )
    assert plain.stderr.strip().splitlines() == [expected]
    debug = subprocess.run([*command, "--debug"], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr
