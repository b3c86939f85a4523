"""The peer: ONNX Runtime with the QNN execution provider on an emulated Hexagon HTP.

The ``onnxruntime-qnn`` wheel ships the QNN EP as a plugin library and ``libQnnHtp.so``, whose x86_64
build emulates the HTP. :func:`accelerator_session` opens a session on the process's registration of the
plugin (the user's, under whatever name, else the product's own: ``qnn_ep.ep_devices``); default:
Snapdragon X Elite, ``soc_model`` 60 / ``htp_arch`` 73, fp16 precision for float models. :func:`run_peer` runs a model there and reports what the peer did:

- where nodes went: ORT's graph-assignment record (session config
  ``session.record_ep_graph_assignment_info``) lists one subgraph per QNN partition (fused node) and
  the nodes left on the CPU EP. The count is of ORT's optimized graph, which includes the layout
  Transposes ORT inserts around NHWC regions, so it can exceed the model's node count. The plugin
  does not log the "Number of partitions supported by QNN EP" summary, so the record is the source;
  where the verbose log's "Node(s) placed on [<its registration name>]. Number of nodes: N" line is
  present it must agree, and a mismatch is reported as an error in the result;
- why nodes were refused: the native log at verbose level (captured by redirecting file descriptor 2
  around session creation and the runs), its "Validation FAILED" reasons and any QNN backend
  validation failures (``backendValidateOpConfig() failed ... error code 3110``);
- outputs and the median wall time per inference (the emulator's wall time says nothing about a
  real HTP; it is what the peer costs on this machine).

``isolated=True`` runs the peer in a child process (this file run as a script, which imports only
numpy and onnxruntime), so that an abort or segmentation fault in the vendor library comes back as
a :class:`PeerResult` with ``ran=False`` and the signal, instead of killing the caller.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CPU_EP = "CPUExecutionProvider"
# Snapdragon X Elite (SC8380XP): SoC id 60, HTP v73. fp16 must be set explicitly (the plugin's
# default is 0) and needs soc_model on x86_64.
DEFAULT_OPTIONS = {"soc_model": "60", "htp_arch": "73", "enable_htp_fp16_precision": "1"}
ASSIGNMENT_KEY = "session.record_ep_graph_assignment_info"
NO_FALLBACK_KEY = "session.disable_cpu_ep_fallback"
# Verbose log lines that explain a refusal.
_FAILED = re.compile(r"Validation FAILED for \d+ nodes in OrtNodeUnit \((?P<op>[^)]*)\)")
_REASON = re.compile(r"REASON\s*:\s*(?P<reason>.*)")
_NODE = re.compile(r"Operator type: (?P<op>\S+) Node name: (?P<name>.*?) Node index")
_BACKEND_FAILED = re.compile(r"(backendValidateOpConfig\(\) failed.*|Failed to (?:validate|finalize|compose).*)")
_PLACED_ON = re.compile(r"Node\(s\) placed on \[(?P<ep>[^\]]+)\]\. Number of nodes: (?P<count>\d+)")

# The PeerResult fields known once the session exists (written by an isolated child before it runs).
_PLACEMENT = ("session_seconds", "partitions", "nodes_qnn", "nodes_cpu", "cpu_ops", "partition_sizes")



@dataclass
class PeerResult:
    """What one peer run did."""

    ran: bool  #: the session was created and every run finished (``error`` may still report a check)
    outputs: list[np.ndarray] = field(default_factory=list)  #: outputs of the last run
    seconds: float = float("nan")  #: median wall time per inference
    times: list[float] = field(default_factory=list)  #: every timed run, seconds
    session_seconds: float = float("nan")  #: session creation (QNN graph compose and finalize)
    partitions: int = 0  #: QNN partitions (fused nodes, one QNN graph each)
    nodes_qnn: int = 0  #: nodes of ORT's optimized graph inside QNN partitions
    nodes_cpu: int = 0  #: nodes of ORT's optimized graph on the CPU EP
    cpu_ops: dict[str, int] = field(default_factory=dict)  #: op type -> count, nodes on the CPU EP
    partition_sizes: list[int] = field(default_factory=list)  #: nodes per QNN partition
    refusals: list[str] = field(default_factory=list)  #: why QNN refused nodes (deduplicated)
    error: str | None = None  #: exception text, crash signal or timeout
    exit_signal: int | None = None  #: the signal that killed the isolated child
    log_tail: str = ""  #: the end of the captured native log when something failed

    def summary(self) -> str:
        """One line: ran or why not, partitions, node split, time."""
        if not self.ran:
            return f"did not run: {self.error}"
        line = (f"{self.partitions} QNN partition(s), {self.nodes_qnn} nodes on QNN, {self.nodes_cpu} on CPU, "
                f"{self.seconds * 1e3:.1f} ms/inference")
        return f"{line}; {self.error}" if self.error else line


def available() -> bool:
    """Whether onnxruntime and the onnxruntime-qnn plugin (with its HTP backend) are importable."""
    try:
        import onnxruntime  # noqa: F401
        import onnxruntime_qnn
    except ImportError:
        return False
    return Path(onnxruntime_qnn.get_library_path()).is_file() and Path(onnxruntime_qnn.get_qnn_htp_path()).is_file()


def _register() -> list:
    """The QNN plugin's EP devices: the process's registration of it (the user's, under any name),
    else the product's own (one per process, shared with the product)."""
    from tvm_hetero.qnn import ep as qnn_ep

    return qnn_ep.ep_devices()


def _qnn_ep_name() -> str:
    """What ONNX Runtime calls the QNN EP in this process (its registration name)."""
    from tvm_hetero.qnn import ep as qnn_ep

    return qnn_ep.ep_name()


def _model_bytes(model: Any) -> bytes:
    """An ONNX model as bytes: a ModelProto, bytes, or a path."""
    if isinstance(model, bytes):
        return model
    if isinstance(model, (str, os.PathLike)):
        return Path(model).read_bytes()
    return model.SerializeToString()


def accelerator_session(model: Any, options: dict[str, str] | None = None, disable_cpu_fallback: bool = False,
                log_severity: int = 3, threads: int | None = None):
    """An ``onnxruntime.InferenceSession`` on the emulated HTP.

    ``options`` are QNN provider options laid over :data:`DEFAULT_OPTIONS` (``backend_path`` is the
    wheel's ``libQnnHtp.so`` unless given). With ``disable_cpu_fallback`` session creation fails
    when any node would run on the CPU EP. ``log_severity`` is ORT's session log level (0 verbose,
    3 errors); ``threads`` the CPU EP's intra-op threads (ORT's default when None)."""
    import onnxruntime as ort
    import onnxruntime_qnn

    devices = _register()
    provider_options = {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), **DEFAULT_OPTIONS, **(options or {})}
    session_options = ort.SessionOptions()
    session_options.log_severity_level = log_severity
    session_options.add_session_config_entry(ASSIGNMENT_KEY, "1")
    if disable_cpu_fallback:
        session_options.add_session_config_entry(NO_FALLBACK_KEY, "1")
    if threads is not None:
        session_options.intra_op_num_threads = threads
    session_options.add_provider_for_devices(devices, provider_options)
    return ort.InferenceSession(_model_bytes(model), session_options)


