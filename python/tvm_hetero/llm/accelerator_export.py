"""What an exported language model keeps of graphs built for an accelerator, so that loading it
runs them again without building or finalizing anything.

Per entry graph, beside its ``graph_<size>.json`` and ``lib_<size>.so`` (whose accelerator regions
already hold the vendor's compiled graphs: the ``tvm_hetero_ep_regions`` module of the kernel
library keeps each region's finalized form, which the region runner opens as it is):

- ``packed_layout``: for a graph whose outputs are packed into one tensor (packed_outputs.py), the
  (offset, shape) of the logits and of each layer's new keys and values inside it; null otherwise.
  The loaders check it against the layout they compute from the configuration.
- ``constants``: the file (``constants_<size>.bin``, ``tvm.runtime.save_param_dict``) of the
  parameters this graph has beside the shared weights (those its accelerator's preparation lifted
  out), or null.
- ``report``: the file (``report_<size>.json``) of its build report: the devices, the regions on the
  accelerator, the ops the vendor refused with the reasons, the per-graph verification, the modeled
  cost. ``report()`` and ``stats()`` of a loaded model read it (graph executions per call).
- ``moved_to_host``: why the graph runs on the host although its phase's targets hold an
  accelerator ("" otherwise); ``build_seconds``: what its build took.

And for the model: ``phase_check`` (the whole-path check's result, phase_check.py) and
``decode_placement`` (decode_placement.py's choice), each null when the build did not run it.
Report files may hold NaN (an unmeasured figure), which Python's json reads and writes; they are
listed with the other files, so their checksums are verified before they are read.
"""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from ..artifact import read_json, read_params
from ..compiler.build import BuildReport
from .config import DecoderConfig
from .packed_outputs import packed_layout


def write_graph_extras(graph: Any, cfg: DecoderConfig, out: Path) -> tuple[dict, list[str]]:
    """The manifest fields of ``graph`` described above, and the files written for them into ``out``."""
    files = []
    fields: dict[str, Any] = {"packed_layout": _layout_table(cfg, graph.size) if graph.packed else None,
                              "constants": None, "report": None, "moved_to_host": graph.moved_to_host,
                              "build_seconds": graph.build_seconds}
    if graph.constants:
        name = f"constants_{graph.size}.bin"
        tensors = {k: v if isinstance(v, tvm.runtime.Tensor) else tvm.runtime.tensor(v)
                   for k, v in graph.constants.items()}
        (out / name).write_bytes(bytes(tvm.runtime.save_param_dict(tensors)))
        fields["constants"] = name
        files.append(name)
    if graph.build_report is not None:
        name = f"report_{graph.size}.json"
        (out / name).write_text(json.dumps(graph.build_report.to_dict(), default=_plain))
        fields["report"] = name
        files.append(name)
    return fields, files


def read_graph_extras(entry: dict, cfg: DecoderConfig, src: Path) -> dict[str, Any]:
    """The :class:`.EntryGraph` fields of one manifest entry (its files' checksums already verified)."""
    where = f"{src / 'manifest.json'}: the graph of {entry.get('size')} row(s)"
    layout = entry.get("packed_layout")
    if layout is not None and layout != _layout_table(cfg, int(entry["size"])):
        raise ValueError(f"{where}: its packed-output layout differs from the one its configuration gives "
                         "(logits, then each layer's new keys and values, flattened)")
    fields: dict[str, Any] = {"packed": layout is not None, "moved_to_host": str(entry.get("moved_to_host") or ""),
                              "build_seconds": float(entry.get("build_seconds") or 0.0)}
    if entry.get("constants"):
        path = src / entry["constants"]
        fields["constants"] = read_params(path.read_bytes(), str(path))
    if entry.get("report"):
        try:
            fields["build_report"] = BuildReport(**read_json(src / entry["report"]))
        except TypeError as err:
            raise ValueError(f"{src / entry['report']}: not a build report ({err})") from None
    return fields


def phase_check_to_manifest(check: dict | None) -> dict | None:
    """phase_check.py's result in JSON form (bucket sizes as strings, non-finite errors as null)."""
    if check is None:
        return None
    return {**check, "buckets": {str(size): _finite(e) for size, e in check["buckets"].items()},
            "decode": {**check["decode"], "errors": [_finite(e) for e in check["decode"]["errors"]],
                       "max_error": _finite(check["decode"]["max_error"])}}


def phase_check_from_manifest(check: dict | None) -> dict | None:
    if check is None:
        return None
    return {**check, "buckets": {int(size): _number(e) for size, e in check["buckets"].items()},
            "decode": {**check["decode"], "errors": [_number(e) for e in check["decode"]["errors"]],
                       "max_error": _number(check["decode"]["max_error"])},
            "failed": [int(s) for s in check["failed"]]}


def host_copy(tensor: tvm.runtime.Tensor) -> tvm.runtime.Tensor:
    """``tensor`` as a CPU tensor that ``save_param_dict`` can write. A weight that a graph placed on
    an accelerator of host memory (an input of the accelerator's graph) lies in host memory under
    that device's type, which TVM's own device table may not know: it is read in place through its
    pointer, and copied."""
    from ..devices import is_cpu, shares_memory

    if is_cpu(tensor.device) or not shares_memory(tensor.device, tvm.cpu(0)):
        return tensor
    dtype = np.dtype(str(tensor.dtype))
    count = int(np.prod([int(d) for d in tensor.shape], dtype=np.int64))
    raw = (ctypes.c_char * max(count * dtype.itemsize, 1)).from_address(tensor.data_ptr())
    return tvm.runtime.tensor(np.frombuffer(raw, dtype=dtype, count=count).reshape(tuple(tensor.shape)).copy())


def _layout_table(cfg: DecoderConfig, rows: int) -> list[list[Any]]:
    return [[offset, list(shape)] for offset, shape in packed_layout(cfg, rows)]


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _number(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _plain(value: Any) -> Any:
    """What json cannot write as it is: numpy numbers and arrays, tuples' cousins."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
