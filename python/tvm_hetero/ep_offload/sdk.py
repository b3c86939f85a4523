"""The contract between the generic offload path and a vendor's SDK module.

A vendor package names one module (its backend's ``sdk``, a dotted module path) that has:

- ``require()``: make the SDK usable or raise :class:`VendorUnavailable` naming what to install;
  ``available() -> bool``; ``version() -> str`` (keys the capability cache);
- ``accelerator_session(model, options, log_level=3)``: an ONNX Runtime session running all of an
  ONNX model on the accelerator (an error, never a CPU fallback, when it cannot);
- ``accepts(model, options) -> (bool, reason)``: whether it takes every node, else the vendor's reason;
- ``finalize(model, options) -> bytes``: the model compiled for the device (an EP-context model);
- ``unsupported_nodes(model, options) -> [(node name, op type)]``: the nodes it will not take;
- ``accelerator_outputs(model, options, feeds, names) -> [array]``: named values computed there;
- ``profiled_cycles(model, options, feeds) -> (cycles, microseconds)``: NaNs where it has no profile.

A cost module (the backend's ``costs``; optional) has ``graph_key(model, options) -> str``,
``graph_seconds(key, cycles, options) -> placement_judgement.Cost`` (seconds, labelled) and ``modeled(options, cycles, calls) ->
ModeledLatency``: the accelerator's time, never an emulator's wall time. Everything is looked up by name, so a child process can import it too.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

#: The functions a vendor's SDK module must have.
REQUIRED = ("require", "available", "version", "accelerator_session", "accepts", "finalize", "unsupported_nodes",
            "accelerator_outputs", "profiled_cycles")
#: The functions the build may ask of it by name, in this process or in the vendor's (vendor_process.py).
CALLABLE = ("finalize", "unsupported_nodes", "profiled_cycles", "accelerator_outputs")


@dataclass(frozen=True)
class ModeledLatency:
    """A cost module's modeled time per inference: cycles times the device's microseconds per cycle
    (and where that factor comes from), plus a fixed cost per graph call."""

    seconds: float
    cycles: float
    us_per_cycle: float
    factor_source: str
    calls: int
    call_seconds: float


class VendorUnavailable(RuntimeError):
    """A vendor's SDK is not installed here (or its library cannot be loaded)."""


def load(sdk: str) -> ModuleType:
    """The vendor's SDK module, checked against the contract."""
    module = importlib.import_module(sdk)
    missing = [name for name in REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise TypeError(f"vendor SDK module {sdk!r} lacks {', '.join(missing)} (see tvm_hetero.ep_offload.sdk)")
    return module


def function(sdk: str, name: str) -> Any:
    """One of :data:`CALLABLE`, by name (an unknown name is an error before any process is asked)."""
    if name not in CALLABLE:
        raise ValueError(f"vendor call: unknown function {name!r}; one of {sorted(CALLABLE)}")
    return getattr(load(sdk), name)


def cpu_session(model: bytes, threads: int = 1) -> Any:
    """The model on ONNX Runtime's CPU EP in fp32: the reference every accelerator region is checked against."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise VendorUnavailable("checking an accelerator's regions needs onnxruntime: pip install onnxruntime") from err
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
