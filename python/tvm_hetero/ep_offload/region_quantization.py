"""Regions quantized at build: each float region's ONNX model becomes a QDQ model (8-bit weights,
16-bit activations: the device option ``precision="a16w8"``) just before the vendor compiles it,
calibrated on the values that region receives in real calls of the graph.

The quantization itself is the vendor's recipe (which ops, which types, which ranges it takes),
done by ONNX Runtime's static quantizer in the vendor's SDK module (its optional ``quantize(model,
options, feeds)``, :mod:`.sdk`). What is generic lives here: how the calibration data reaches it.

1. **Calibration build** (:func:`recording`): the graph is built with every region left as its plain
   fp32 ONNX model, run on ONNX Runtime's CPU EP (nothing is compiled for the device), and run on
   each calibration input; each region records the inputs it received, keyed by its plain model.
2. **Device build** (:func:`quantizing`): the same regions are built again; each region's plain
   model is quantized by the vendor with the inputs recorded for that very model, then compiled.

Guarantee: a region reaches the device quantized from calibration data of its own (the values the
graph gives it), or the build stops with an error naming the region -- never calibrated on nothing.

Additive masks: a graph may mask scores by adding a large negative number (a finite stand-in for
minus infinity). Stretched over 1e30, a 16-bit range has no step left for the scores themselves. Every
tensor holding values at or below :data:`MASKED_BELOW` (the mask itself, the masked scores) gets the
range ``[floor, its highest real value]`` instead (:func:`prepare`), with one floor for the region:
``lowest - highest - MASK_MARGIN`` over the real values of all those tensors (0 counted). The mask is
quantized before it is added: a masked entry of the mask becomes the floor, and added to any real
score (at most ``highest``) it lands ``MASK_MARGIN`` below every real score (at least ``lowest``),
where the masked scores saturate too; a softmax turns that into e^-64 (nothing), as a mask should.
(A floor of the mask's own lowest value minus the margin, -64, left a masked score 64 below its own
value only, above the real scores of its row that were lower still.)
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

#: Device precisions whose regions the build quantizes itself, calibrated (module docstring).
CALIBRATED_PRECISIONS = ("a16w8",)
#: Values at or below this are an additive mask's stand-in for minus infinity.
MASKED_BELOW = -1e20
#: How far below a masked tensor's real values its quantized range reaches.
MASK_MARGIN = 64.0
#: The ONNX opset a 16-bit QDQ model needs (16-bit QuantizeLinear / DequantizeLinear).
QDQ16_OPSET = 21


def quantizes(options: dict) -> bool:
    """Whether a device with ``options`` runs its regions quantized by the build (calibrated)."""
    return str(options.get("precision", "")) in CALIBRATED_PRECISIONS


def model_key(model: bytes) -> str:
    return hashlib.sha256(model).hexdigest()


class _State:
    def __init__(self, mode: str, feeds: dict[str, list[dict]]) -> None:
        self.mode = mode
        #: Per plain region model (its key): the inputs of each call, in order.
        self.feeds = feeds
        self.lock = threading.Lock()


_state: _State | None = None


@contextlib.contextmanager
def recording() -> Iterator[dict[str, list[dict]]]:
    """Step 1: regions built meanwhile stay plain fp32 models on the CPU EP and record the inputs of
    each call; yields those inputs by plain model key."""
    global _state
    state = _State("record", {})
    _state = state
    try:
        yield state.feeds
    finally:
        _state = None


@contextlib.contextmanager
def quantizing(feeds: dict[str, list[dict]]) -> Iterator[None]:
    """Step 2: regions built meanwhile are quantized with ``feeds`` (what :func:`recording` yielded)."""
    global _state
    _state = _State("quantize", feeds)
    try:
        yield
    finally:
        _state = None


def is_recording() -> bool:
    return _state is not None and _state.mode == "record"


def record(model: bytes, feeds: dict[str, np.ndarray]) -> None:
    """One call's inputs of the region whose plain model is ``model`` (step 1)."""
    state = _state
    if state is None or state.mode != "record":
        return
    with state.lock:
        state.feeds.setdefault(model_key(model), []).append({k: np.array(v) for k, v in feeds.items()})


def calibration_for(model: bytes, region: str) -> list[dict]:
    """The recorded inputs of ``region`` (step 2); an error naming it when it has none."""
    feeds = _state.feeds.get(model_key(model)) if _state is not None and _state.mode == "quantize" else None
    if not feeds:
        raise RuntimeError(f"region {region}: no calibration data was recorded for it (it was not part of the "
                           "calibration build); its quantized graph cannot be calibrated")
    return feeds


def prepare(model: bytes, feeds: list[dict]) -> tuple[Any, dict[str, list[dict]]]:
    """What ONNX Runtime's static quantizer needs of a plain region model: the model at the 16-bit QDQ
    opset (the region's ops mean the same there), every value's type and shape (from one CPU run: the
    quantizer calibrates only values whose type it knows, and ONNX's shape inference stops at ONNX
    Runtime's own ops), and range overrides for the masked tensors (module docstring).

    Returns ``(onnx.ModelProto, {tensor: [{"rmin", "rmax"}]})``."""
    import onnx
    from onnx import helper

    from .sdk import cpu_session

    proto = onnx.load_from_string(model)
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < QDQ16_OPSET:
            opset.version = QDQ16_OPSET
    graph_outputs = {o.name for o in proto.graph.output}
    values = [name for node in proto.graph.node for name in node.output if name and name not in graph_outputs]
    probe = copy.deepcopy(proto)
    for name in values:
        probe.graph.output.append(onnx.ValueInfoProto(name=name))
    session = cpu_session(probe.SerializeToString())
    lowest: dict[str, float] = {}
    highest: dict[str, float] = {}
    masked: set[str] = set()
    shapes: dict[str, tuple] = {}
    names = values + sorted(graph_outputs)
    for feed in feeds:
        results = dict(zip(names, session.run(names, feed)))
        results.update(feed)
        for name, value in results.items():
            value = np.asarray(value)
            shapes[name] = (value.dtype, value.shape)
            if value.dtype != np.float32:
                continue
            is_masked = value <= MASKED_BELOW
            if is_masked.any():
                masked.add(name)
            real = value[~is_masked]
            if real.size:
                lowest[name] = min(lowest.get(name, np.inf), float(real.min()))
                highest[name] = max(highest.get(name, -np.inf), float(real.max()))
    del proto.graph.value_info[:]
    for name in values:
        dtype, shape = shapes[name]
        proto.graph.value_info.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), shape))
    return proto, mask_ranges(masked, lowest, highest)


def mask_ranges(masked: set[str], lowest: dict[str, float], highest: dict[str, float]) -> dict[str, list[dict]]:
    """The quantizer's ranges of the masked tensors: ``[floor, highest real value]``, one floor for
    all of them (module docstring). ``lowest``/``highest``: each tensor's real (unmasked) extremes."""
    low = min([0.0] + [lowest[name] for name in masked if name in lowest])
    high = max([0.0] + [highest[name] for name in masked if name in highest])
    floor = np.float32(low - high - MASK_MARGIN)
    return {name: [{"rmin": floor, "rmax": np.float32(max(highest.get(name, 0.0), 0.0))}] for name in sorted(masked)}


def feed_reader(feeds: list[dict]) -> Any:
    """The recorded inputs as ONNX Runtime's quantizer reads calibration data (one pass)."""
    from onnxruntime.quantization import CalibrationDataReader

    class FeedReader(CalibrationDataReader):
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self._feeds, None)

    return FeedReader()
