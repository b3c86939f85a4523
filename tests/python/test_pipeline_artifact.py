"""Exported pipelines are checked like single-graph artifacts: pipeline.json holds the SHA-256 of
every file and of itself, and ``pipeline.load`` verifies them (and the parameters against each stage
graph) before anything is parsed or loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm_hetero import artifact, pipeline
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()
X = np.random.default_rng(3).standard_normal((4, 16)).astype("float32")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    art = pipeline.build(MLP, "llvm", [1], params=PARAMS, backends=())
    return art.export(tmp_path_factory.mktemp("pipe") / "p")


def copy_of(exported: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(exported, out)
    return out


def flip_one_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def test_the_manifest_lists_a_checksum_for_every_file(exported):
    manifest = json.loads((exported / "pipeline.json").read_text())
    assert manifest["format"] == "tvm-hetero-pipeline/2"
    files = sorted(p.name for p in exported.iterdir() if p.name != "pipeline.json")
    assert sorted(manifest["files"]) == files == ["graph.json", "lib.so", "params.bin", "stage0.json", "stage1.json"]
    assert manifest["params"] == artifact.param_table(PARAMS)
    with pipeline.load(exported).create() as pipe:
        pipe.run({"x": X})
        want = np.maximum(X @ PARAMS["w1"] + PARAMS["b1"], 0) @ PARAMS["w2"]
        np.testing.assert_allclose(pipe.get_output()[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["params.bin", "lib.so", "stage0.json", "stage1.json", "graph.json"])
def test_a_flipped_bit_in_any_file_is_refused_naming_it(exported, tmp_path, name):
    damaged = copy_of(exported, tmp_path)
    flip_one_bit(damaged / name)
    with pytest.raises(ValueError, match=rf"{name}: checksum mismatch"):
        pipeline.load(damaged)


def test_a_truncated_params_file_is_refused(exported, tmp_path):
    damaged = copy_of(exported, tmp_path)
    (damaged / "params.bin").write_bytes((damaged / "params.bin").read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"params.bin: checksum mismatch"):
        pipeline.load(damaged)


def test_an_edited_manifest_is_refused(exported, tmp_path):
    edited = copy_of(exported, tmp_path)
    manifest = json.loads((edited / "pipeline.json").read_text())
    manifest["wiring"]["stages"][1]["params"] = []
    (edited / "pipeline.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"pipeline.json: checksum mismatch: the manifest"):
        pipeline.load(edited)


def test_an_unknown_format_is_refused(exported, tmp_path):
    edited = copy_of(exported, tmp_path)
    manifest = json.loads((edited / "pipeline.json").read_text())
    manifest["format"] = "tvm-hetero-pipeline/9"
    (edited / "pipeline.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"unknown pipeline format 'tvm-hetero-pipeline/9'"):
        pipeline.load(edited)


def test_a_params_file_without_a_stage_parameter_is_refused_naming_the_stage(exported, tmp_path):
    # Re-sealed, so every checksum is right: the parameter check itself must catch it.
    edited = copy_of(exported, tmp_path)
    fewer = {k: tvm.runtime.tensor(v) for k, v in PARAMS.items() if k != "w2"}
    (edited / "params.bin").write_bytes(bytes(tvm.runtime.save_param_dict(fewer)))
    manifest = json.loads((edited / "pipeline.json").read_text())
    for key in ("files", artifact.MANIFEST_DIGEST_KEY):
        manifest.pop(key)
    artifact.seal(manifest, edited, list(json.loads((exported / "pipeline.json").read_text())["files"]))
    (edited / "pipeline.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"params.bin: stage 1 \('stage1'\) needs parameter 'w2'"):
        pipeline.load(edited)
