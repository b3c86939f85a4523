"""Moving back the fewest ops: which steps of a device graph that failed verification go to the CPU.

A region (one vendor graph) is a chain of steps (a block's composites, each one or a few Relax ops).
When it fails verification (:mod:`.verified_build`), this module says which of its steps to move
back, so that the device keeps as much of the region as the tolerance allows.

Attribution (one CPU run and one vendor call per failing region): the region's ONNX graph runs on
ONNX Runtime's CPU EP in fp32 with every intermediate value as an output (the reference). Then the
device runs one graph that holds the region twice:

- *chained*: the region as it is, every intermediate an output: each step's **inherited** error, what
  it computes from the device's own values before it;
- *cut*: the same nodes with every edge between two steps cut, each step reading the CPU's reference
  values of the steps before it as graph inputs: each step's **own** error, apart from what it
  inherits (an fp16 overflow or underflow in a norm, a softmax over large logits, a sum of many
  large values).

Errors are relative to the largest reference value of the same tensor, as verification measures a
region. Choice, per failing region and round:

1. **Culprits.** Every step whose own error exceeds the tolerance, or that yields non-finite values
   where the CPU does not: alone it fails whatever else the device keeps. All move back at once.
2. **Error that builds up.** No step fails alone: the region fails on rounding carried through many
   steps. Among the steps up to the first whose inherited error passes the tolerance (all steps when
   none does: with every value an output the vendor may fuse and round less than in the graph),
   those without conv/matmul work (ONNX's Conv, ConvTranspose, MatMul, Gemm) are preferred, so that
   the device keeps its FLOPs; the ``2 ** (attempt - 1)`` of them with the largest own errors move back (``attempt`` counts this build's rounds of this kind, so a
   long chain is cut in a few rounds, not one step per round). Moving a step back splits the graph
   there, and each part is verified afresh on its own inputs.

Guarantee: :func:`attribute` returns None when it cannot tell (the vendor will not run the combined
graph); otherwise :func:`choose` names at least one step of the region still on the device, so each
round moves at least one op back and the build's loop ends. The caller (:mod:`.verified_build`) caps the rounds and then
moves a still-failing region back whole, so the artifact it returns has every region verified.
What is *not* guaranteed: the fewest ops in the sense of an optimum (the choice is greedy, one
attribution per round), and the end-to-end error of the whole model (each graph is verified on the
CPU's values of its inputs, as before).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .onnx_regions import step_of_node
from .sdk import cpu_session
from .vendor_process import vendor_call

#: ONNX ops whose work is what "conv/matmul FLOPs on the device" counts.
FLOP_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "QLinearConv", "QLinearMatMul"})
#: Names given to the cut copy of the region (its nodes' outputs and the CPU values it reads).
_CUT, _REFERENCE = "cut__", "ref__"


@dataclass
class StepError:
    """One step of a failing region: its ONNX ops and its errors on the device."""

    step: int
    ops: list[str]
    #: Relative error of the step fed the CPU's values of its inputs (its own).
    own: float
    #: Relative error of the step in the device's own chain (what it inherits and adds).
    inherited: float
    #: Whether the step's own values are finite where the CPU's are.
    finite: bool = True

    @property
    def has_flops(self) -> bool:
        return any(op in FLOP_OPS for op in self.ops)


@dataclass
class Choice:
    """The steps to move back, each with its reason."""

    steps: list[int]
    reasons: dict[int, str] = field(default_factory=dict)
    #: "culprits" or "build-up" (which rule chose them).
    rule: str = ""


def attribute(region: str, model: bytes | None, feeds: dict | None, offload: Any) -> list[StepError] | None:
    """Each step's own and inherited error on the device (see the module), in step order; None when
    it cannot be told (no model or inputs, or the vendor will not run the combined graph). ``offload``:
    the build report's section (its vendor SDK, process and options)."""
    if model is None or not feeds:
        return None
    try:
        import onnx

        proto = onnx.shape_inference.infer_shapes(onnx.load_from_string(model))
        reference_model, produced = _with_outputs(proto)
        reference = dict(zip(produced, cpu_session(reference_model).run(produced, feeds)))
        combined, references = _chained_and_cut(proto, produced, reference)
        names = produced + [_CUT + name for name in produced]
        values = vendor_call(offload.sdk, offload.process, offload.options,
                             "accelerator_outputs", region, combined, {**feeds, **references}, names)
    except Exception:  # noqa: BLE001 (a graph the vendor will not take with extra inputs and outputs: no attribution)
        return None
    device = dict(zip(names, values))
    by_step: dict[int, StepError] = {}
    for node in proto.graph.node:
        step = step_of_node(node.name)
        if step is None:
            continue
        entry = by_step.setdefault(step, StepError(step, [], 0.0, 0.0))
        entry.ops.append(node.op_type)
        for out in node.output:
            if out not in reference:
                continue
            own, finite = _relative_error(reference[out], device[_CUT + out])
            inherited, _ = _relative_error(reference[out], device[out])
            entry.own, entry.inherited = max(entry.own, own), max(entry.inherited, inherited)
            entry.finite = entry.finite and finite
    return [by_step[s] for s in sorted(by_step)]