@contextlib.contextmanager
def _captured_stderr(path: Path | None = None):
    """Redirect file descriptor 2 (where ORT and QNN log natively) to ``path`` (a temporary file
    when None); yields a list that holds the captured text once the block exits. A named file
    outlives a crash of this process, for the parent of an isolated run to read."""
    captured: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w+b") if path is not None else tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode(errors="replace"))


def _refusals(log: str) -> list[str]:
    """The deduplicated refusal reasons in a verbose QNN EP log, in order of first appearance."""
    found: dict[str, None] = {}
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if match := _FAILED.search(line):
            node = ""
            reason = ""
            for follow in lines[i + 1:i + 4]:
                if m := _NODE.search(follow):
                    node = f"{m['op']} {m['name']!r}".strip()
                elif m := _REASON.search(follow):
                    reason = m["reason"].strip()
            found[f"{node or match['op']}: {reason}"] = None
        elif match := _BACKEND_FAILED.search(line):
            found[match.group(1).strip()] = None
    return list(found)


def _assignment(session, result: PeerResult) -> None:
    """Fill partitions and node counts from ORT's assignment record."""
    qnn = _qnn_ep_name()
    for subgraph in session.get_provider_graph_assignment_info():
        nodes = subgraph.get_nodes()
        if subgraph.ep_name == qnn:
            result.partitions += 1
            result.partition_sizes.append(len(nodes))
            result.nodes_qnn += len(nodes)
        else:
            result.nodes_cpu += len(nodes)
            for node in nodes:
                result.cpu_ops[node.op_type] = result.cpu_ops.get(node.op_type, 0) + 1


