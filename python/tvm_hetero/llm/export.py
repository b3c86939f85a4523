"""Saving and loading a language model: one directory, every entry graph, one params.bin.

Files: ``graph_<size>.json`` and ``lib_<size>.so`` per entry graph, ``params.bin`` (the weights,
once; ``tvm.runtime.save_param_dict``), ``tokenizer.json`` when the checkpoint had one, and
``manifest.json`` (format ``tvm-hetero-llm/1``): the decoder configuration, the capacity, each
graph's size, phase and devices, the parameter table, and the SHA-256 of every file and of the
manifest itself, checked before anything is parsed (the artifact helpers of ``artifact.py``).
Graphs built for an accelerator add their packed-output layout, constants and build report, and the
model its whole-path check and decode placement (accelerator_export.py); their kernel libraries
hold the vendor's finalized graphs, so loading finalizes nothing again.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from ..artifact import (
    MANIFEST_DIGEST_KEY,
    graph_inputs,
    manifest_digest,
    read_json,
    read_text,
    seal,
    verify_files,
)
from .accelerator_export import (
    host_copy,
    phase_check_from_manifest,
    phase_check_to_manifest,
    read_graph_extras,
    write_graph_extras,
)
from .config import DecoderConfig
from .entry_graphs import EntryGraph, create_runtimes, release_freed_memory
from .graph_io import data_inputs
from .int8_agreement import Agreement
from .int8_weights import check_weight_format
from .this_cpu import check_runs_here

FORMAT = "tvm-hetero-llm/1"
MANIFEST_FILE, PARAMS_FILE, TOKENIZER_FILE = "manifest.json", "params.bin", "tokenizer.json"


@dataclass
class ExportedModel:
    """What an exported directory holds, its graphs' runtimes created (weights loaded once)."""

    config: DecoderConfig
    capacity: int
    graphs: list[EntryGraph]
    weight_bytes: int
    tokenizer_file: Path | None
    #: "float32" or "int8", and for int8 the agreement measured when it was built (None: not measured).
    weights: str = "float32"
    agreement: Agreement | None = None
    #: The CPU its host kernels were compiled for (this_cpu.py), checked against this one.
    compiled_for: dict | None = None
    #: How many float32 matmul weights are stored in 16-column panels (panel_weights.py).
    weights_in_panels: int = 0
    #: The whole-path check and the decode placement of a model with accelerator graphs (None: not run).
    phase_check: dict | None = None
    decode_choice: dict | None = None


