"""The files of an exported artifact, checked: a damaged or mismatched file is an error naming it.

Guarantee of :func:`verify_files`: with a format-2 manifest, every file the manifest lists is
compared against its SHA-256 (so a truncation or a single flipped bit anywhere is detected before
anything is parsed or loaded), the manifest checks itself the same way, and the parameters are
checked against the graph (every parameter the graph declares present, none unknown, shapes and
dtypes equal). Format-1 manifests (no checksums) get the structural checks only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from .. import _lib  # noqa: F401  (registers tvm_hetero.read_params)

FORMAT = "tvm-hetero-artifact/2"
#: Manifest formats this version reads; 1 has no checksums or parameter table.
KNOWN_FORMATS = ("tvm-hetero-artifact/1", FORMAT)
#: Layout of params.bin (``tvm.runtime.save_param_dict``).
PARAMS_FORMAT = "tvm-param-dict/1"
MANIFEST_DIGEST_KEY = "manifest_sha256"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_digest(manifest: dict) -> str:
    """Checksum of the manifest's content (its own checksum field excluded), key order ignored."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST_KEY}
    return sha256(json.dumps(body, sort_keys=True).encode())


def param_table(params: dict[str, np.ndarray]) -> list[dict]:
    """``[{"name", "shape", "dtype"}]`` in name order, as the manifest records it."""
    return [
        {"name": name, "shape": list(np.shape(value)), "dtype": str(np.asarray(value).dtype)}
        for name, value in sorted(params.items())
    ]


def seal(manifest: dict, out: Path, files: list[str]) -> dict:
    """Add checksums of ``files`` (already written in ``out``) and of the manifest itself."""
    manifest["files"] = {name: sha256((out / name).read_bytes()) for name in files}
    manifest[MANIFEST_DIGEST_KEY] = manifest_digest(manifest)
    return manifest


def read_manifest(path: Path) -> dict:
    """The manifest, its format known and (format 2) its own checksum right."""
    manifest = read_json(path)
    if not isinstance(manifest, dict):  # damaged content, not a caller's wrong type
        raise ValueError(  # noqa: TRY004
            f"{path}: not a manifest (a JSON object was expected)"
        )
    fmt = manifest.get("format")
    if fmt not in KNOWN_FORMATS:
        raise ValueError(
            f"{path}: unknown artifact format {fmt!r}; this tvm-hetero reads {', '.join(KNOWN_FORMATS)}"
        )
    if fmt != KNOWN_FORMATS[0] and manifest.get(MANIFEST_DIGEST_KEY) != manifest_digest(manifest):
        raise ValueError(f"{path}: checksum mismatch: the manifest is damaged or was edited after export")
    return manifest


def verify_files(src: Path, manifest: dict) -> None:
    """Every file the manifest lists matches its checksum (format 2; format 1 has none)."""
    if manifest["format"] == KNOWN_FORMATS[0]:
        return
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ValueError(  # noqa: TRY004
            f"{src / 'manifest.json'}: 'files' must map file names to SHA-256 checksums"
        )
    for name, digest in files.items():
        path = src / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: listed in the manifest but missing")
        if sha256(path.read_bytes()) != digest:
            raise ValueError(f"{path}: checksum mismatch: the file is damaged or was changed after export")


def read_text(path: Path) -> str:
    """A UTF-8 text file; binary garbage is an error naming the file."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}): the file is damaged") from None


def read_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def read_params(data: bytes, what: str) -> dict[str, np.ndarray]:
    """A params.bin blob, every size checked against the bytes present (errors name ``what``)."""
    tensors = tvm_ffi.get_global_func("tvm_hetero.read_params")(bytes(data), what)
    return {str(k): v.numpy() for k, v in tensors.items()}


def graph_inputs(graph: dict, where: str) -> dict[str, tuple[list[int], str]]:
    """``{input name: (shape, dtype)}`` of a graph JSON document."""
    try:
        nodes, row_ptr = graph["nodes"], graph["node_row_ptr"]
        shapes, dtypes = graph["attrs"]["shape"][1], graph["attrs"]["dltype"][1]
        return {
            nodes[nid]["name"]: (list(shapes[row_ptr[nid]]), dtypes[row_ptr[nid]])
            for nid in graph["arg_nodes"]
        }
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(f"{where}: not a tvm-hetero graph ({type(err).__name__}: {err})") from None


def check_params(
    params: dict[str, np.ndarray], graph: dict, input_names: list[str], manifest: dict, where: str
) -> None:
    """Every parameter the graph declares (its inputs that are not data inputs) is present with the
    graph's shape and dtype, none is unknown, and (format 2) the manifest's table agrees."""
    inputs = graph_inputs(graph, where)
    declared = [name for name in inputs if name not in input_names]
    missing = [name for name in declared if name not in params]
    unknown = [name for name in params if name not in declared]
    if missing or unknown:
        raise ValueError(
            f"{where}: parameters missing {missing}, unknown {unknown} (the graph declares {declared})"
        )
    for name, value in params.items():
        shape, dtype = inputs[name]
        if list(value.shape) != shape or str(value.dtype) != dtype:
            raise ValueError(
                f"{where}: parameter {name!r} is {list(value.shape)} {value.dtype}; the graph needs {shape} {dtype}"
            )
    if "params" in manifest and manifest["params"] != param_table(params):
        raise ValueError(
            f"{where}: the parameters differ from the manifest's table (names, shapes or dtypes)"
        )


def library_file_for(src: Path, manifest: dict, device: tvm.runtime.Device) -> Path:
    """The exported kernel library a remote ``device`` loads: one library serves every device."""
    return src / "lib.so"
