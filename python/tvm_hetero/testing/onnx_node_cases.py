"""ONNX node-test parity: ONNX's single-op backend test cases through the Relax VM and through us.

The ONNX wheel regenerates its node tests (a model of one op, its inputs and expected outputs)
with ``onnx.backend.test.case.node.collect_testcases``. For each case:

1. import the model with ``from_onnx(model, keep_params_in_input=False)``;
2. :func:`run_case_vm`: ``tvm.compile`` for LLVM, run in the Relax VM, compare with the expected
   outputs;
3. :func:`run_case_ours`: ``tvm_hetero.build`` for two CPU devices with a given placement, run the
   artifact's runtime, compare the same way.

A case the VM fails says nothing about tvm-hetero (the frontend or TVM lacks the op); a case the
VM passes and ours fails is a tvm-hetero bug or limitation. :func:`sweep` runs both placements
(all on device 0, and :func:`random_placement`) for every case the VM passes. Each stage runs
under a time budget with its exceptions caught, so no single case stops a sweep; cases with huge
inputs are skipped.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The two devices every case is built for.
TARGETS = (("cpu:0", "llvm"), ("cpu:1", "llvm"))
#: Cases whose inputs hold more bytes than this are skipped.
MAX_INPUT_BYTES = 16 << 20
#: Seconds one stage (VM, or one build and run of ours) may take.
STAGE_BUDGET_S = 60.0
#: Tolerances at least this loose (the case's own may be looser).
RTOL, ATOL = 1e-3, 1e-5

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class NodeCase:
    """One ONNX node test: a single-op model and its (inputs, expected outputs) data sets."""

    name: str
    model: Any  # onnx.ModelProto
    data_sets: list[tuple[list[Any], list[Any]]]
    rtol: float
    atol: float
    _module: Any = field(default=None, repr=False)

    @property
    def ops(self) -> list[str]:
        """The ONNX op types of the model's nodes."""
        return [node.op_type for node in self.model.graph.node]

    def input_bytes(self) -> int:
        return sum(x.nbytes for inputs, _ in self.data_sets for x in inputs if isinstance(x, np.ndarray))

    def relax_module(self):
        """The model imported by TVM's ONNX frontend (imported once, then cached)."""
        if self._module is None:
            from ..importers import from_onnx

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._module = from_onnx(self.model)
        return self._module


@dataclass
class CaseResult:
    """The outcome of one case in one stage: passed, failed or skipped, with a one-line reason."""

    name: str
    status: str
    reason: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def __str__(self) -> str:
        return f"{self.name}: {self.status}" + (f" ({self.reason})" if self.reason else "")


@dataclass
class CaseOutcome:
    """A case through the VM and, if the VM passed it, through ours with both placements."""

    name: str
    vm: CaseResult
    device0: CaseResult | None = None
    random_split: CaseResult | None = None

    def to_dict(self) -> dict:
        return {
            key: (value.__dict__ if isinstance(value, CaseResult) else value)
            for key, value in self.__dict__.items()
        }

    @staticmethod
    def from_dict(data: dict) -> CaseOutcome:
        def result(value: dict | None) -> CaseResult | None:
            return None if value is None else CaseResult(**value)

        return CaseOutcome(
            data["name"], result(data["vm"]), result(data["device0"]), result(data["random_split"])
        )


@dataclass
class SweepSummary:
    """Counts over many cases, and every case the VM passes but ours fails."""

    outcomes: list[CaseOutcome]

    @property
    def total(self) -> int:
        return len(self.outcomes)

    def vm_passed(self) -> list[str]:
        return [o.name for o in self.outcomes if o.vm.passed]

    def skipped(self) -> list[CaseResult]:
        return [o.vm for o in self.outcomes if o.vm.status == SKIPPED]

    def ours_passed(self, placement: str) -> list[str]:
        """Cases ours passes with ``placement``: ``"device0"`` or ``"random_split"``."""
        return [
            o.name
            for o in self.outcomes
            if getattr(o, placement) is not None and getattr(o, placement).passed
        ]

    def regressions(self) -> list[tuple[str, str, str]]:
        """``(case, placement, reason)`` for each case the VM passes and ours fails."""
        found = []
        for o in self.outcomes:
            for placement in ("device0", "random_split"):
                result = getattr(o, placement)
                if o.vm.passed and result is not None and not result.passed:
                    found.append((o.name, placement, result.reason))
        return found

    def counts(self) -> dict[str, int]:
        return {
            "cases": self.total,
            "skipped": len(self.skipped()),
            "vm_passed": len(self.vm_passed()),
            "ours_device0_passed": len(self.ours_passed("device0")),
            "ours_random_split_passed": len(self.ours_passed("random_split")),
        }

    def __str__(self) -> str:
        c = self.counts()
        lines = [
            f"ONNX node tests: {c['cases']} cases ({c['skipped']} skipped for huge inputs)",
            f"  Relax VM passes:                  {c['vm_passed']}",
            f"  ours passes, all on device 0:     {c['ours_device0_passed']}",
            f"  ours passes, random 2-way split:  {c['ours_random_split_passed']}",
        ]
        regressions = self.regressions()
        lines.append(f"  VM passes but ours fails: {len(regressions)}")
        lines.extend(f"    {name} [{placement}]: {reason}" for name, placement, reason in regressions)
        return "\n".join(lines)


