"""The CLI does what its help and the README say: run saves into a new folder and still writes its
trace, prints outputs at their own precision, runs and inspects pipelines, checks --place before the
model is imported, takes a model path in demo-htp, accepts any CPU index TVM does, and has help text
for every argument."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tvm_hetero
from test_cli_errors import assert_one_line, run_cli
from tvm_hetero import cli, pipeline
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()
X = np.random.default_rng(11).standard_normal((4, 16)).astype("float32")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    art = tvm_hetero.build(MLP, [("cpu:0", "llvm"), ("cpu:1", "llvm")], placement={"matmul": 1}, params=PARAMS)
    return art.export(tmp_path_factory.mktemp("cli") / "a")


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory) -> Path:
    art = pipeline.build(MLP, ["cpu:0", "cpu:1"], [1], params=PARAMS)
    return art.export(tmp_path_factory.mktemp("cli") / "pipe")


@pytest.fixture
def x_file(tmp_path) -> Path:
    np.save(tmp_path / "x.npy", X)
    return tmp_path / "x.npy"


def expected() -> np.ndarray:
    return np.maximum(X @ PARAMS["w1"] + PARAMS["b1"], 0) @ PARAMS["w2"]


def test_run_creates_the_save_folder_and_writes_the_trace(capsys, artifact, x_file, tmp_path):
    save, trace = tmp_path / "new" / "outputs", tmp_path / "run.json"
    assert cli.main(["run", str(artifact), "--input", f"x={x_file}", "--save", str(save), "--trace", str(trace)]) == 0
    np.testing.assert_allclose(np.load(save / "output_0.npy"), expected(), rtol=1e-4, atol=1e-4)
    assert json.loads(trace.read_text())["traceEvents"]
    (tmp_path / "a_file").write_text("x")
    assert_one_line(*run_cli(capsys, "run", str(artifact), "--save", str(tmp_path / "a_file")),
                    "tvm-hetero run: error:", "exists and is not a directory")


def test_outputs_are_printed_at_their_own_precision(capsys, artifact, x_file, tmp_path):
    assert cli.main(["run", str(artifact), "--input", f"x={x_file}", "--save", str(tmp_path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("output 0"))
    printed = re.search(r"first values \[(.*)\]", line).group(1).split(", ")
    saved = np.load(tmp_path / "output_0.npy")
    assert "float32" in line and printed == [str(v) for v in saved.ravel()[:5]]  # float32's shortest repr


def test_run_and_inspect_take_a_pipeline(capsys, pipeline_dir, x_file, tmp_path):
    save = tmp_path / "out"
    code = cli.main(["run", str(pipeline_dir), "--input", f"x={x_file}", "--repeat", "3", "--save", str(save),
                     "--cluster", "0=0", "--cluster", "1=1"])
    out = capsys.readouterr().out
    assert code == 0 and "inferences/s" in out
    np.testing.assert_allclose(np.load(save / "output_0.npy"), expected(), rtol=1e-4, atol=1e-4)
    dot = tmp_path / "p.dot"
    assert cli.main(["inspect", str(pipeline_dir), "--dot", str(dot)]) == 0
    out = capsys.readouterr().out
    assert "tvm-hetero pipeline: 2 stages" in out and "stage 1 nodes:" in out
    assert "subgraph cluster_0" in dot.read_text() and "subgraph cluster_1" in dot.read_text()
    assert_one_line(*run_cli(capsys, "run", str(pipeline_dir), "--trace", str(tmp_path / "t.json")),
                    "tvm-hetero run: error:", "--trace:", "is a pipeline")


def test_a_damaged_pipeline_is_refused_in_one_line(capsys, pipeline_dir, tmp_path):
    import shutil

    damaged = tmp_path / "pipe"
    shutil.copytree(pipeline_dir, damaged)
    data = bytearray((damaged / "params.bin").read_bytes())
    data[-3] ^= 1
    (damaged / "params.bin").write_bytes(bytes(data))
    assert_one_line(*run_cli(capsys, "run", str(damaged)), "params.bin: checksum mismatch")


def test_a_bad_place_fails_before_the_model_is_imported(capsys, tmp_path):
    missing_model = str(tmp_path / "none.onnx")  # importing it would fail: the flag must be judged first
    for place, message in (("conv2d=x", "--place 'conv2d=x': expected OP=DEVICE_INDEX"),
                           ("conv2d=7", "--place 'conv2d=7': device 7 is out of range for 2 devices")):
        assert_one_line(*run_cli(capsys, "compile", missing_model, "-o", str(tmp_path / "o"), "--place", place),
                        "tvm-hetero compile: error: ValueError: " + message)


def test_demo_htp_takes_a_model_path(capsys, tmp_path):
    assert_one_line(*run_cli(capsys, "demo-htp", "--model", str(tmp_path / "mine.onnx")),
                    "tvm-hetero demo-htp: error:", "mine.onnx: no such file")


def test_a_cpu_index_beyond_the_cores_is_a_device_as_in_the_python_api(capsys, tmp_path, x_file):
    # TVM's cpu(5) is a distinct device on any machine (its executor is a thread); the CLI agrees
    # with tvm_hetero.build, which accepts it.
    import onnx
    from test_byoc import conv_model

    onnx.save(conv_model(), str(tmp_path / "conv.onnx"))
    out = tmp_path / "o"
    assert cli.main(["compile", str(tmp_path / "conv.onnx"), "--device", "cpu:0=llvm", "--device", "cpu:5=llvm",
                     "--place", "conv2d=1", "-o", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["device_names"] == ["cpu:0", "cpu:5"]
    assert cli.main(["run", str(out), "--repeat", "1"]) == 0
    assert '"devices": ["cpu:0", "cpu:5"]' in capsys.readouterr().out


def test_every_argument_has_help_text():
    def parsers(parser: argparse.ArgumentParser):
        yield parser.prog, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    missing = [f"{prog} {action.dest}" for prog, parser in parsers(cli.build_parser())
               for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and not action.help]
    assert missing == []
