"""Weights once per HTP: a model's HTP graphs (prefill buckets, decode) in one QNN context whose
weights the graphs share, against one context per graph -- and whether this target can load it.

ONNX Runtime's QNN EP compiles every session created with ``ep.share_ep_contexts=1`` into one QNN
context; the session that also sets ``ep.stop_share_ep_contexts=1`` (the last) writes it as one
``.bin`` beside each graph's EP-context model. A weight tensor the graphs hold alike is stored once.
The bytes compared are the QNN context binaries (``ep.context_embed_mode=0``): the sum of one per
graph against the one shared.

Whether a target loads a shared context is asked, never assumed: a child process opens every graph's
EP-context model with sharing on, as ONNX Runtime GenAI does (a crash there is an answer, not a dead
build). Where it cannot (the x86 emulator refuses such a context, or dies opening it), the graphs run
from one context each, and :func:`weights_once` says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import last_line
from .ep import _session_options, captured_stderr, portable_context, require


def _compile(models: dict[str, bytes], options: dict, folder: Path, share: bool) -> list[Path]:
    """Each model compiled into an EP-context model in ``folder`` (one shared context, or one each);
    the EP-context models' paths, in order."""
    ort, _qnn = require()
    paths = []
    names = list(models)
    for index, name in enumerate(names):
        path = folder / f"{index}_ctx.onnx"
        extra = {"ep.context_enable": "1", "ep.context_embed_mode": "0", "ep.context_file_path": str(path)}
        if share:
            extra["ep.share_ep_contexts"] = "1"
            if index == len(names) - 1:
                extra["ep.stop_share_ep_contexts"] = "1"
        with captured_stderr():
            session = ort.InferenceSession(_named(models[name], f"graph{index}"), _session_options(options, extra))
        paths.append(path)
        if not share:
            del session
    for path in paths:  # opened under any registration of the EP (ep.portable_context)
        path.write_bytes(portable_context(path.read_bytes()))
    return paths


def _named(model: bytes, name: str) -> bytes:
    """``model`` ready for one context beside the others: each initializer named by its content, every
    other value and node under the graph's own name. QNN shares a weight between graphs by its name,
    so the same tensor must have one name in every graph and two different tensors (a bucket's own
    shape constants) never one; a graph input or intermediate value of the same name in two graphs
    is an error composing the second."""
    import hashlib

    import onnx

    proto = onnx.load_from_string(model)
    proto.graph.name = name
    renamed = {}
    for init in proto.graph.initializer:
        digest = hashlib.sha256(init.raw_data or init.SerializeToString())
        digest.update(repr((init.data_type, list(init.dims))).encode())
        renamed[init.name] = f"w{digest.hexdigest()[:24]}"
        init.name = renamed[init.name]
    # every other value (graph inputs and outputs too) under the graph's name: a context holds one
    # tensor of each name
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        if value.name not in renamed:
            renamed[value.name] = f"{name}.{value.name}"
        value.name = renamed[value.name]
    for node in proto.graph.node:
        node.name = f"{name}.{node.name}"
        for index, value in enumerate(node.output):
            if value:
                renamed.setdefault(value, f"{name}.{value}")
                node.output[index] = renamed[value]
    for node in proto.graph.node:
        for index, value in enumerate(node.input):
            if value in renamed:
                node.input[index] = renamed[value]
    return proto.SerializeToString()


def _binary_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.bin"))


def weights_once(models: dict[str, bytes], options: dict, timeout: float = 600.0) -> dict:
    """The bytes of the graphs' QNN contexts, one each and one shared, and whether each form loads
    here (the one-context-per-graph form is the control: the same graphs opened the same way):
    ``{"graphs", "per_graph_bytes", "largest_graph_bytes", "shared_bytes", "shared_over_largest",
    "shared_loads", "why_not", "per_graph_loads", "per_graph_why_not"}``."""
    if not models:
        raise ValueError("weights_once: no HTP graphs to put in one context")
    with tempfile.TemporaryDirectory(prefix="tvm_hetero_qnn_shared_") as tmp:
        per_graph, alone = [], []
        for index, (name, model) in enumerate(models.items()):
            folder = Path(tmp) / f"alone{index}"
            folder.mkdir()
            alone += _compile({name: model}, options, folder, share=False)
            per_graph.append(_binary_bytes(folder))
        shared_folder = Path(tmp) / "shared"
        shared_folder.mkdir()
        paths = _compile(models, options, shared_folder, share=True)
        shared = _binary_bytes(shared_folder)
        alone_loads, alone_why = _loads_in_child(alone, options, timeout, share=False)
        loads, why = _loads_in_child(paths, options, timeout, share=True)
    return {"graphs": len(models), "per_graph_bytes": per_graph, "largest_graph_bytes": max(per_graph),
            "shared_bytes": shared, "shared_over_largest": shared / max(per_graph),
            "shared_loads": loads, "why_not": why, "per_graph_loads": alone_loads, "per_graph_why_not": alone_why}


def _loads_in_child(paths: list[Path], options: dict, timeout: float, share: bool) -> tuple[bool, str]:
    """Whether a fresh process opens every EP-context model (of one shared context, or one context
    each), and else why not."""
    import json

    form = "shared context" if share else "contexts"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, "-m", "tvm_hetero.qnn.shared_context", json.dumps(options),
                               "shared" if share else "alone", *map(str, paths)], check=False, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"opening the {form} timed out after {timeout:.0f} s"
    if proc.returncode == 0:
        return True, ""
    if proc.returncode < 0:
        return False, f"the process opening the {form} died (signal {-proc.returncode})"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return False, lines[-1] if lines else f"exit status {proc.returncode}"


def _open(options: dict, share: bool, paths: list[str]) -> int:
    """The child: open each EP-context model (with sharing on: the last one stops it); on failure,
    print ONNX Runtime's error and QNN's first error line."""
    ort, _qnn = require()
    sessions = []
    for index, path in enumerate(paths):
        extra = {}
        if share:
            extra["ep.share_ep_contexts"] = "1"
            if index == len(paths) - 1:
                extra["ep.stop_share_ep_contexts"] = "1"
        with captured_stderr() as lines:
            try:
                sessions.append(ort.InferenceSession(path, _session_options(options, extra, log_level=2)))
                error = ""
            except Exception as err:  # noqa: BLE001 (ONNX Runtime's own error types)
                error = last_line(err)
        if error:
            qnn = [line.strip() for line in lines if "fail" in line.lower() or "error" in line.lower()]
            print(f"opening graph {index} failed: {error}" + (f" (first error logged: {qnn[0]})" if qnn else ""),
                  flush=True)
            return 1
    while sessions:  # in reverse order, as ONNX Runtime's weight sharing asks
        sessions.pop()
    return 0


if __name__ == "__main__":
    import json

    raise SystemExit(_open(json.loads(sys.argv[1]), sys.argv[2] == "shared", sys.argv[3:]))