def export(model: Any, out: Path) -> Path:
    """Write ``model`` into the directory ``out`` (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    data_names = {name for name, _, _ in data_inputs(model.config, model.capacity, 1)}
    owner = model.graphs[0].runtime
    names = [n for n in graph_inputs(json.loads(model.graphs[0].graph_json), "graph")
             if n not in data_names and n not in model.graphs[0].constants]
    weights = {name: host_copy(owner.get_input(name)) for name in names}
    (out / PARAMS_FILE).write_bytes(bytes(tvm.runtime.save_param_dict(weights)))
    files = [PARAMS_FILE]
    entries = []
    for graph in model.graphs:
        graph_file, lib_file = f"graph_{graph.size}.json", f"lib_{graph.size}.so"
        (out / graph_file).write_text(graph.graph_json)
        graph.lib.export_library(str(out / lib_file))
        extras, extra_files = write_graph_extras(graph, model.config, out)
        files += [graph_file, lib_file, *extra_files]
        entries.append({"size": graph.size, "phase": graph.phase, "graph": graph_file, "lib": lib_file,
                        "devices": [[d.dlpack_device_type(), d.index] for d in graph.devices], **extras})
    if model.tokenizer_file is not None:
        shutil.copyfile(model.tokenizer_file, out / TOKENIZER_FILE)
        files.append(TOKENIZER_FILE)
    manifest = {
        "format": FORMAT,
        "config": model.config.to_dict(),
        "capacity": model.capacity,
        "graphs": entries,
        "params": [{"name": name, "shape": [int(d) for d in t.shape], "dtype": str(t.dtype)}
                   for name, t in sorted(weights.items())],
        "weight_bytes": model.weight_bytes,
        "weights": model.weights,
        "weights_in_panels": model.weights_in_panels,
        "int8_agreement": model.agreement.to_dict() if model.agreement is not None else None,
        "compiled_for": model.compiled_for,
        "phase_check": phase_check_to_manifest(model.phase_check),
        "decode_placement": model.decode_choice,
    }
    seal(manifest, out, files)
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    return out


def read_exported(path: str | Path, device_options: dict[str, Any] | None = None) -> ExportedModel:
    """A model written by :func:`export` (``LanguageModel.export``); every file is checked against
    the manifest (checksums, format, each graph's parameters against params.bin) before it is used."""
    src = Path(path)
    manifest_path = src / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{src}: not an exported language model (no {MANIFEST_FILE})")
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{manifest_path}: format {found!r}; this tvm-hetero reads {FORMAT}")
    if manifest.get(MANIFEST_DIGEST_KEY) != manifest_digest(manifest):
        raise ValueError(f"{manifest_path}: checksum mismatch: the manifest is damaged or was edited after export")
    verify_files(src, manifest)
    check_runs_here(manifest.get("compiled_for"), str(src))  # before any library is loaded
    blob = (src / PARAMS_FILE).read_bytes()
    try:
        cfg = DecoderConfig.from_dict(manifest["config"])
        capacity = int(manifest["capacity"])
        entries = list(manifest["graphs"])
        table = {row["name"]: (list(row["shape"]), row["dtype"]) for row in manifest["params"]}
        weight_bytes = int(manifest["weight_bytes"])
        weights = check_weight_format(manifest.get("weights", "float32"))
        in_panels = int(manifest.get("weights_in_panels", 0))
        agreement = manifest.get("int8_agreement")
        agreement = Agreement.from_dict(agreement) if agreement is not None else None
        phase_check = phase_check_from_manifest(manifest.get("phase_check"))
        decode_choice = manifest.get("decode_placement")
        extras = [read_graph_extras(entry, cfg, src) for entry in entries]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{manifest_path}: malformed ({type(err).__name__}: {err})") from None
    data_names = {name for name, _, _ in data_inputs(cfg, capacity, 1)}
    graphs = []
    for entry, extra in zip(entries, extras):
        graph_json = read_text(src / entry["graph"])
        own = extra.get("constants", {})
        declared = {n: v for n, v in graph_inputs(json.loads(graph_json), str(src / entry["graph"])).items()
                    if n not in data_names and n not in own}
        if {n: (list(s), d) for n, (s, d) in declared.items()} != table:
            raise ValueError(f"{src / entry['graph']}: its weights differ from params.bin's")
        devices = [tvm.runtime.device(int(t), int(i)) for t, i in entry["devices"]]
        graphs.append(EntryGraph(int(entry["size"]), str(entry["phase"]), graph_json,
                                 tvm.runtime.load_module(str(src / entry["lib"])), devices, **extra))
    create_runtimes(graphs, blob, str(src / PARAMS_FILE), device_options)
    del blob
    # params.bin against the table, as the first runtime loaded it (decoding it here would make a
    # transient copy of every weight, whose memory the allocator keeps)
    owner = graphs[0].runtime
    loaded = {name: owner.get_input(name) for name in owner.param_names if name not in graphs[0].constants}
    if {name: (list(t.shape), str(t.dtype)) for name, t in loaded.items()} != table:
        raise ValueError(f"{src / PARAMS_FILE}: the weights differ from the manifest's table")
    release_freed_memory()
    tokenizer = src / TOKENIZER_FILE
    return ExportedModel(cfg, capacity, graphs, weight_bytes, tokenizer if tokenizer.is_file() else None, weights,
                         agreement, manifest.get("compiled_for"), in_panels, phase_check, decode_choice)

