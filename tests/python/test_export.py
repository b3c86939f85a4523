"""Artifact.export: a loaded artifact exports again, and an export that fails leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero import artifact as artifact_module
from tvm_hetero import toolchain
from tvm_hetero.testing import models

X_CNN = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype("float32")
X_MLP = np.random.default_rng(4).standard_normal((4, 16)).astype("float32")


@pytest.fixture(scope="module")
def cnn_with_onednn() -> tvm_hetero.Artifact:
    """A small CNN whose convolutions are oneDNN regions: its library imports a region module."""
    mod, params = models.small_cnn()
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], params=params, backends=["dnnl"])
    assert "tvm_hetero_dnnl" in [m.kind for m in art.lib.imports]
    return art


@pytest.fixture(scope="module")
def mlp_on_two_cpus() -> tvm_hetero.Artifact:
    """A plain TVM-kernel library (no imports), split over two CPUs."""
    mod, params = models.mlp()
    return tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], placement={"matmul": 1},
                            params=params)


def output(art: tvm_hetero.Artifact, **inputs: np.ndarray) -> np.ndarray:
    with art.create() as runtime:
        runtime.run(**inputs)
        return runtime.get_output(0).numpy()


def manifest(folder) -> dict:
    return json.loads((folder / "manifest.json").read_text())


@pytest.mark.parametrize(("fixture", "inputs"), [("cnn_with_onednn", {"x": X_CNN}), ("mlp_on_two_cpus", {"x": X_MLP})])
def test_a_loaded_artifact_exports_again_with_the_same_library_and_outputs(
    request: pytest.FixtureRequest, tmp_path, fixture: str, inputs: dict
) -> None:
    built = request.getfixturevalue(fixture)
    expected = output(built, **inputs)
    built.export(tmp_path / "first")
    loaded = tvm_hetero.load(tmp_path / "first")
    loaded.export(tmp_path / "second")
    assert (tmp_path / "second" / "lib.so").read_bytes() == (tmp_path / "first" / "lib.so").read_bytes()
    assert manifest(tmp_path / "second")["files"] == manifest(tmp_path / "first")["files"]
    again = tvm_hetero.load(tmp_path / "second")
    np.testing.assert_array_equal(output(again, **inputs), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "second"]  # no staging folder left


def test_re_export_refuses_a_library_file_changed_since_it_was_loaded(mlp_on_two_cpus, tmp_path) -> None:
    mlp_on_two_cpus.export(tmp_path / "first")
    loaded = tvm_hetero.load(tmp_path / "first")
    with (tmp_path / "first" / "lib.so").open("ab") as lib:
        lib.write(b"\0")
    with pytest.raises(ValueError, match=r"first/lib.so: changed since this artifact was loaded"):
        loaded.export(tmp_path / "second")
    assert not (tmp_path / "second").exists()


def failing_link(self, output, objects, options=None) -> None:
    """A linker that writes half a library, then fails."""
    Path(output).write_bytes(b"half a library")
    raise RuntimeError(f"linking {output} failed: ld: cannot find -lsomething")


def test_a_failed_export_leaves_no_directory_and_no_partial_file(mlp_on_two_cpus, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(toolchain.Linker, "link_shared", failing_link)
    target = tmp_path / "new" / "parents" / "out"
    with pytest.raises(RuntimeError, match="cannot find -lsomething"):
        mlp_on_two_cpus.export(target)
    assert list(tmp_path.iterdir()) == []  # neither out, nor the parents it made, nor a staging folder


def test_a_failed_export_into_an_existing_artifact_leaves_it_as_it_was(
    mlp_on_two_cpus, cnn_with_onednn, tmp_path, monkeypatch
) -> None:
    mlp_on_two_cpus.export(tmp_path / "out")
    (tmp_path / "out" / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    monkeypatch.setattr(toolchain.Linker, "link_shared", failing_link)
    with pytest.raises(RuntimeError, match="cannot find -lsomething"):
        cnn_with_onednn.export(tmp_path / "out")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    np.testing.assert_array_equal(output(tvm_hetero.load(tmp_path / "out"), x=X_MLP), output(mlp_on_two_cpus, x=X_MLP))


def test_export_into_an_existing_directory_replaces_the_artifact_and_keeps_other_files(
    mlp_on_two_cpus, cnn_with_onednn, tmp_path
) -> None:
    mlp_on_two_cpus.export(tmp_path / "out")
    (tmp_path / "out" / "notes.txt").write_text("mine")
    cnn_with_onednn.export(tmp_path / "out")
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    np.testing.assert_array_equal(output(tvm_hetero.load(tmp_path / "out"), x=X_CNN), output(cnn_with_onednn, x=X_CNN))
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_export_onto_a_file_is_an_error_naming_it(mlp_on_two_cpus, tmp_path) -> None:
    (tmp_path / "taken").write_text("x")
    with pytest.raises(NotADirectoryError, match="taken: exists and is not a directory"):
        mlp_on_two_cpus.export(tmp_path / "taken")


def test_a_library_loaded_outside_an_artifact_is_refused_by_name(mlp_on_two_cpus, tmp_path) -> None:
    mlp_on_two_cpus.export(tmp_path / "first")
    lib = tvm.runtime.load_module(str(tmp_path / "first" / "lib.so"))
    stray = artifact_module.Artifact(mlp_on_two_cpus.graph_json, lib, mlp_on_two_cpus.params,
                                     mlp_on_two_cpus.devices, mlp_on_two_cpus.input_names)
    with pytest.raises(ValueError, match="loaded from a file, which is not known here"):
        stray.export(tmp_path / "second")
    assert not (tmp_path / "second").exists()
