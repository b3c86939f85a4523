"""The way into a Qualcomm HTP: ONNX Runtime's QNN execution provider (``onnxruntime-qnn``).

QNN's own headers are proprietary, so every HTP graph is an ONNX model handed to the QNN EP: the
compiler asks it what it accepts (:func:`accepts`) and finalizes each region into an EP-context
model (a QNN context binary inside ONNX, :func:`finalize`); the runtime opens those without
finalizing again (:func:`accelerator_session`). On x86 the wheel's ``libQnnHtp.so`` emulates the HTP.

Sessions are created with ``session.disable_cpu_ep_fallback=1``: a graph the HTP does not take
whole is an error, never a quiet run on ONNX Runtime's CPU EP. QNN states its reasons on the native
stderr only; :func:`captured_stderr` collects them around a session's creation.

This is the QNN's SDK module of the generic offload path (:mod:`tvm_hetero.ep_offload.sdk` states
the contract). Below the compiler and the runtime: it imports neither.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from ..cache_dir import cache_root
from ..ep_offload.onnx_regions import IR_VERSION, OPSET  # noqa: F401  (what QNN reads: re-exported)
from ..ep_offload.sdk import VendorUnavailable, cpu_session  # noqa: F401  (cpu_session: the reference)
from ..errors import last_line

#: The name this package registers the QNN EP library under when the process has not registered
#: it yet. Not the usual "QNNExecutionProvider": that name stays free for the user's own
#: ``onnxruntime.register_execution_provider_library`` call (ONNX Runtime refuses a second
#: registration under one name, and the same library loads under two names side by side).
OWN_REGISTRATION = "tvm_hetero.QNNExecutionProvider"
#: The ``source`` of the EP-context nodes :func:`finalize` writes. The QNN EP opens a context whose
#: source is this name under any registration, but one stamped with another registration's name only
#: under that name; so contexts finalized here open in any process, whoever registered the EP there.
CONTEXT_SOURCE = "QNNExecutionProvider"

_lock = threading.Lock()


class QnnUnavailable(VendorUnavailable):
    """onnxruntime-qnn is not installed (or its HTP library cannot be loaded)."""


def require() -> Any:
    """``(onnxruntime, onnxruntime_qnn)`` with the QNN EP registered: found where the process
    registered it already (under any name), else registered once under :data:`OWN_REGISTRATION`."""
    try:
        import onnxruntime
        import onnxruntime_qnn
    except ImportError as err:
        raise QnnUnavailable(
            "the qnn-htp device needs ONNX Runtime's QNN execution provider, which is not installed: "
            "pip install 'tvm-hetero[qnn]' (onnxruntime==1.31.1, onnxruntime-qnn==2.7.0)"
        ) from err
    ep_devices()
    _load_without_notice(onnxruntime_qnn.get_qnn_htp_path())
    return onnxruntime, onnxruntime_qnn


#: libQnnHtp, loaded once and kept: the QNN EP's own loads then find it loaded and print nothing.
_htp_library: Any = None
#: What libQnnHtp prints on the native stdout when it is loaded (its thread-local storage config).
_LOAD_NOTICE = "# LIBNATIVE:"


def _load_without_notice(path: str) -> None:
    """Load libQnnHtp once, its load-time notice kept off the user's terminal; every other line it
    prints on stdout while loading is passed on."""
    global _htp_library
    import ctypes
    import sys

    with _lock:
        if _htp_library is not None:
            return
        sys.stdout.flush()
        with tempfile.TemporaryFile(mode="w+b") as sink:
            saved = os.dup(1)
            try:
                os.dup2(sink.fileno(), 1)
                _htp_library = ctypes.CDLL(path)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
                sink.seek(0)
                kept = [line for line in sink.read().decode("utf-8", "replace").splitlines(keepends=True)
                        if not line.strip().startswith(_LOAD_NOTICE)]
                if kept:
                    os.write(1, "".join(kept).encode())


def ep_devices() -> list:
    """ONNX Runtime's devices of the QNN EP (one registration's), registering it when no
    registration of this wheel's QNN EP library is listed (asked of ``get_ep_devices`` each time:
    the user may register or unregister theirs at any time)."""
    import onnxruntime
    import onnxruntime_qnn

    library = onnxruntime_qnn.get_library_path()
    with _lock:
        devices = _registered_devices(onnxruntime, library)
        if not devices:
            try:
                onnxruntime.register_execution_provider_library(OWN_REGISTRATION, library)
            except Exception as err:  # ONNX Runtime raises its own Fail type
                if "already registered" not in str(err):
                    raise QnnUnavailable(f"ONNX Runtime could not load the QNN EP library {library}: {err}") from err
            devices = _registered_devices(onnxruntime, library)
    if not devices:
        raise QnnUnavailable(f"ONNX Runtime lists no QNN EP device for {library} (onnxruntime-qnn failed to load)")
    return devices


def ep_name() -> str:
    """The name the QNN EP is registered under in this process (what ONNX Runtime's assignment
    records and logs call it)."""
    return ep_devices()[0].ep_name


def _registered_devices(ort: Any, library: str) -> list:
    """The devices of one registration of ``library`` (this package's own name first, so that a
    user unregistering theirs never leaves this package's sessions without one)."""
    by_name: dict[str, list] = {}
    for device in ort.get_ep_devices():
        path = (dict(device.ep_metadata) if device.ep_metadata is not None else {}).get("library_path", "")
        if path and _same_file(path, library):
            by_name.setdefault(device.ep_name, []).append(device)
    if not by_name:
        return []
    return by_name.get(OWN_REGISTRATION) or next(iter(by_name.values()))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def available() -> bool:
    try:
        require()
    except (QnnUnavailable, RuntimeError, OSError):
        return False
    return True


#: The device's precisions: "fp16" (float graphs in fp16), "quantized" (the model is QDQ already),
#: "a16w8" (float graphs the build quantizes: 8-bit weights, 16-bit activations; :func:`quantize`).
PRECISIONS = ("fp16", "quantized", "a16w8")


def provider_options(options: dict) -> dict[str, str]:
    """The QNN EP's options for a device's ``{"soc_model", "htp_arch", "precision"}``. fp16 is
    set explicitly (its default differs between the docs and the code), and on x86 Linux it is
    refused unless ``soc_model`` is set, which it always is here."""
    _ort, qnn = require()
    precision = str(options.get("precision", "fp16"))
    if precision not in PRECISIONS:
        raise ValueError(f"qnn-htp precision {precision!r}: expected one of {', '.join(map(repr, PRECISIONS))}")
    out = {
        "backend_path": qnn.get_qnn_htp_path(),
        "soc_model": str(int(options.get("soc_model", 60))),
        "htp_arch": str(int(options.get("htp_arch", 73))),
        "enable_htp_fp16_precision": "1" if precision == "fp16" else "0",
        # A region's input dequantize and output quantize are the region's own work: by default the
        # QNN EP hands them to ONNX Runtime's CPU EP, which a region (no CPU fallback) cannot have.
        "offload_graph_io_quantization": "0",
    }
    for key in ("profiling_level", "profiling_file_path", "htp_performance_mode"):
        if key in options:
            out[key] = str(options[key])
    return out


def _session_options(options: dict, extra: dict[str, str] | None = None, threads: int | None = None,
                     log_level: int = 3) -> Any:
    ort, _qnn = require()
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for key, value in (extra or {}).items():
        so.add_session_config_entry(key, value)
    so.log_severity_level = log_level  # QNN's warnings are collected from stderr where they matter
    if threads is not None:
        so.intra_op_num_threads = threads
    so.add_provider_for_devices(ep_devices(), provider_options(options))
    return so


def accelerator_session(model: bytes, options: dict, log_level: int = 3) -> Any:
    """An ONNX Runtime session running all of ``model`` on the HTP (an error if it cannot)."""
    ort, _qnn = require()
    return ort.InferenceSession(model, _session_options(options, log_level=log_level))


def version() -> str:
    """onnxruntime-qnn's version (QNN's answers are cached under it)."""
    from onnxruntime_qnn import __version__

    return str(__version__)


def why_unavailable() -> str | None:
    """Why the HTP cannot be used here (onnxruntime-qnn missing), or None."""
    import importlib.util

    if importlib.util.find_spec("onnxruntime_qnn") is None:
        return ("the qnn-htp device needs ONNX Runtime's QNN execution provider, which is not installed: "
                "pip install 'tvm-hetero[qnn]' (onnxruntime-qnn)")
    return None


def discover() -> list:
    """The HTP this machine reaches through onnxruntime-qnn (emulated on x86), or none."""
    import tvm

    from ..devices import DeviceInfo
    from . import KIND

    if why_unavailable() is not None:
        return []
    options = dict(KIND.default_options)
    return [DeviceInfo(tvm.runtime.Device(KIND.device_type, 0), None, {"kind": KIND.name, **options},
                       f"Qualcomm HTP v{options['htp_arch']} (soc {options['soc_model']}) through QNN "
                       "(onnxruntime-qnn; emulated on x86)")]


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to file descriptor 2 meanwhile (QNN's reasons)."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        try:
            os.dup2(sink.fileno(), 2)
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace")
            lines.extend(_ANSI.sub("", line) for line in text.splitlines() if line.strip())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REASON = re.compile(r"(backendValidateOpConfig\(\) failed.*|Unsupported.*|not supported.*|.*is not supported.*)",
                     re.IGNORECASE)


def accepts(model: bytes, options: dict) -> tuple[bool, str]:
    """Whether QNN takes every node of ``model`` on the HTP, and else QNN's reason."""
    with captured_stderr() as lines:
        try:
            accelerator_session(model, options, log_level=2)  # warnings carry QNN's validation verdicts
            ok, error = True, ""
        except QnnUnavailable:
            raise
        except Exception as err:  # noqa: BLE001 (ONNX Runtime raises its own Fail/InvalidArgument types)
            ok, error = False, last_line(err)
    if ok:
        return True, ""
    # "Unsupported nodes in QNN EP:" can come with an empty list: the EP claimed nothing, said nothing.
    reasons = [m.group(1).strip() for line in lines if (m := _REASON.search(line))
               and not m.group(1).strip().endswith(":")]
    if reasons:
        return False, "; ".join(dict.fromkeys(reasons))
    if "fallback to CPU EP has been explicitly disabled" in error:
        return False, "the QNN EP does not claim the node (no op builder takes it there)"
    return False, error


def profiled_cycles(model: bytes, options: dict, feeds: dict) -> tuple[float, float]:
    """``(cycles, microseconds)`` of one execution of ``model`` on the HTP, from QNN's detailed
    profile ("Accelerator (execute) time" in cycles and in us). On the emulator only the cycles mean
    anything for a device; on a device the pair is what :func:`fit_us_per_cycle` reads."""
    with tempfile.TemporaryDirectory(prefix="tvm_hetero_qnn_profile_") as tmp:
        path = os.path.join(tmp, "profile.csv")
        session = accelerator_session(model, {**options, "profiling_level": "detailed", "profiling_file_path": path})
        session.run(None, feeds)
        del session  # the profile is written when the session ends
        return read_profile(path)


def read_profile(path: str) -> tuple[float, float]:
    """``(cycles, microseconds)`` of the last graph execution in a QNN profile CSV (as the QNN EP
    writes it with ``profiling_level=detailed``)."""
    cycles = micros = float("nan")
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split(",")
            if len(fields) < 7 or fields[5] != "ROOT":
                continue
            if fields[6] == "Accelerator (execute) time (cycles)" and fields[3] == "CYCLES":
                cycles = float(fields[2])
            elif fields[6] == "Accelerator (execute) time" and fields[3] == "US":
                micros = float(fields[2])
    return cycles, micros


def fit_us_per_cycle(path: str) -> float:
    """A device's microseconds per HTP cycle from one of its QNN profiles (the root pair)."""
    cycles, micros = read_profile(path)
    if not (cycles > 0 and micros > 0):
        raise ValueError(f"{path}: no 'Accelerator (execute) time' pair in cycles and us (profile with "
                         "profiling_level=detailed on the device)")
    return micros / cycles


#: The HTP cost model's defaults: a QNN graph call costs ~0.16 ms on phones (ORT QNN EP over a raw
#: context binary, ResNet50/SqueezeNet w8a8, ai-hub-models perf.yaml), and one cycle of this
#: emulator's detailed profile is worth 0.496 ms / 95.16e6: SqueezeNet-1.1 fp16 runs in 0.496 ms on a
#: Snapdragon X Elite (ai-hub-models) and the ONNX light SqueezeNet (the 1.0 architecture, about
#: twice the work) in 95.16 M emulated cycles here -- a rough default, so modeled HTP times are
#: indicative until a device profile is imported with ``tvm-hetero qnn-fit`` (kept in
#: ~/.cache/tvm-hetero/qnn_device.json).
CALL_SECONDS = 0.16e-3
DEFAULT_US_PER_CYCLE = 496.0 / 95.16e6


def us_per_cycle(options: dict) -> tuple[float, str]:
    """The factor for a device's options, and where it came from."""
    fitted = _fitted_factors().get(f"{int(options.get('soc_model', 60))}/{int(options.get('htp_arch', 73))}")
    if fitted:
        return float(fitted["us_per_cycle"]), f"fitted from {fitted['source']}"
    return DEFAULT_US_PER_CYCLE, "default (SqueezeNet on an X Elite over this emulator's cycles)"


def fitted_factors_path() -> str:
    return str(cache_root() / "qnn_device.json")


def _fitted_factors() -> dict:
    try:
        with open(fitted_factors_path()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_fitted_factor(options: dict, factor: float, source: str) -> str:
    """Keep a device's fitted factor (``tvm-hetero qnn-fit``); returns the file."""
    path = fitted_factors_path()
    table = _fitted_factors()
    table[f"{int(options.get('soc_model', 60))}/{int(options.get('htp_arch', 73))}"] = {
        "us_per_cycle": factor, "source": source}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
    return path


_UNSUPPORTED_NODE = re.compile(r"name:\s*([\w.\-]+),\s*type:\s*(\w+)")


def unsupported_nodes(model: bytes, options: dict) -> list[tuple[str, str]]:
    """``(node name, op type)`` of each node of ``model`` the QNN EP leaves out (its own log)."""
    with captured_stderr() as lines:
        try:
            accelerator_session(model, options, log_level=1)
        except Exception:  # noqa: BLE001, S110 (the refusal is expected; its log is the answer)
            pass
    found = []
    for line in lines:
        if "Unsupported nodes in QNN EP" in line:
            found.extend(_UNSUPPORTED_NODE.findall(line))
    return list(dict.fromkeys(found))


def accelerator_outputs(model: bytes, options: dict, feeds: dict, names: list[str]) -> list:
    """``names`` of ``model`` run once on the HTP (a graph with extra outputs, for verification)."""
    return accelerator_session(model, options).run(names, feeds)


def finalize(model: bytes, options: dict) -> bytes:
    """The EP-context model of ``model``: the QNN context binary (the finalized HTP graph)
    embedded in an ONNX model, which :func:`accelerator_session` opens without finalizing again."""
    with tempfile.TemporaryDirectory(prefix="tvm_hetero_qnn_") as tmp:
        path = os.path.join(tmp, "region_ctx.onnx")
        extra = {"ep.context_enable": "1", "ep.context_embed_mode": "1", "ep.context_file_path": path}
        ort, _qnn = require()
        with captured_stderr():
            ort.InferenceSession(model, _session_options(options, extra))
        with open(path, "rb") as f:
            return portable_context(f.read())


def portable_context(context: bytes) -> bytes:
    """An EP-context model whose nodes' ``source`` is :data:`CONTEXT_SOURCE` (the QNN EP stamps the
    name it was registered under, and opens a context of another registration's name nowhere else)."""
    import onnx

    model = onnx.load_from_string(context)
    changed = False
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        for attribute in node.attribute:
            if attribute.name == "source" and attribute.s.decode() != CONTEXT_SOURCE:
                attribute.s = CONTEXT_SOURCE.encode()
                changed = True
    return model.SerializeToString() if changed else context


def quantize(model: bytes, options: dict, feeds: list[dict]) -> bytes:
    """``model`` (a float region) as the QDQ model the HTP runs for precision "a16w8": 8-bit weights,
    16-bit activations (as the HTP decoders of ExecuTorch, ONNX Runtime GenAI and Genie ship),
    quantized by ONNX Runtime's static quantizer with QNN's own configuration (which ops it takes
    quantized, in which form), the weights QNN takes per channel with a scale per output channel
    (:mod:`.per_channel_weights`), calibrated on ``feeds`` (the region's inputs in real calls;
    :mod:`tvm_hetero.ep_offload.region_quantization`)."""
    import onnxruntime.quantization as ortq
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from ..ep_offload.region_quantization import feed_reader, prepare
    from .per_channel_weights import per_channel_weights

    if str(options.get("precision")) != "a16w8":
        raise ValueError(f"qnn-htp: quantize is for precision 'a16w8', not {options.get('precision')!r}")
    proto, overrides = prepare(model, feeds)
    overrides.update(per_channel_weights(proto))
    config = get_qnn_qdq_config(proto, feed_reader(feeds), activation_type=ortq.QuantType.QUInt16,
                                weight_type=ortq.QuantType.QUInt8, init_overrides=overrides)
    with tempfile.TemporaryDirectory(prefix="tvm_hetero_qnn_qdq_") as tmp:
        path = os.path.join(tmp, "region_qdq.onnx")
        ortq.quantize(proto, path, config)
        with open(path, "rb") as f:
            return f.read()
