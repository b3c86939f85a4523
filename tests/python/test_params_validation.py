"""Parameters are checked when bound, and an exported artifact is checked when loaded.

A damaged file (truncated, a flipped bit, a parameter missing, garbage) is an error naming the file
and, where it applies, the parameter; it is never accepted with uninitialised or wrong values.
"""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
import tvm
import tvm_hetero
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm_hetero.artifact import manifest_digest, read_params
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()
TWO_CPUS = [("cpu:0", "llvm"), ("cpu:1", "llvm")]
X = np.ones((4, 16), "float32")
FILES = ("graph.json", "lib.so", "params.bin", "manifest.json")


def reference(params: dict, x: np.ndarray = X) -> np.ndarray:
    return np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An MLP artifact over cpu:0 + cpu:1, exported once; tests copy it before damaging it."""
    art = tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 1}, params=PARAMS)
    return art.export(tmp_path_factory.mktemp("artifact") / "a")


@pytest.fixture
def artifact_dir(exported, tmp_path):
    out = tmp_path / "a"
    shutil.copytree(exported, out)
    return out


def reseal(path, params_bytes: bytes) -> None:
    """Write ``params_bytes`` as params.bin *and* update the manifest's checksums, as a tool that
    rewrote the file on purpose would: the structural checks alone must then catch the damage."""
    (path / "params.bin").write_bytes(params_bytes)
    manifest = json.loads((path / "manifest.json").read_text())
    import hashlib

    manifest["files"]["params.bin"] = hashlib.sha256(params_bytes).hexdigest()
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_exported_artifact_loads_and_records_its_parameters(artifact_dir):
    manifest = json.loads((artifact_dir / "manifest.json").read_text())
    assert manifest["format"] == "tvm-hetero-artifact/2"
    assert {p["name"]: (p["shape"], p["dtype"]) for p in manifest["params"]} == {
        "w1": ([16, 32], "float32"), "b1": ([32], "float32"), "w2": ([32, 8], "float32")
    }
    assert set(manifest["files"]) == {"graph.json", "lib.so", "params.bin"}
    rt = tvm_hetero.load(artifact_dir).create()
    rt.run(x=X)
    np.testing.assert_allclose(rt.get_output(0).numpy(), reference(PARAMS), rtol=1e-5, atol=1e-5)


def test_params_file_missing_its_last_bytes_is_rejected_by_checksum(artifact_dir):
    data = (artifact_dir / "params.bin").read_bytes()
    (artifact_dir / "params.bin").write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"params\.bin: checksum mismatch"):
        tvm_hetero.load(artifact_dir)


def test_params_file_missing_its_last_bytes_is_rejected_by_structure(artifact_dir):
    data = (artifact_dir / "params.bin").read_bytes()
    reseal(artifact_dir, data[:-100])
    with pytest.raises(ValueError, match=r"params\.bin: truncated or corrupt: parameter 'w2' data needs"):
        tvm_hetero.load(artifact_dir)


def test_half_a_params_file_names_the_file(artifact_dir):
    data = (artifact_dir / "params.bin").read_bytes()
    reseal(artifact_dir, data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"params\.bin: truncated or corrupt: parameter '\w+'"):
        tvm_hetero.load(artifact_dir)


def test_params_file_without_a_parameter_is_rejected(artifact_dir):
    partial = {k: v for k, v in PARAMS.items() if k != "w2"}
    reseal(artifact_dir, bytes(tvm.runtime.save_param_dict(partial)))
    with pytest.raises(ValueError, match=r"parameters missing \['w2'\]"):
        tvm_hetero.load(artifact_dir)


def test_params_file_with_an_unknown_parameter_is_rejected(artifact_dir):
    reseal(artifact_dir, bytes(tvm.runtime.save_param_dict({**PARAMS, "w9": np.ones(3, "float32")})))
    with pytest.raises(ValueError, match=r"unknown \['w9'\]"):
        tvm_hetero.load(artifact_dir)


def test_load_params_with_truncated_bytes_writes_nothing(artifact_dir):
    rt = tvm_hetero.load(artifact_dir).create()
    valid = bytes(tvm.runtime.save_param_dict({k: v * 2 for k, v in PARAMS.items()}))
    with pytest.raises(ValueError, match=r"load_params: truncated or corrupt: parameter 'w2'"):
        rt.load_params(valid[:-700])
    rt.run(x=X)  # the old parameters, intact
    np.testing.assert_allclose(rt.get_output(0).numpy(), reference(PARAMS), rtol=1e-5, atol=1e-5)


def test_load_params_checks_shapes_and_names_against_the_graph(artifact_dir):
    rt = tvm_hetero.load(artifact_dir).create()
    wrong_shape = {**PARAMS, "b1": np.ones(31, "float32")}
    with pytest.raises(ValueError, match=r"parameter 'b1': expected shape \(32,\), got \(31,\)"):
        rt.load_params(tvm.runtime.save_param_dict(wrong_shape), what="new.bin")
    with pytest.raises(KeyError, match=r"new\.bin: parameter 'zz' is not an input"):
        rt.load_params(tvm.runtime.save_param_dict({"zz": np.ones(3, "float32")}), what="new.bin")


def huge_header_blob() -> bytes:
    """A params blob whose one tensor claims 2**40 float32 elements but carries 16 bytes."""
    name = b"w1"
    out = struct.pack("<QQQ", 0xF7E58D4F05049CB7, 0, 1) + struct.pack("<Q", len(name)) + name
    out += struct.pack("<Q", 1) + struct.pack("<QQiiiBBH", 0xDD5E40F096B4A13F, 0, 1, 0, 1, 2, 32, 1)
    out += struct.pack("<qq", 2**40, 2**42) + b"\0" * 16
    return out


def test_a_header_claiming_a_huge_tensor_is_an_error_not_an_allocation(artifact_dir):
    with pytest.raises(ValueError, match=r"huge\.bin: truncated or corrupt: parameter 'w1' data needs 4398046511104"):
        read_params(huge_header_blob(), "huge.bin")
    rt = tvm_hetero.load(artifact_dir).create()
    with pytest.raises(ValueError, match=r"parameter 'w1' data needs 4398046511104 bytes"):
        rt.load_params(huge_header_blob())
    overflowing = huge_header_blob().replace(struct.pack("<qq", 2**40, 2**42), struct.pack("<qq", 2**62, 2**42))
    with pytest.raises(ValueError, match=r"corrupt: shape \(4611686018427387904\) of float32 does not match"):
        read_params(overflowing, "huge.bin")


def test_unknown_manifest_format_is_rejected(artifact_dir):
    manifest = json.loads((artifact_dir / "manifest.json").read_text())
    manifest["format"] = "tvm-hetero-artifact/99"
    (artifact_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"manifest\.json: unknown artifact format 'tvm-hetero-artifact/99'"):
        tvm_hetero.load(artifact_dir)


def test_binary_garbage_in_graph_json_names_the_file(artifact_dir):
    (artifact_dir / "graph.json").write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(ValueError, match=r"graph\.json: checksum mismatch"):
        tvm_hetero.load(artifact_dir)
    manifest = json.loads((artifact_dir / "manifest.json").read_text())
    manifest["format"] = "tvm-hetero-artifact/1"  # no checksums: the reader itself must say it
    (artifact_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"graph\.json: not UTF-8 text"):
        tvm_hetero.load(artifact_dir)


def test_a_flipped_bit_in_params_is_rejected(artifact_dir):
    data = bytearray((artifact_dir / "params.bin").read_bytes())
    data[-5] ^= 0x10  # inside w2's values: structurally still a valid file
    (artifact_dir / "params.bin").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"params\.bin: checksum mismatch"):
        tvm_hetero.load(artifact_dir)


# ---- fuzzing: truncations and bit flips of a real artifact's files ---------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def damage(data: bytes, kind: str, position: float, bit: int) -> bytes:
    index = min(int(position * len(data)), len(data) - 1)
    if kind == "truncate":
        return data[:index]
    flipped = bytearray(data)
    flipped[index] ^= 1 << bit
    return bytes(flipped)


@FUZZ
@given(
    name=st.sampled_from(FILES),
    kind=st.sampled_from(["truncate", "flip"]),
    position=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 7),
)
def test_fuzz_artifact_loader_rejects_every_damaged_file(exported, tmp_path_factory, name, kind, position, bit):
    out = tmp_path_factory.mktemp("fuzz") / "a"
    shutil.copytree(exported, out)
    original = (out / name).read_bytes()
    (out / name).write_bytes(damage(original, kind, position, bit))
    try:
        tvm_hetero.load(out)
    except (ValueError, FileNotFoundError):
        return  # a clear error
    # Accepted: only a change that leaves the manifest's meaning intact (e.g. 'e' -> 'E' in a float).
    assert name == "manifest.json", f"damaged {name} ({kind} at {position:.3f}, bit {bit}) was accepted"
    assert json.loads((out / name).read_text()) == json.loads(original)


@FUZZ
@given(kind=st.sampled_from(["truncate", "flip"]), position=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_fuzz_parameter_reader_never_accepts_a_different_structure(exported, kind, position, bit):
    original = (exported / "params.bin").read_bytes()
    damaged = damage(original, kind, position, bit)
    try:
        params = read_params(damaged, "params.bin")
    except ValueError as err:
        assert "params.bin" in str(err)
        return
    # Accepted (a flip inside the values, or a name byte): same structure, every byte accounted for.
    assert kind == "flip"
    assert len(params) == len(PARAMS)
    assert sum(v.nbytes for v in params.values()) == sum(v.nbytes for v in PARAMS.values())