def _check_against_log(result: PeerResult, log: str) -> None:
    """The record and the verbose log must agree on the number of QNN partitions."""
    qnn = _qnn_ep_name()
    placed = [m["count"] for m in _PLACED_ON.finditer(log) if m["ep"] == qnn]
    if placed and int(placed[-1]) != result.partitions:
        result.error = (f"assignment record shows {result.partitions} QNN partitions but the log placed "
                        f"{placed[-1]} fused nodes on QNN")


def _run_here(model: Any, inputs: dict[str, np.ndarray], options: dict[str, str] | None, repeat: int,
              warmup: int, disable_cpu_fallback: bool, threads: int | None,
              work: Path | None = None) -> PeerResult:
    """Create the session at verbose log level, then time ``repeat`` runs after ``warmup``, all with
    the native log captured. The plugin logs through the session's logger, so the runs log at
    verbose level too (a few lines per partition into the sink: microseconds against the
    emulator's milliseconds). With ``work`` (an isolated child's folder), the log goes to
    ``work/native.log`` and the placement to ``work/placement.json`` as soon as it is known, so
    that both outlive a crash in the runs."""
    result = PeerResult(ran=False)
    with _captured_stderr(work / "native.log" if work else None) as captured:
        _create_and_run(model, inputs, options, repeat, warmup, disable_cpu_fallback, threads, result, work)
    log = captured[0]
    result.refusals = _refusals(log)
    if result.partitions or result.nodes_cpu:
        _check_against_log(result, log)
    if result.error is not None:
        result.log_tail = log[-4000:]
    return result


def _create_and_run(model: Any, inputs: dict[str, np.ndarray], options: dict[str, str] | None, repeat: int,
                    warmup: int, disable_cpu_fallback: bool, threads: int | None, result: PeerResult,
                    work: Path | None) -> None:
    """Fill ``result``; failures (session refused, run failed) go to ``result.error``."""
    import onnxruntime as ort

    try:
        start = time.perf_counter()
        session = accelerator_session(model, options, disable_cpu_fallback, log_severity=0, threads=threads)
        result.session_seconds = time.perf_counter() - start
        _assignment(session, result)
        if work is not None:
            (work / "placement.json").write_text(json.dumps({k: getattr(result, k) for k in _PLACEMENT}))
        run_options = ort.RunOptions()
        for _ in range(warmup):
            session.run(None, inputs, run_options)
        for _ in range(max(repeat, 1)):
            start = time.perf_counter()
            result.outputs = session.run(None, inputs, run_options)
            result.times.append(time.perf_counter() - start)
        result.seconds = statistics.median(result.times)
        result.ran = True
    except Exception as exc:  # noqa: BLE001 (reported, not raised: whatever ORT or the plugin raised)
        result.error = f"{type(exc).__name__}: {exc}"


def run_peer(model: Any, inputs: dict[str, np.ndarray], options: dict[str, str] | None = None, *,
             repeat: int = 3, warmup: int = 1, disable_cpu_fallback: bool = False, threads: int | None = None,
             isolated: bool = False, timeout: float | None = 1800.0, _test_fault: str | None = None) -> PeerResult:
    """Run ``model`` (ModelProto, bytes or path) on ORT + QNN (emulated HTP) with ``inputs``.

    Session creation failures and run failures come back in ``PeerResult.error`` rather than being
    raised. ``isolated`` runs everything in a child process and also catches crashes and
    ``timeout`` (seconds). ``_test_fault`` is a test hook for the child: ``"abort"`` makes it call
    ``os.abort()`` where the vendor library would run."""
    if not isolated:
        if _test_fault:
            raise ValueError("_test_fault needs isolated=True")
        return _run_here(model, inputs, options, repeat, warmup, disable_cpu_fallback, threads)
    return _run_isolated(model, inputs, options, repeat, warmup, disable_cpu_fallback, threads, timeout,
                         _test_fault)