# ---- cases ----------------------------------------------------------------------------------
def iter_cases(names: Iterable[str] | None = None) -> Iterator[NodeCase]:
    """The ONNX node test cases, sorted by name; only those in ``names`` if given.

    Raises KeyError if a requested name is no node test case.
    """
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = {c.name: c for c in collect_testcases(None) if c.model is not None and c.data_sets}
    wanted = sorted(cases) if names is None else sorted(set(names))
    missing = [n for n in wanted if n not in cases]
    if missing:
        raise KeyError(f"no ONNX node test case named {', '.join(missing)}")
    for name in wanted:
        c = cases[name]
        data = [
            ([_as_array(x) for x in inputs], [_as_array(y) for y in outputs])
            for inputs, outputs in c.data_sets
        ]
        yield NodeCase(name, c.model, data, float(c.rtol), float(c.atol))


def _as_array(value: Any) -> Any:
    """Numpy scalars and TensorProtos (the cast tests' float8/int4 data) as arrays; else as is."""
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value) if isinstance(value, np.generic) else value


def random_placement(case_name: str) -> Callable[[Any], int]:
    """A seeded two-device placement: op ``i`` of ``case_name`` goes to a pseudo-random 0 or 1.

    The seed is a CRC of the case name and op index, so it is the same in every process.
    """

    def place(info: Any) -> int:
        return random.Random(zlib.crc32(f"{case_name}:{info.index}".encode())).randint(0, 1)

    place.__name__ = f"random_placement({case_name})"
    return place


# ---- running --------------------------------------------------------------------------------
def run_case_vm(case: NodeCase, budget_s: float = STAGE_BUDGET_S) -> CaseResult:
    """Import, compile for LLVM, run in the Relax VM and compare with the expected outputs."""

    def run() -> None:
        import tvm
        from tvm import relax

        mod = _stage("import", case.relax_module)
        _check_arity(mod, case)
        exe = _stage("compile", lambda: tvm.compile(mod, "llvm"))
        vm = relax.VirtualMachine(exe, tvm.cpu(0))
        for inputs, expected in case.data_sets:
            args = [tvm.runtime.tensor(x, tvm.cpu(0)) for x in inputs]
            got = _stage("run", lambda a=args: _flatten_outputs(vm["main"](*a)))
            _check(expected, got, case)

    return _guarded(case, run, budget_s)


def run_case_ours(case: NodeCase, placement: Any, budget_s: float = STAGE_BUDGET_S) -> CaseResult:
    """``tvm_hetero.build`` for two CPU devices with ``placement``, run, compare with the expected."""

    def run() -> None:
        import tvm_hetero

        mod = _stage("import", case.relax_module)
        _check_arity(mod, case)
        art = _stage("build", lambda: tvm_hetero.build(mod, list(TARGETS), placement=placement))
        rt = _stage("create", art.create)
        if len(art.input_names) != len(case.data_sets[0][0]):
            raise _Failure(
                f"artifact has inputs {art.input_names}, the case gives {len(case.data_sets[0][0])}"
            )
        for inputs, expected in case.data_sets:

            def execute(values: list[Any] = inputs) -> list[np.ndarray]:
                for name, value in zip(art.input_names, values):
                    rt.set_input(name, value)
                rt.run()
                return [rt.get_output(i).numpy() for i in range(rt.get_num_outputs())]

            got = _stage("run", execute)
            _check(expected, got, case)

    return _guarded(case, run, budget_s)


def run_case(case: NodeCase, budget_s: float = STAGE_BUDGET_S) -> CaseOutcome:
    """The VM, then (if the VM passes) ours all on device 0 and ours with a random split."""
    vm = run_case_vm(case, budget_s)
    if not vm.passed:
        return CaseOutcome(case.name, vm)
    return CaseOutcome(
        case.name,
        vm,
        run_case_ours(case, None, budget_s),
        run_case_ours(case, random_placement(case.name), budget_s),
    )