def choose(errors: list[StepError], tolerance: float, attempt: int, movable: set[int]) -> Choice:
    """The steps to move back (see the module's rules); ``attempt`` counts the build's rounds that
    used the build-up rule (1 for the first); ``movable`` are the steps with ops still on the device.
    Names at least one step when any step is movable."""
    candidates = [e for e in errors if e.step in movable]
    culprits = [e for e in candidates if not e.finite or e.own > tolerance]
    if culprits:
        return Choice([e.step for e in culprits], {e.step: (
            f"verification: its own error on the device (fed the CPU's inputs) is "
            f"{'non-finite (fp16 overflow)' if not e.finite else f'{e.own:.2e}'} > {tolerance:g}")
            for e in culprits}, "culprits")
    if not candidates:
        return Choice([])
    # With every value an output the vendor may fuse less and round less: no step's value may pass the
    # tolerance even where the graph does. Then the whole chain is the candidate.
    crossing = next((e for e in errors if e.inherited > tolerance), None)
    prefix = [e for e in candidates if crossing is None or e.step <= crossing.step] or candidates
    where = (f"step {crossing.step} inherits {crossing.inherited:.2e} > {tolerance:g}" if crossing else
             f"no step's value passes {tolerance:g} with every value an output; any step a candidate")
    without_flops = [e for e in prefix if not e.has_flops]
    pool = sorted(without_flops or prefix, key=lambda e: e.own, reverse=True)
    taken = pool[:2 ** max(attempt - 1, 0)]
    return Choice([e.step for e in taken], {e.step: (
        f"verification: error builds up across the graph ({where}); its own error {e.own:.2e} is the largest "
        f"{'of the steps without conv/matmul work ' if without_flops else ''}before that")
        for e in taken}, "build-up")


def _relative_error(expected: np.ndarray, got: np.ndarray) -> tuple[float, bool]:
    """(largest |got - expected| over largest |expected|, where the CPU's value is finite; whether the
    device's values are finite there)."""
    expected, got = np.asarray(expected), np.asarray(got)
    where = np.isfinite(expected) if expected.dtype.kind == "f" else np.ones(expected.shape, bool)
    if not where.any():
        return 0.0, True
    finite = bool(np.isfinite(got[where]).all()) if got.dtype.kind == "f" else True
    diff = np.abs(got[where].astype("float64") - expected[where].astype("float64"))
    if not np.isfinite(diff).all():
        return float("inf"), finite
    scale = max(float(np.abs(expected[where]).max()), 1e-30)
    return float(diff.max()) / scale, finite


def _with_outputs(proto: Any) -> tuple[bytes, list[str]]:
    """``proto`` (shapes inferred) with every intermediate value of known type as a graph output;
    and the names of its outputs."""
    from onnx import ModelProto

    model = ModelProto()
    model.CopyFrom(proto)
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(info for info in proto.graph.value_info if info.name not in known)
    return model.SerializeToString(), [o.name for o in model.graph.output]


def _chained_and_cut(proto: Any, produced: list[str], reference: dict[str, np.ndarray]) -> tuple[bytes, dict]:
    """One model holding the region chained (every intermediate an output) and cut at every step
    boundary (names prefixed :data:`_CUT`; each edge between two steps read from a graph input
    prefixed :data:`_REFERENCE`, fed the CPU's value); and those inputs' values."""
    from onnx import ModelProto, NodeProto, helper

    step_of = {out: step_of_node(node.name) for node in proto.graph.node for out in node.output if out}
    model = ModelProto()
    model.CopyFrom(proto)
    references: dict[str, np.ndarray] = {}
    for node in proto.graph.node:
        cut = NodeProto()
        cut.CopyFrom(node)
        cut.name = _CUT + node.name
        here = step_of_node(node.name)
        for i, name in enumerate(node.input):
            if name not in step_of:
                continue  # a graph input or a weight: the same in both copies
            if step_of[name] != here or here is None:
                cut.input[i] = _REFERENCE + name
                references[_REFERENCE + name] = np.ascontiguousarray(reference[name])
            else:
                cut.input[i] = _CUT + name
        for i, name in enumerate(node.output):
            if name:
                cut.output[i] = _CUT + name
        model.graph.node.append(cut)
    for name, value in references.items():
        model.graph.input.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
    del model.graph.output[:]
    for prefix in ("", _CUT):
        model.graph.output.extend(helper.make_tensor_value_info(
            prefix + name, helper.np_dtype_to_tensor_dtype(reference[name].dtype), list(reference[name].shape))
            for name in produced)
    return model.SerializeToString(), references
