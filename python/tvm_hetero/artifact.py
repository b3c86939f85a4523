"""Artifacts: compiled graphs and pipelines wrapped to run (``create``), export and load.

One module for both kinds: :class:`Artifact` (a heterogeneous graph, ``tvm_hetero.build``) and
:class:`PipelineArtifact` (``tvm_hetero.pipeline.build``) share the files (``lib.so``,
``params.bin``, a manifest), their writing and their checked reading. The compiler returns plain
data (``CompiledGraph``, ``CompiledPipeline``); this layer adds the runtime.

Files are checked: a damaged or mismatched file is an error naming it.

Guarantee of :func:`verify_files`: with a format-2 manifest, every file the manifest lists is
compared against its SHA-256 (so a truncation or a single flipped bit anywhere is detected before
anything is parsed or loaded), the manifest checks itself the same way, and the parameters are
checked against the graph (every parameter the graph declares present, none unknown, shapes and
dtypes equal). Format-1 manifests (no checksums) get the structural checks only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi

import tvm_hetero.native  # noqa: F401  (registers tvm_hetero.read_params)

from .compiler.build import BuildReport, CompiledGraph, device_name, format_size
from .compiler.kernel_libraries import export_device_libraries, load_device_libraries
from .compiler.pipeline import CompiledPipeline, target_label
from .devices import parse_device
from .graph import Graph
from .runtime import graph_runtime, pipeline_runtime
from .runtime.graph_runtime import GraphModule
from .runtime.pipeline_runtime import PipelineModule
from .toolchain import linker as shared_library_linker

GRAPH_FILE, LIB_FILE, PARAMS_FILE, MANIFEST_FILE = "graph.json", "lib.so", "params.bin", "manifest.json"
PIPELINE_MANIFEST_FILE, UNSPLIT_GRAPH_FILE = "pipeline.json", "graph.json"
PIPELINE_FORMAT = "tvm-hetero-pipeline/2"
#: Pipeline manifest formats this version reads; 1 has no checksums or parameter table.
PIPELINE_KNOWN_FORMATS = ("tvm-hetero-pipeline/1", PIPELINE_FORMAT)

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
    """``{input name: (shape, dtype)}`` of a graph JSON document (errors name ``where``)."""
    return Graph.from_json(graph, where).inputs()


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
    return src / LIB_FILE


# ---- files both artifact kinds share -----------------------------------------------------------
def _write_lib_and_params(
    out: Path, lib: tvm.runtime.Module, params: Mapping[str, Any], library_file: Path | None = None
) -> None:
    """``lib.so`` and ``params.bin`` (``tvm.runtime.save_param_dict``) into ``out``.

    ``library_file``: the file ``lib`` was loaded from, copied as it is (a loaded library cannot be
    linked again: its imported modules no longer serialize). Otherwise ``lib`` is linked by the
    linker :mod:`tvm_hetero.toolchain` chooses (a system compiler, else ziglang's).
    """
    if library_file is not None:
        shutil.copyfile(library_file, out / LIB_FILE)
    elif lib.kind == "library":
        raise ValueError("this kernel library was loaded from a file, which is not known here: it cannot be "
                         "linked again; export an artifact loaded with tvm_hetero.load (its lib.so is copied)")
    else:
        lib.export_library(str(out / LIB_FILE), fcompile=shared_library_linker().fcompile())
    tensors = {k: v if isinstance(v, tvm.runtime.Tensor) else tvm.runtime.tensor(v) for k, v in params.items()}
    (out / PARAMS_FILE).write_bytes(bytes(tvm.runtime.save_param_dict(tensors)))


def _device_table(devices: Sequence[tvm.runtime.Device]) -> list[list[int]]:
    return [[d.dlpack_device_type(), d.index] for d in devices]


def _devices_from(table: Any) -> list[tvm.runtime.Device]:
    return [tvm.runtime.device(int(t), int(i)) for t, i in table]


def _write_atomically(out: Path, write: Callable[[Path], list[str]]) -> Path:
    """Run ``write(folder)`` on a fresh folder beside ``out``, then move what it wrote into ``out``.

    ``write`` returns the names it wrote, the manifest last. ``out`` absent: the folder is renamed to
    it (one atomic step). ``out`` a directory: each file replaces its namesake there, the manifest
    last, and nothing else in ``out`` is touched. A failure in ``write`` leaves neither ``out`` nor any
    partial file, nor a parent folder this call made.
    """
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: exists and is not a directory")
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{uuid.uuid4().hex[:12]}.partial"
    staging.mkdir()  # the umask's permissions, as the final folder should have
    try:
        names = write(staging)
        if not out.exists():
            staging.rename(out)
            return out
        for name in names:
            os.replace(staging / name, out / name)
        shutil.rmtree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:  # innermost first; only those still empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return out


def _require_files(src: Path, names: Sequence[str], what: str) -> None:
    missing = [f for f in names if not (src / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{src} is not {what}: missing {', '.join(missing)}")


# ---- a heterogeneous graph ---------------------------------------------------------------------
@dataclass
class Artifact(CompiledGraph):
    """A compiled heterogeneous graph: run it with :meth:`create`, save it with :meth:`export`."""

    #: The directory it was loaded from (None: built in this process).
    source_dir: Path | None = None
    #: The manifest it was loaded with (None: built in this process).
    manifest: dict | None = None

    @classmethod
    def of(cls, compiled: CompiledGraph) -> Artifact:
        """Wrap what the compiler made."""
        return cls(**{f.name: getattr(compiled, f.name) for f in dataclasses.fields(CompiledGraph)})

    def create(
        self,
        devices: Sequence[tvm.runtime.Device] | None = None,
        *,
        device_index_kind: str = "position",
        offload: str = "group",
        remote_timeout: float | None = None,
        remote_library: Any = None,
        execution: str = "concurrent",
        device_options: Sequence[dict | None] | None = None,
    ) -> GraphModule:
        """A runtime with the parameters loaded; ``devices`` defaults to the build's devices.

        The keywords are those of :func:`tvm_hetero.graph_runtime.create`. Remote devices load
        :meth:`library_file_for` (``remote_library`` default) when the artifact was loaded from
        disk, else the library exported on the fly.
        """
        module = graph_runtime.create(
            self.graph_json,
            self.lib,
            list(devices) if devices is not None else self.devices,
            device_index_kind=device_index_kind,
            offload=offload,
            remote_timeout=remote_timeout,
            remote_library=remote_library if remote_library is not None else self.library_file_for,
            execution=execution,
            device_options=device_options,
            device_libs=self.device_libs,
            params=self.params or None,
        )
        return module

    def library_file_for(self, device: tvm.runtime.Device) -> Path | None:
        """The exported kernel library file a remote ``device`` uploads; None: export :attr:`lib`."""
        if self.source_dir is None:
            return None
        return library_file_for(self.source_dir, self.manifest or {}, device)

    def report(self) -> str:
        return str(self.build_report) if self.build_report else "(no build report: artifact was loaded)"

    @property
    def graph(self) -> dict:
        return json.loads(self.graph_json)

    def export(self, path: str | os.PathLike) -> Path:
        """Write graph.json, lib.so, params.bin and manifest.json into the directory ``path``.

        The C++ runtime loads these without Python (see examples/run_artifact.cc). A loaded artifact
        exports again: its library files are copied, checked against the manifest it was loaded
        with. Everything is written beside ``path`` first and moved in at the end, so a failed
        export leaves nothing behind.
        """
        library_file = self._loaded_library_file()
        return _write_atomically(Path(path), functools.partial(self._write_files, library_file=library_file))

    def _loaded_library_file(self) -> Path | None:
        """The lib.so :attr:`lib` was loaded from, unchanged since (None: built in this process)."""
        if self.source_dir is None or self.lib.kind != "library":
            return None
        path = self.source_dir / LIB_FILE
        digest = (self.manifest or {}).get("files", {}).get(LIB_FILE)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the library this artifact was loaded from is gone; it cannot be "
                                    "exported again (load the artifact again from a complete copy)")
        if digest is not None and sha256(path.read_bytes()) != digest:
            raise ValueError(f"{path}: changed since this artifact was loaded (its checksum differs from the "
                             "manifest): load it again before exporting")
        return path

    def _write_files(self, out: Path, library_file: Path | None) -> list[str]:
        """Every file of the artifact into the (empty) folder ``out``; the names, manifest last."""
        (out / GRAPH_FILE).write_text(self.graph_json)
        _write_lib_and_params(out, self.lib, self.params, library_file)
        manifest = {
            "format": FORMAT,
            "devices": _device_table(self.devices),
            "device_names": [device_name(d) for d in self.devices],
            "inputs": self.input_names,
            "params_format": PARAMS_FORMAT,
            "params": param_table(self.params),
            "report": self.build_report.to_dict() if self.build_report else None,
        }
        if self.device_libs:  # lib.so then holds only the host architecture's kernels
            manifest.update(export_device_libraries(self.device_libs, out))
        files = [GRAPH_FILE, LIB_FILE, PARAMS_FILE]
        files += [entry["file"] for entry in manifest.get("device_libraries", [])]
        seal(manifest, out, files)
        (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
        return [*files, MANIFEST_FILE]


def load(path: str | os.PathLike) -> Artifact:
    """Load an artifact written by :meth:`Artifact.export`, checking every file first.

    A damaged, truncated or mismatched file (checksums, manifest format, parameters against the
    graph) is a ValueError naming it; nothing is loaded from it.
    """
    src = Path(path)
    _require_files(src, (GRAPH_FILE, LIB_FILE, PARAMS_FILE, MANIFEST_FILE), "a tvm-hetero artifact")
    manifest = read_manifest(src / MANIFEST_FILE)
    verify_files(src, manifest)
    graph_json = read_text(src / GRAPH_FILE)
    graph = read_json(src / GRAPH_FILE)
    params = read_params((src / PARAMS_FILE).read_bytes(), str(src / PARAMS_FILE))
    try:
        input_names = list(manifest.get("inputs", []))
        devices = _devices_from(manifest["devices"])
        report = BuildReport(**manifest["report"]) if manifest.get("report") else None
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{src / MANIFEST_FILE}: malformed ({type(err).__name__}: {err})") from None
    check_params(params, graph, input_names, manifest, str(src / PARAMS_FILE))
    return Artifact(
        graph_json=graph_json,
        lib=tvm.runtime.load_module(str(src / LIB_FILE)),
        params=params,
        devices=devices,
        input_names=input_names,
        build_report=report,
        source_dir=src,
        manifest=manifest,
        device_libs=load_device_libraries(manifest, src),
    )


# ---- a pipeline --------------------------------------------------------------------------------
@dataclass
class PipelineArtifact(CompiledPipeline):
    """A compiled pipeline: run it with :meth:`create`, save it with :meth:`export`."""

    @classmethod
    def of(cls, compiled: CompiledPipeline) -> PipelineArtifact:
        """Wrap what the compiler made."""
        return cls(**{f.name: getattr(compiled, f.name) for f in dataclasses.fields(CompiledPipeline)})

    @property
    def num_stages(self) -> int:
        return len(self.stage_graph_jsons)

    def create(
        self,
        stage_devices: Sequence[Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> PipelineModule:
        """A running :class:`~tvm_hetero.runtime.pipeline_runtime.PipelineModule` with the params set.

        ``stage_devices`` defaults to the build's; ``options`` (``{"queue_capacity": C, "stages":
        [{"cores": [0], "num_threads": 1}, ...]}``) to the build's options.
        """
        devices = (
            [parse_device(d) for d in stage_devices] if stage_devices is not None else self.stage_devices
        )
        if len(devices) != self.num_stages:
            raise ValueError(f"{len(devices)} stage devices for {self.num_stages} stages")
        pipe = pipeline_runtime.create(
            self.stage_graph_jsons,
            self.lib,
            devices,
            self.wiring,
            self.options if options is None else options,
        )
        try:
            for s, stage in enumerate(self.wiring["stages"]):
                if stage["params"]:
                    pipe.set_params(s, {name: self.params[name] for name in stage["params"]})
        except Exception:
            pipe.close()
            raise
        return pipe

    def unsplit(self, device: Any = None) -> Artifact:
        """The unsplit graph with the same kernels, as an :class:`Artifact` (one device)."""
        if self.unsplit_graph_json is None:
            raise ValueError("stages have different targets: no single graph runs every kernel")
        dev = parse_device(device) if device is not None else self.stage_devices[0]
        return Artifact(self.unsplit_graph_json, self.lib, self.params, [dev], list(self.input_names))

    def report(self) -> str:
        """One line per stage: device, target, kernel range, bytes received, modelled cost."""
        info = self.split or {}
        costs = info.get("stage_costs_us")
        lines = [
            f"tvm-hetero pipeline: {self.num_stages} stages, split at kernels {info.get('split_points')}"
        ]
        for s, stage in enumerate(self.wiring["stages"]):
            a, b = info["stage_kernels"][s] if info else (0, 0)
            received = info["boundary_bytes"][s] if info else 0
            cost = f", modelled {costs[s] / 1e3:.2f} ms" if costs else ""
            lines.append(
                f"  stage {s} {stage['name']:<8} {device_name(self.stage_devices[s]):<8} "
                f"{target_label(self.stage_targets[s]):<8} kernels {a}..{b - 1}, receives {format_size(received)}, "
                f"params {len(stage['params'])}{cost}"
            )
        if costs:
            lines.append(f"  ideal speedup (sum / max of stage costs): {sum(costs) / max(costs):.2f}x")
        return "\n".join(lines)

    def export(self, path: str | os.PathLike) -> Path:
        """Write stage graphs, lib.so, params.bin, the unsplit graph and pipeline.json into ``path``."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        stage_files = [f"stage{s}.json" for s in range(self.num_stages)]
        for name, graph_json in zip(stage_files, self.stage_graph_jsons):
            (out / name).write_text(graph_json)
        if self.unsplit_graph_json is not None:
            (out / UNSPLIT_GRAPH_FILE).write_text(self.unsplit_graph_json)
        _write_lib_and_params(out, self.lib, self.params)
        manifest = {
            "format": PIPELINE_FORMAT,
            "params_format": PARAMS_FORMAT,
            "params": param_table(self.params),
            "stage_graphs": stage_files,
            "stage_devices": _device_table(self.stage_devices),
            "stage_device_names": [device_name(d) for d in self.stage_devices],
            "stage_targets": self.stage_targets,
            "inputs": self.input_names,
            "wiring": self.wiring,
            "options": self.options,
            "unsplit_graph": UNSPLIT_GRAPH_FILE if self.unsplit_graph_json is not None else None,
            "split": self.split,
        }
        seal(manifest, out, [*stage_files, LIB_FILE, PARAMS_FILE]
             + ([UNSPLIT_GRAPH_FILE] if self.unsplit_graph_json is not None else []))
        (out / PIPELINE_MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
        return out


def is_pipeline_dir(path: str | os.PathLike) -> bool:
    """``path`` holds an exported pipeline (its ``pipeline.json``) rather than a single graph."""
    return (Path(path) / PIPELINE_MANIFEST_FILE).is_file()


def read_pipeline_manifest(path: Path) -> dict:
    """``pipeline.json``, its format known and (format 2) its own checksum right."""
    manifest = read_json(path)
    if not isinstance(manifest, dict):  # damaged content, not a caller's wrong type
        raise ValueError(f"{path}: not a pipeline manifest (a JSON object was expected)")  # noqa: TRY004
    fmt = manifest.get("format")
    if fmt not in PIPELINE_KNOWN_FORMATS:
        raise ValueError(f"{path}: unknown pipeline format {fmt!r}; this tvm-hetero reads "
                         f"{', '.join(PIPELINE_KNOWN_FORMATS)}")
    if fmt != PIPELINE_KNOWN_FORMATS[0]:
        if manifest.get(MANIFEST_DIGEST_KEY) != manifest_digest(manifest):
            raise ValueError(f"{path}: checksum mismatch: the manifest is damaged or was edited after export")
        if not isinstance(manifest.get("files"), dict):
            raise ValueError(f"{path}: 'files' must map file names to SHA-256 checksums")
    return manifest


def check_pipeline_params(params: dict[str, np.ndarray], stage_graphs: Sequence[dict], wiring: dict,
                          manifest: dict, where: str) -> None:
    """Every parameter a stage's wiring declares is present with the stage graph's shape and dtype,
    and (format 2) the parameters equal the manifest's table."""
    for s, (graph, stage) in enumerate(zip(stage_graphs, wiring["stages"])):
        inputs = graph_inputs(graph, f"{where}: stage {s}")
        for name in stage["params"]:
            if name not in params:
                raise ValueError(f"{where}: stage {s} ({stage.get('name')!r}) needs parameter {name!r}, "
                                 "which params.bin does not hold")
            if name not in inputs:
                raise ValueError(f"{where}: stage {s} declares parameter {name!r}, which its graph does not read")
            shape, dtype = inputs[name]
            value = params[name]
            if list(value.shape) != shape or str(value.dtype) != dtype:
                raise ValueError(f"{where}: parameter {name!r} is {list(value.shape)} {value.dtype}; "
                                 f"stage {s}'s graph needs {shape} {dtype}")
    if "params" in manifest and manifest["params"] != param_table(params):
        raise ValueError(f"{where}: the parameters differ from the manifest's table (names, shapes or dtypes)")


def load_pipeline(path: str | os.PathLike) -> PipelineArtifact:
    """Load a pipeline written by :meth:`PipelineArtifact.export`, checking every file first.

    As :func:`load`: every file is compared with its checksum in ``pipeline.json`` (which checks
    itself) before anything is parsed or loaded, and the parameters are checked against each stage
    graph; a damaged, truncated or mismatched file is a ValueError naming it.
    """
    src = Path(path)
    _require_files(src, (PIPELINE_MANIFEST_FILE,), "a tvm-hetero pipeline")
    manifest = read_pipeline_manifest(src / PIPELINE_MANIFEST_FILE)
    try:
        unsplit = manifest["unsplit_graph"]
        needed = [*manifest["stage_graphs"], LIB_FILE, PARAMS_FILE] + ([unsplit] if unsplit else [])
    except (KeyError, TypeError) as err:
        raise ValueError(f"{src / PIPELINE_MANIFEST_FILE}: malformed ({type(err).__name__}: {err})") from None
    _require_files(src, needed, "a complete tvm-hetero pipeline")
    if manifest["format"] != PIPELINE_KNOWN_FORMATS[0]:
        unlisted = [name for name in needed if name not in manifest["files"]]
        if unlisted:
            raise ValueError(f"{src / PIPELINE_MANIFEST_FILE}: no checksum for {', '.join(unlisted)}")
        verify_files(src, manifest)
    stage_jsons = [read_text(src / f) for f in manifest["stage_graphs"]]
    stage_graphs = [read_json(src / f) for f in manifest["stage_graphs"]]
    params = read_params((src / PARAMS_FILE).read_bytes(), str(src / PARAMS_FILE))
    try:
        wiring = manifest["wiring"]
        stage_devices = _devices_from(manifest["stage_devices"])
        stage_targets = list(manifest["stage_targets"])
        input_names = list(manifest["inputs"])
        if len(wiring["stages"]) != len(stage_graphs) or len(stage_devices) != len(stage_graphs):
            raise ValueError(f"{src / PIPELINE_MANIFEST_FILE}: {len(stage_graphs)} stage graphs, "
                             f"{len(wiring['stages'])} wired stages, "
                             f"{len(stage_devices)} stage devices")
        check_pipeline_params(params, stage_graphs, wiring, manifest, str(src / PARAMS_FILE))
    except (KeyError, TypeError) as err:
        raise ValueError(f"{src / PIPELINE_MANIFEST_FILE}: malformed ({type(err).__name__}: {err})") from None
    return PipelineArtifact(
        stage_graph_jsons=stage_jsons,
        lib=tvm.runtime.load_module(str(src / LIB_FILE)),
        params=params,
        wiring=wiring,
        stage_devices=stage_devices,
        stage_targets=stage_targets,
        input_names=input_names,
        options=manifest.get("options") or {},
        unsplit_graph_json=read_text(src / unsplit) if unsplit else None,
        split=manifest.get("split"),
    )
