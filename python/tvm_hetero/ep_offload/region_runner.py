"""Running accelerator regions: the function the graph runtime calls for a region a vendor runs.

The kernel library's ``tvm_hetero_ep_regions`` module (src/backends/onnx_ep/ep_region_module.cc)
asks the global ``tvm_hetero.ep_regions.make_region_runner`` registered here for each region it
serves. A runner opens the region's compiled model (finalized at build, so no finalization happens
here) through its vendor's SDK once, at its first call on the device's executor thread, and each
call binds the runtime's own buffers to the graph's inputs and output in place (``IOBinding`` on raw
pointers: no copy in or out) and executes the graph once. The runtime calls it from the device's
executor thread; the GIL is released around ONNX Runtime's execution, so host executors keep
running meanwhile.

Verification (:func:`verifying`): while active, every runner also runs its region's plain ONNX
model on ONNX Runtime's CPU EP in fp32 on the same inputs, records the device's error against it,
and passes the CPU result on, so that a bad region does not spoil the regions after it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm_ffi

from . import region_quantization
from . import sdk as vendor_sdk
from .sdk import cpu_session
from .vendor_process import process_for, vendor_call


@dataclass
class RegionCheck:
    """One region's result under verification: the device's error against the CPU reference."""

    region: str
    ops: int
    max_abs_error: float = 0.0
    reference_scale: float = 0.0
    finite: bool = True
    calls: int = 0
    #: The inputs of its last call, by graph input name (to localize a bad step).
    feeds: dict = field(default_factory=dict, repr=False)
    #: Device cycles of one execution (the vendor's profile), when profiled.
    cycles: float = float("nan")

    @property
    def relative_error(self) -> float:
        return self.max_abs_error / max(self.reference_scale, 1e-30)


@dataclass
class _Verification:
    references: dict[str, bytes]
    profile: bool = False
    results: dict[str, RegionCheck] = field(default_factory=dict)
    sessions: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_verification: _Verification | None = None
#: Test hook: region names whose next execution raises (a device failure mid-run).
FAIL_NEXT: set[str] = set()


@contextlib.contextmanager
def verifying(references: dict[str, bytes], profile: bool = False) -> Iterator[dict[str, RegionCheck]]:
    """Runners created or called meanwhile check their region against ``references`` (region name ->
    plain ONNX model); yields the results by region name. ``profile``: also count each region's
    device cycles once (the vendor's profile), for the modeled latency."""
    global _verification
    state = _Verification(references, profile)
    _verification = state
    try:
        yield state.results
    finally:
        _verification = None


class RegionRunner:
    """One region's vendor graph, bound to the runtime's buffers at each call."""

    def __init__(self, name: str, model: bytes, meta: dict) -> None:
        self.name = name
        self.meta = meta
        self.inputs: list[int] = [int(p) for p in meta["inputs"]]
        self.output_position = int(meta["num_args"]) - 1
        self.output_name = str(meta["output"])
        self.model = model
        #: The vendor's SDK module, and what errors call the device.
        self.sdk = str(meta["sdk"])
        self.label = f"{meta.get('label', 'accelerator')} region {name}"
        # Opened at the first call, on the thread that runs the region (the device's executor): the
        # threads the vendor starts then inherit that executor's cores (device_options), so an
        # emulated NPU keeps to its own cores as on a phone, where it is a processor of its own.
        self.session: Any = None
        self.executions = 0

    def __call__(self, *args: Any) -> None:
        if len(args) != self.output_position + 1:
            raise ValueError(f"{self.label}: called with {len(args)} tensors, expected "
                             f"{self.output_position + 1}")
        if self.name in FAIL_NEXT:
            FAIL_NEXT.discard(self.name)
            raise RuntimeError(f"{self.label}: graph execution failed (injected failure)")
        out = args[self.output_position]
        if self.meta.get("calibration_only"):  # a calibration build's plain model (region_quantization.py)
            self._run_for_calibration(args, out)
            return
        if self.meta.get("process") == "separate":
            self._run_in_device_process(args, out)
            return
        if self.session is None:
            self.session = vendor_sdk.load(self.sdk).accelerator_session(self.model, self.meta["options"])
        binding = self.session.io_binding()
        for position in self.inputs:
            t = args[position]
            binding.bind_input(f"in{position}", "cpu", 0, _np_dtype(t), tuple(t.shape), t.data_ptr())
        binding.bind_output(self.output_name, "cpu", 0, _np_dtype(out), tuple(out.shape), out.data_ptr())
        try:
            self.session.run_with_iobinding(binding)
        except Exception as err:  # noqa: BLE001 (ONNX Runtime's own error types)
            raise RuntimeError(f"{self.label}: graph execution failed: {err}") from None
        self.executions += 1
        if _verification is not None:
            self._check(args, _verification)

    def _run_for_calibration(self, args: tuple, out: Any) -> None:
        """The plain fp32 model on ONNX Runtime's CPU EP; its inputs recorded for quantization."""
        if self.session is None:
            self.session = cpu_session(self.model)
        feeds = {f"in{p}": _host_view(args[p]).copy() for p in self.inputs}
        np.copyto(_host_view(out), self.session.run([self.output_name], feeds)[0])
        region_quantization.record(self.model, feeds)

    def _run_in_device_process(self, args: tuple, out: Any) -> None:
        """One round trip to the device's own process, the data inside."""
        feeds = {f"in{p}": _host_view(args[p]).copy() for p in self.inputs}
        result = process_for(self.sdk, self.meta["options"]).run(self.name, self.model, feeds, self.output_name,
                                                                  self.label)
        np.copyto(_host_view(out), result)
        self.executions += 1
        if _verification is not None:
            self._check(args, _verification)

    def _check(self, args: tuple, state: _Verification) -> None:
        reference = state.references.get(self.name)
        if reference is None:
            return
        with state.lock:
            session = state.sessions.get(self.name)
            if session is None:
                session = state.sessions[self.name] = cpu_session(reference)
        feeds = {f"in{p}": _host_view(args[p]).copy() for p in self.inputs}
        expected = session.run([self.output_name], feeds)[0]
        got = _host_view(args[self.output_position])
        check = state.results.setdefault(self.name, RegionCheck(self.name, int(self.meta.get("ops", 0))))
        check.calls += 1
        check.feeds = feeds
        if state.profile and check.calls == 1:
            check.cycles, _us = vendor_call(self.sdk, self.meta.get("process", "same"), self.meta["options"],
                                            "profiled_cycles", self.name, self.model, feeds)
        # Compared where the CPU's value is finite (NaN from an op's domain is the model's, not the
        # device's); a non-finite device value there is an overflow.
        where = np.isfinite(expected)
        check.finite = check.finite and bool(np.isfinite(got[where]).all())
        if where.any():
            diff = np.abs(got[where].astype("float64") - expected[where].astype("float64"))
            diff = np.where(np.isfinite(diff), diff, np.inf)
            check.max_abs_error = max(check.max_abs_error, float(diff.max()))
            check.reference_scale = max(check.reference_scale, float(np.abs(expected[where]).max()))
        np.copyto(got, expected)  # the regions after it see the CPU's values


def _np_dtype(tensor: Any) -> np.dtype:
    return np.dtype(str(tensor.dtype))


def _host_view(tensor: Any) -> np.ndarray:
    """A numpy view of a runtime buffer in host memory (the runtime passes non-owning views, which
    DLPack cannot export)."""
    dtype = _np_dtype(tensor)
    shape = tuple(int(d) for d in tensor.shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(tensor.data_ptr())
    return np.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)


def make_region_runner(name: str, model: bytes, meta_json: str) -> Any:
    """The global the ``tvm_hetero_ep_regions`` module calls: a packed function running region ``name``."""
    runner = RegionRunner(str(name), bytes(model), json.loads(str(meta_json)))
    return tvm_ffi.convert(runner)


tvm_ffi.register_global_func("tvm_hetero.ep_regions.make_region_runner", make_region_runner, override=True)