def cpu_reference(model: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's CPU EP, fp32: the reference the peer is judged against."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(_model_bytes(model), options, providers=[CPU_EP])
    return session.run(None, inputs)


def relative_error(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The largest ``|output - reference|`` over all outputs, divided by the largest ``|reference|``;
    infinity when shapes differ or an output is not finite."""
    if len(outputs) != len(reference):
        return float("inf")
    worst, scale = 0.0, 0.0
    for out, ref in zip(outputs, reference):
        out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
        if out.shape != ref.shape or not np.all(np.isfinite(out)):
            return float("inf")
        worst = max(worst, float(np.max(np.abs(out - ref), initial=0.0)))
        scale = max(scale, float(np.max(np.abs(ref), initial=0.0)))
    return worst / scale if scale else worst


# ---- isolation: the same run in a child process ----------------------------------------------
def _run_isolated(model: Any, inputs: dict[str, np.ndarray], options: dict[str, str] | None, repeat: int,
                  warmup: int, disable_cpu_fallback: bool, threads: int | None, timeout: float | None,
                  fault: str | None) -> PeerResult:
    with tempfile.TemporaryDirectory(prefix="qnn-peer-") as tmp:
        work = Path(tmp)
        (work / "model.onnx").write_bytes(_model_bytes(model))
        np.savez(work / "inputs.npz", **inputs)
        request = {"options": options, "repeat": repeat, "warmup": warmup, "threads": threads,
                   "disable_cpu_fallback": disable_cpu_fallback, "input_names": list(inputs), "fault": fault}
        (work / "request.json").write_text(json.dumps(request))
        try:
            # Run this file by path without putting its folder on sys.path, where this module's
            # own name would hide the onnxruntime_qnn package.
            launcher = f"import runpy; runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')"
            child = subprocess.run([sys.executable, "-c", launcher, "--child", str(work)], cwd=work,
                                   capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            tail = (exc.stderr or b"")[-4000:]
            return PeerResult(ran=False, error=f"timed out after {timeout} s",
                              log_tail=tail.decode(errors="replace") if isinstance(tail, bytes) else tail)
        if child.returncode != 0 or not (work / "result.json").is_file():
            native = work / "native.log"
            log = native.read_text(errors="replace") if native.is_file() else ""
            tail = child.stderr[-2000:] + log[-4000:]
            placement = work / "placement.json"
            known = json.loads(placement.read_text()) if placement.is_file() else {}
            known["refusals"] = _refusals(log)
            if child.returncode < 0:
                number = -child.returncode
                where = "running" if known else "creating the session"
                return PeerResult(ran=False, exit_signal=number, log_tail=tail, **known,
                                  error=f"peer process killed by {signal.Signals(number).name} while {where}")
            return PeerResult(ran=False, log_tail=tail, **known,
                              error=f"peer process exited with status {child.returncode}")
        fields = json.loads((work / "result.json").read_text())
        with np.load(work / "outputs.npz") as outputs:
            fields["outputs"] = [outputs[f"out{i}"] for i in range(len(outputs.files))]
        return PeerResult(**fields)


def _child_main(work: Path) -> int:
    """The child: read the request from ``work``, run, write ``result.json`` and ``outputs.npz``."""
    request = json.loads((work / "request.json").read_text())
    with np.load(work / "inputs.npz") as stored:
        inputs = {name: stored[name] for name in request["input_names"]}
    if request["fault"] == "abort":
        os.abort()
    result = _run_here(work / "model.onnx", inputs, request["options"], request["repeat"], request["warmup"],
                       request["disable_cpu_fallback"], request["threads"], work)
    np.savez(work / "outputs.npz", **{f"out{i}": out for i, out in enumerate(result.outputs)})
    fields = asdict(result)
    del fields["outputs"]
    (work / "result.json").write_text(json.dumps(fields))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child_main(Path(sys.argv[2])))
    sys.exit("usage: onnxruntime_qnn.py --child WORK_DIR (used by run_peer(isolated=True))")
