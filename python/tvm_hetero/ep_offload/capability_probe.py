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
import tempfile
from pathlib import Path

import numpy as np

from ..errors import with_type
from ..sample_inputs import onnx_index_bounds, sample_values
from .child_process import ChildFailed, run_once, serve_once

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
    child processes (:func:`.child_process.run_once`); the child writes each answer to a file as it
    goes, so a child that dies leaves the answers it gave."""
    answers: list[tuple[bool, str] | None] = [None] * len(models)
    start = 0
    with tempfile.TemporaryDirectory(prefix="tvm_hetero_probe_") as tmp:
        out = Path(tmp) / "answers.jsonl"
        while start < len(models):
            out.unlink(missing_ok=True)
            failed = None
            try:
                run_once("tvm_hetero.ep_offload.capability_probe",
                         {"models": models, "start": start, "options": options, "sdk": sdk, "vendor": vendor,
                          "answers": str(out)}, f"probing {vendor}'s ops", timeout)
            except ChildFailed as err:
                failed = err
            done = 0
            if out.exists():
                for line in out.read_text().splitlines():
                    item = json.loads(line)
                    answers[item["index"]] = (bool(item["ok"]), str(item["reason"]))
                    done = max(done, item["index"] + 1)
            if done >= len(models) and failed is None:
                break
            crashed = max(done, start)
            if crashed < len(models) and answers[crashed] is None:
                why = failed.ended or str(failed) if failed is not None else "it stopped without an answer"
                answers[crashed] = (False, f"{vendor} crashed running it ({why})")
            start = crashed + 1
    return [a if a is not None else (False, "not probed") for a in answers]


#: Integer inputs other than a Gather's indices are drawn below this.
INDEX_BOUND = 4


def _inputs(session, seed: int, index_bounds: dict[str, int]) -> dict[str, np.ndarray]:
    """The probe's inputs of a session's model: floats of both signs away from zero, indices below
    ``INDEX_BOUND`` and within the axis a Gather indexes."""
    specs = [(spec.name, [d if isinstance(d, int) else 1 for d in spec.shape], _numpy_dtype(spec.type))
             for spec in session.get_inputs()]
    bounds = {name: min(INDEX_BOUND, bound) for name, bound in index_bounds.items()}
    return sample_values(specs, seed, floats="away_from_zero", index_bounds=bounds, default_bound=INDEX_BOUND)


def _numpy_dtype(onnxruntime_type: str) -> str:
    """``tensor(float)`` -> ``float32``: ONNX Runtime's name of an input's type, as numpy's."""
    name = onnxruntime_type.removeprefix("tensor(").removesuffix(")")
    return {"float": "float32", "double": "float64"}.get(name, name)


def sample_feeds(model: bytes, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of an ONNX model as the probe draws them (floats of both signs away from zero,
    a Gather's indices within the axis it indexes)."""
    from tvm_hetero.ep_offload import sdk as vendor_sdk

    return _inputs(vendor_sdk.cpu_session(model), seed, onnx_index_bounds(model))


def answer(model: bytes, options: dict, sdk: str, vendor: str = "the vendor") -> tuple[bool, str]:
    """One model's answer, in this process (the child's job)."""
    from tvm_hetero.ep_offload import sdk as vendor_sdk

    functions = vendor_sdk.load(sdk)
    ok, reason = functions.accepts(model, options)
    if not ok:
        return False, reason
    reference = vendor_sdk.cpu_session(model)
    feeds = _inputs(reference, 0, onnx_index_bounds(model))
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


def _child(job: dict) -> int:
    """The child's job: answer the models from ``job["start"]`` on, one JSON line each as it goes."""
    with open(job["answers"], "a") as out:
        for index in range(job["start"], len(job["models"])):
            try:
                ok, reason = answer(job["models"][index], job["options"], job["sdk"], job["vendor"])
            except Exception as err:  # noqa: BLE001 (an error is an answer too)
                ok, reason = False, with_type(err)
            out.write(json.dumps({"index": index, "ok": ok, "reason": reason}) + "\n")
            out.flush()
    return len(job["models"]) - job["start"]


if __name__ == "__main__":
    raise SystemExit(serve_once(_child))
