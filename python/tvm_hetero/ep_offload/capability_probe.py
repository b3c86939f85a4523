"""Asking a vendor about ops, where a crash in the vendor library is an answer, not a dead build.

A vendor can accept an op and then compute it wrongly or crash the process when it runs (the docs
record an AveragePool the first vendor's emulator takes, then computes ~50% off or dies with
SIGSEGV). So an op counts as accepted
only when the vendor (1) takes it whole with CPU fallback disabled, (2) runs it on seeded random
inputs of its real shapes, and (3) returns values within tolerance of ONNX Runtime's CPU EP in fp32
(compared where the CPU's value is finite; a non-finite device value there is an overflow).

:func:`probe` runs the models in one child process (``python -m tvm_hetero.ep_offload.capability_probe``),
which writes one JSON line per answer as it goes; if the child dies, the model it was running is
answered "<vendor> crashed running it (signal N)" and a new child carries on after it. Guarantee:
every model gets an answer, and nothing the vendor does can take the caller down.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..errors import with_type

#: Relative tolerance of one op in fp16 (to the largest reference value).
OP_TOLERANCE = 1e-2
#: Tolerance of an op with an integer output (a QDQ unit's quantize), in quantization steps of that
#: output, whatever its width: a vendor requantizes in fixed point, ONNX Runtime's CPU in float.
#: Measured on the first vendor (its docs): its's stem conv units of QDQ ResNet-50 (per tensor and per channel) are within
#: 1 step of the CPU (mean 0.02) on the probe's uniform inputs and on calibrated data alike, so 4
#: leaves a margin and a unit beyond it computes something else.
QUANTIZED_OP_STEPS = 4
#: fp16's smallest normal number (2**-14): below it an fp16 value loses precision, below 2**-24 it is 0.
FP16_SMALLEST_NORMAL = float(np.finfo(np.float16).tiny)


def underflow_hint(largest: float) -> str:
    """Why an fp16 result is off when even the largest reference value (``largest``) is below fp16's
    normal range: the device computes zeros or a few bits where the CPU has values."""
    return (f"fp16 underflow: the CPU's values are at most {largest:.1e}, below fp16's smallest normal number "
            f"({FP16_SMALLEST_NORMAL:.1e}); scale the model's inputs or weights into fp16's range, or give it "
            "quantized (QDQ) with precision='quantized'")


def probe(models: list[bytes], options: dict, sdk: str, vendor: str = "the vendor",
          timeout: float = 600.0) -> list[tuple[bool, str]]:
    """``(accepted, reason)`` for each ONNX model, asked of the vendor (its SDK module ``sdk``) in
    child processes."""
    answers: list[tuple[bool, str] | None] = [None] * len(models)
    start = 0
    with tempfile.TemporaryDirectory(prefix="tvm_hetero_probe_") as tmp:
        work = Path(tmp)
        while start < len(models):
            (work / "job.pkl").write_bytes(pickle.dumps({"models": models, "start": start, "options": options,
                                                             "sdk": sdk, "vendor": vendor}))
            out = work / "answers.jsonl"
            out.unlink(missing_ok=True)
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            try:
                proc = subprocess.run([sys.executable, "-m", "tvm_hetero.ep_offload.capability_probe", str(work)],
                                      check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      timeout=timeout)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            done = 0
            if out.exists():
                for line in out.read_text().splitlines():
                    item = json.loads(line)
                    answers[item["index"]] = (bool(item["ok"]), str(item["reason"]))
                    done = max(done, item["index"] + 1)
            if done >= len(models) and code == 0:
                break
            crashed = max(done, start)
            if crashed < len(models) and answers[crashed] is None:
                why = f"timed out after {timeout:.0f} s" if code == "timeout" else f"signal {-code}" if isinstance(
                    code, int) and code < 0 else f"exit status {code}"
                answers[crashed] = (False, f"{vendor} crashed running it ({why})")
            start = crashed + 1
    return [a if a is not None else (False, "not probed") for a in answers]


def _index_bounds(model: bytes) -> dict[str, int]:
    """Per graph input that a Gather takes as its indices: the length of the axis it indexes (random
    indices beyond it would ask the vendor about an error, not the op)."""
    import onnx

    proto = onnx.shape_inference.infer_shapes(onnx.load_from_string(model))
    values = [*proto.graph.input, *proto.graph.value_info]  # a Gather may index a value the graph makes
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in values}
    dims.update({i.name: list(i.dims) for i in proto.graph.initializer})
    bounds = {}
    for node in proto.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        shape = dims.get(node.input[0])
        # a length ONNX's shape inference cannot tell (after an op it has no schema for): index 0 only
        length = shape[axis % len(shape)] if shape and shape[axis % len(shape)] > 0 else 1
        bounds[node.input[1]] = min(bounds.get(node.input[1], 1 << 30), length)
    return bounds


def _inputs(session, rng: np.random.Generator, index_bounds: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in spec.shape]
        kind = spec.type
        if "float" in kind:
            # Away from zero (a denominator near 0 would overflow fp16 and say nothing of the op) and
            # of both signs.
            values = rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.25, 2.0, size=shape)
            feeds[spec.name] = values.astype("float16" if "float16" in kind else "float32")
        elif "bool" in kind:
            feeds[spec.name] = rng.integers(0, 2, shape).astype(bool)
        elif "uint8" in kind:
            feeds[spec.name] = rng.integers(0, 256, shape).astype("uint8")
        elif "int8" in kind:
            feeds[spec.name] = rng.integers(-128, 128, shape).astype("int8")
        else:
            high = min(4, (index_bounds or {}).get(spec.name, 4))
            feeds[spec.name] = rng.integers(0, high, shape).astype("int64" if "int64" in kind else "int32")
    return {name: np.asarray(value) for name, value in feeds.items()}  # a 0-d draw is a numpy scalar


def sample_feeds(model: bytes, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of an ONNX model as the probe draws them (floats of both signs away from zero,
    a Gather's indices within the axis it indexes)."""
    from tvm_hetero.ep_offload import sdk as vendor_sdk

    return _inputs(vendor_sdk.cpu_session(model), np.random.default_rng(seed), _index_bounds(model))