def sweep(cases: Iterable[NodeCase], progress: Callable[[CaseOutcome], None] | None = None) -> SweepSummary:
    """:func:`run_case` for every case; ``progress`` is called with each outcome."""
    outcomes = []
    for case in cases:
        outcome = run_case(case)
        outcomes.append(outcome)
        if progress is not None:
            progress(outcome)
    return SweepSummary(outcomes)


# ---- comparison -----------------------------------------------------------------------------
def compare_outputs(expected: list[Any], got: list[np.ndarray], rtol: float, atol: float) -> str | None:
    """None if ``got`` matches ``expected``, else a one-line reason.

    Shapes and dtypes must match exactly; floating values within ``rtol``/``atol`` (NaN equals
    NaN), booleans, integers and strings exactly.
    """
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (want, have) in enumerate(zip(expected, got)):
        want, have = np.asarray(want), np.asarray(have)
        if have.shape != want.shape:
            return f"output {i}: shape {have.shape}, expected {want.shape}"
        if have.dtype != want.dtype:
            return f"output {i}: dtype {have.dtype}, expected {want.dtype}"
        if want.dtype.kind in "biuOSU":
            bad = ~(have == want)
        else:  # float, complex and the ml_dtypes types (bfloat16, float8...)
            wide = np.complex128 if want.dtype.kind == "c" else np.float64
            w, h = want.astype(wide), have.astype(wide)
            bad = ~np.isclose(h, w, rtol=rtol, atol=atol, equal_nan=True)
        if np.any(bad):
            detail = ""
            if want.dtype.kind not in "bOSU":
                err = np.abs(have.astype(np.float64) - want.astype(np.float64))
                detail = f", max abs error {np.nanmax(np.where(bad, err, 0)):.3g}"
            return f"output {i}: {int(np.sum(bad))} of {want.size} values differ{detail}"
    return None


# ---- helpers --------------------------------------------------------------------------------
class _Failure(Exception):
    """A case failed for a reason already worded for the report."""


class _Timeout(Exception):
    pass


def _guarded(case: NodeCase, run: Callable[[], None], budget_s: float) -> CaseResult:
    start = time.perf_counter()
    unsupported = _unsupported_io(case)
    if unsupported:
        return CaseResult(case.name, FAILED, unsupported)
    if case.input_bytes() > MAX_INPUT_BYTES:
        return CaseResult(case.name, SKIPPED, f"inputs of {case.input_bytes() >> 20} MiB")
    try:
        with _time_limit(budget_s), np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run()
    except _Failure as err:
        return CaseResult(case.name, FAILED, str(err), time.perf_counter() - start)
    except _Timeout:
        return CaseResult(
            case.name, FAILED, f"over the time budget of {budget_s:.0f} s", time.perf_counter() - start
        )
    except Exception as err:  # noqa: BLE001 (one case never stops a sweep)
        return CaseResult(case.name, FAILED, _one_line(err), time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if seconds > budget_s:
        return CaseResult(case.name, FAILED, f"over the time budget of {budget_s:.0f} s", seconds)
    return CaseResult(case.name, PASSED, "", seconds)


def _stage(what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (_Failure, _Timeout):
        raise
    except Exception as err:
        raise _Failure(f"{what}: {_one_line(err)}") from err


def _check(expected: list[Any], got: list[np.ndarray], case: NodeCase) -> None:
    reason = compare_outputs(expected, got, max(case.rtol, RTOL), max(case.atol, ATOL))
    if reason:
        raise _Failure(f"mismatch: {reason}")


def _check_arity(mod: Any, case: NodeCase) -> None:
    params = mod["main"].params
    given = len(case.data_sets[0][0])
    if len(params) != given:
        raise _Failure(f"import: main takes {len(params)} inputs, the case gives {given}")


def _unsupported_io(case: NodeCase) -> str | None:
    """Why the case's data cannot be compared tensor by tensor (sequences, optionals, maps)."""
    for inputs, outputs in case.data_sets:
        for kind, values in (("input", inputs), ("output", outputs)):
            for i, value in enumerate(values):
                if not isinstance(value, np.ndarray):
                    return f"{kind} {i} is a {type(value).__name__}, not a tensor (sequence/optional)"
    return None


def _flatten_outputs(value: Any) -> list[np.ndarray]:
    import tvm

    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return [x for v in value for x in _flatten_outputs(v)]
    raise _Failure(f"run: the VM returned a {type(value).__name__}, not tensors")


def _one_line(err: BaseException) -> str:
    """The most telling line of an error message, at most 200 characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    if not line.startswith(type(err).__name__):
        line = f"{type(err).__name__}: {line}"
    return line[:200]


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise _Timeout in the main thread after ``seconds`` (checked when Python code runs again).

    A kernel stuck in C++ is not interrupted; :func:`_guarded` still fails a stage that took too
    long after it returns. Off the main thread there is no alarm, only that check.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