def answer(model: bytes, options: dict, sdk: str, vendor: str = "the vendor") -> tuple[bool, str]:
    """One model's answer, in this process (the child's job)."""
    from tvm_hetero.ep_offload import sdk as vendor_sdk

    functions = vendor_sdk.load(sdk)
    ok, reason = functions.accepts(model, options)
    if not ok:
        return False, reason
    reference = vendor_sdk.cpu_session(model)
    feeds = _inputs(reference, np.random.default_rng(0), _index_bounds(model))
    expected = reference.run(None, feeds)
    got = functions.accelerator_session(model, options).run(None, feeds)
    for e, g in zip(expected, got):
        reason = judge(e, g, str(options.get("precision", "fp16")), vendor)
        if reason:
            return False, reason
    return True, ""


def judge(expected: np.ndarray, got: np.ndarray, precision: str = "fp16", vendor: str = "the vendor") -> str:
    """Why the vendor's output ``got`` is not the CPU's ``expected`` (an empty string when it is), on random
    inputs. An integer output (a QDQ unit's quantize) is judged in quantization steps only: at most
    :data:`QUANTIZED_OP_STEPS` apart, whatever its width and range. A float output is judged relative
    to the largest reference value (:data:`OP_TOLERANCE`); when even that is below fp16's normal
    range on an fp16 device, the reason is an underflow, with a hint."""
    integer = np.issubdtype(np.asarray(expected).dtype, np.integer)
    e, g = np.asarray(expected, "float64"), np.asarray(got, "float64")
    where = np.isfinite(e)
    if not where.any():
        return ""
    if not np.isfinite(g[where]).all():
        return f"{vendor} computes non-finite values where the CPU does not (fp16 overflow)"
    difference = float(np.abs(g[where] - e[where]).max())
    if integer:
        if difference <= QUANTIZED_OP_STEPS:
            return ""
        return (f"{vendor} computes it wrongly: {difference:.0f} quantization steps off the CPU (more than "
                f"{QUANTIZED_OP_STEPS}) on random inputs")
    scale = max(float(np.abs(e[where]).max()), 1e-30)
    error = difference / scale
    if error <= OP_TOLERANCE:
        return ""
    if scale < FP16_SMALLEST_NORMAL and precision == "fp16":
        return f"{underflow_hint(scale)} (relative error {error:.1e} against the CPU on random inputs)"
    return f"{vendor} computes it wrongly: relative error {error:.1e} against the CPU on random inputs"


def _child(work: Path) -> int:
    job = pickle.loads((work / "job.pkl").read_bytes())
    with open(work / "answers.jsonl", "a") as out:
        for index in range(job["start"], len(job["models"])):
            try:
                ok, reason = answer(job["models"][index], job["options"], job["sdk"], job["vendor"])
            except Exception as err:  # noqa: BLE001 (an error is an answer too)
                ok, reason = False, with_type(err)
            out.write(json.dumps({"index": index, "ok": ok, "reason": reason}) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(Path(sys.argv[1])))
