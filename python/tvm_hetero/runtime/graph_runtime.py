"""Python API of the heterogeneous graph runtime, mirroring TVM's GraphModule."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
import tvm_ffi

import tvm_hetero.native  # noqa: F401  (registers tvm_hetero.graph_runtime.create)

from ..devices import is_remote, name_of
from ..toolchain import host_architecture
from .offload import create_mixed

if TYPE_CHECKING:
    from typing_extensions import Self

DEVICE_INDEX_KINDS = ("position", "device_type")


def _as_device_list(devices: tvm.runtime.Device | Sequence[tvm.runtime.Device]) -> list[tvm.runtime.Device]:
    if isinstance(devices, tvm.runtime.Device):
        return [devices]
    devices = list(devices)
    if not devices:
        raise ValueError("devices: at least one device is needed")
    for i, dev in enumerate(devices):
        if not isinstance(dev, tvm.runtime.Device):
            raise TypeError(f"devices[{i}] is {type(dev).__name__}, not a tvm.runtime.Device")
    return devices


OFFLOAD_MODES = ("group", "per_op")
EXECUTION_MODES = ("concurrent", "serial")


def as_tensor(value: Any, what: str, device: tvm.runtime.Device | None = None) -> tvm.runtime.Tensor:
    """``value`` as a contiguous TVM tensor (the one input conversion of every runtime API).

    A TVM tensor is kept (copied to ``device`` when that is remote and the tensor is not); anything
    array-like is copied into a new tensor on ``device`` (default cpu:0). 0-d stays 0-d.
    """
    if isinstance(value, tvm.runtime.Tensor):
        if device is not None and is_remote(device) and not is_remote(value.device):
            return tvm.runtime.tensor(value.numpy(), device)
        return value
    try:
        array = np.asarray(value, order="C")  # keeps 0-d arrays 0-d (ascontiguousarray would not)
    except Exception as err:
        raise TypeError(f"{what}: cannot convert {type(value).__name__} to a tensor") from err
    if array.dtype == object:
        raise TypeError(f"{what}: cannot convert {type(value).__name__} to a tensor")
    return tvm.runtime.tensor(array, device if device is not None else tvm.cpu(0))


def create(
    graph_json: str,
    lib: tvm.runtime.Module,
    devices: tvm.runtime.Device | Sequence[tvm.runtime.Device],
    device_index_kind: str = "position",
    offload: str = "group",
    remote_timeout: float | None = None,
    remote_library: Any = None,
    execution: str = "concurrent",
    device_options: Sequence[dict | None] | None = None,
    device_libs: Mapping[int, Any] | None = None,
    params: Mapping[str, Any] | bytes | bytearray | None = None,
) -> GraphModule:
    """Create a runtime for ``graph_json`` (docs/graph-format.md), with its parameters bound.

    Parameters
    ----------
    graph_json : the graph.
    lib : the kernel library (``tvm.compile(...).mod``, ``tvm.runtime.load_module(...)``, or a
        module loaded on an RPC session when every device is remote).
    devices : one device or a list; ``device_index`` values index it and ``devices[0]`` is the
        primary/fallback device.
    device_index_kind : how to read ``device_index`` when the graph does not say: ``"position"``
        (tvm-hetero) or ``"device_type"`` (graphs from TVM <= 0.19).
    offload : for remote devices mixed with local ones, ``"group"`` runs each group of remote
        kernels with one RPC call (a runner in the remote process holds the prepared calls);
        ``"per_op"`` calls every remote kernel across the connection (TVM's old behaviour).
    remote_timeout : seconds that set-up (kernel upload, runtime creation) and each run may take
        when remote devices are involved; past it the connections are closed and TimeoutError
        names the servers (a remote device that hangs or was stopped). Needs sessions from
        ``tvm_hetero.rpc.connect`` or ``connect_tracker``.
    remote_library : ``device -> path or None``: the exported kernel library a remote device
        uploads (an artifact's lib.so); None, or a None answer, exports ``lib`` on the fly.
    execution : ``"concurrent"`` (default): each device runs its own steps on its own executor and
        waits only for what it reads from other devices (results bit-identical to serial);
        ``"serial"``: devices run one after another in graph order, on the calling thread except
        for devices with ``device_options`` (each runs its steps on its own executor, still one
        device at a time).
    device_options : one entry per device (None for none): ``{"cores": [0], "num_threads": 1}``
        pins that device's executor to those cores with its own TVM thread pool and OpenMP team
        (oneDNN) of that size (a CPU cluster), in both execution modes; a device with options gets
        its own thread even when it is the primary one.
    device_libs : ``Artifact.device_libs``: per device position, the kernel library of a device whose
        architecture differs from this machine's (uploaded to its session; the device must be remote).
    params : the parameters (``Artifact.params``: name -> array, or ``tvm.runtime.save_param_dict``
        bytes such as an exported params.bin), bound with :meth:`GraphModule.set_params` /
        :meth:`GraphModule.load_params` before this returns; without them, set them before ``run``.
    """
    if not isinstance(graph_json, str):
        raise TypeError(f"graph_json must be a str, got {type(graph_json).__name__}")
    if offload not in OFFLOAD_MODES:
        raise ValueError(f"offload must be one of {OFFLOAD_MODES}, got {offload!r}")
    if device_index_kind not in DEVICE_INDEX_KINDS:
        raise ValueError(f"device_index_kind must be one of {DEVICE_INDEX_KINDS}, got {device_index_kind!r}")
    if execution not in EXECUTION_MODES:
        raise ValueError(f"execution must be one of {EXECUTION_MODES}, got {execution!r}")
    devices = _as_device_list(devices)
    options_json = _device_options_json(device_options, len(devices))
    remote = [is_remote(d) for d in devices]
    if device_libs:
        check_local_devices(devices, device_libs)
        if remote[0]:
            raise ValueError(f"device 0 ({name_of(devices[0])}) must be local when other devices have kernel libraries of "
                             "another architecture (the host drives them)")
    if all(remote):
        module = _create_remote(graph_json, lib, devices, device_index_kind)
    elif any(remote):
        mixed = create_mixed(graph_json, lib, devices, remote, device_index_kind, offload, remote_timeout,
                             remote_library, device_libs)
        module = GraphModule(mixed.module, devices[0], keep_alive=mixed.keep_alive, watchdog=mixed.watchdog)
    else:
        fcreate = tvm_ffi.get_global_func("tvm_hetero.graph_runtime.create")
        module = GraphModule(fcreate(graph_json, lib, device_index_kind, *devices), devices[0])
    module.module["set_execution"](execution, options_json)
    if params is not None:
        try:
            if isinstance(params, (bytes, bytearray)):
                module.load_params(params, "params")
            else:
                module.set_params(dict(params))
        except Exception:
            module.close()
            raise
    return module


def _device_options_json(device_options: Sequence[dict | None] | None, num_devices: int) -> str:
    """``device_options`` checked for shape and written as the JSON the runtime reads."""
    if device_options is None:
        return "null"
    if isinstance(device_options, dict) or not isinstance(device_options, Sequence):
        raise TypeError("device_options must be a list with one dict (or None) per device")
    if len(device_options) > num_devices:
        raise ValueError(f"device_options has {len(device_options)} entries for {num_devices} devices")
    for i, option in enumerate(device_options):
        if option is not None and not isinstance(option, dict):
            raise TypeError(f"device_options[{i}] must be a dict or None, got {type(option).__name__}")
    return json.dumps(list(device_options))


def _create_remote(graph_json, lib, devices, device_index_kind) -> GraphModule:
    """Every device is on one RPC session: the whole runtime runs in the remote process."""
    session = getattr(devices[0], "_rpc_sess", None)
    if session is None or any(getattr(d, "_rpc_sess", None) is not session for d in devices):
        raise ValueError("remote devices must all come from one RPC session")
    fcreate = session.get_function("tvm_hetero.graph_runtime.create")
    # RPC strips the session mask from devices on the way, so the remote sees its own devices.
    return GraphModule(fcreate(graph_json, lib, device_index_kind, *devices), devices[0])


def _as_bindable(value: Any, what: str) -> tvm.runtime.Tensor:
    """``value`` as a TVM tensor sharing its memory (a TVM tensor, or any DLPack tensor)."""
    if isinstance(value, tvm.runtime.Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        return tvm_ffi.from_dlpack(value)
    raise TypeError(f"{what}: binding without a copy needs a TVM or DLPack tensor, got {type(value).__name__}")


def _set_one_input(module: Any, setter: Any, key: int | str, value: Any, copy: bool) -> None:
    """Check ``key`` and ``value`` and hand them to ``setter`` (copying or binding)."""
    if isinstance(key, str):
        if module._get_input_index(key) < 0:
            raise KeyError(f"the graph has no input named {key!r}; its inputs: {module.input_names}"
                           + (f" (parameters: {module.param_names})" if module.param_names else ""))
        what = f"input {key!r}"
    elif isinstance(key, (int, np.integer)):
        key = int(key)
        num_inputs = module._get_num_inputs()
        if not 0 <= key < num_inputs:
            raise IndexError(f"input index {key} is out of range: the graph has {num_inputs} inputs")
        what = f"input {key} ({module._get_input_name(key)!r})"
    else:
        raise TypeError(f"input key must be a name or an index, got {type(key).__name__}")
    if value is None:
        raise ValueError(f"{what}: no value given")
    setter(key, module._to_tensor(value, what) if copy else _as_bindable(value, what))


class GraphModule:
    """A loaded graph: set inputs, run, read outputs (TVM's GraphModule API).

    Use it as a context manager, or call :meth:`close`, to release its remote sessions and watchdog.
    """

    def __init__(
        self,
        module: tvm.runtime.Module,
        primary_device: tvm.runtime.Device,
        keep_alive: tuple = (),
        watchdog: Any = None,
    ):
        self.module = module
        self.primary_device = primary_device
        # Sessions, remote libraries and runners this runtime uses; they must outlive it.
        self._keep_alive = keep_alive
        # Bounds each run when remote devices are involved (tvm_hetero.rpc.RunWatchdog), or None.
        self._watchdog = watchdog
        self._set_input = module["set_input"]
        self._run = module["run"]
        self._get_output = module["get_output"]
        self._get_input = module["get_input"]
        self._get_input_index = module["get_input_index"]
        self._get_input_name = module["get_input_name"]
        self._get_num_inputs = module["get_num_inputs"]
        self._get_input_is_param = module["get_input_is_param"]
        self._get_num_outputs = module["get_num_outputs"]
        self._load_params = module["load_params"]
        self._share_params = module["share_params"]
        self._set_params = module["set_params"]
        self._stats = module["stats"]
        self._profile = module["profile"]
        self._trace = module["trace"]
        self._bind_input = module["bind_input"]
        self._bind_output = module["bind_output"]
        self._frame = module["frame"]
        self._scratch_bytes = module["scratch_bytes"]
        self._plan = module["plan"]

    # ---- inputs ----------------------------------------------------------------------------
    def _to_tensor(self, value: Any, what: str) -> tvm.runtime.Tensor:
        return as_tensor(value, what, self.primary_device if is_remote(self.primary_device) else None)

    def set_input(self, key: int | str | None = None, value: Any = None, copy: bool = True, **params: Any) -> None:
        """Set one input by name or index (numpy array or TVM tensor), and/or several by keyword.

        ``copy=False`` binds the tensor instead of copying it: the steps read the caller's memory
        from now on (a TVM tensor, or any DLPack tensor, on the input's device, contiguous and
        64-byte aligned -- ``tvm.runtime.empty`` gives one); a mismatch raises naming the input.
        """
        if key is not None:
            self._set_one(key, value, copy)
        for name, val in params.items():
            self._set_one(name, val, copy)

    def _set_one(self, key: int | str, value: Any, copy: bool = True) -> None:
        _set_one_input(self, self._set_input if copy else self._bind_input, key, value, copy)

    def get_input(self, key: int | str) -> tvm.runtime.Tensor:
        return self._get_input(key)

    def get_input_index(self, name: str) -> int:
        """Index of the named input, or -1."""
        return self._get_input_index(name)

    def get_input_name(self, index: int) -> str:
        return self._get_input_name(index)

    def get_num_inputs(self) -> int:
        return self._get_num_inputs()

    def get_num_outputs(self) -> int:
        return self._get_num_outputs()

    @property
    def input_names(self) -> list[str]:
        """The inputs a caller feeds: the graph's inputs not bound as parameters, in index order
        (as ONNX Runtime's ``get_inputs()`` leaves out initializers)."""
        return self._input_names(params=False)

    @property
    def param_names(self) -> list[str]:
        """The graph's inputs bound as parameters (``set_params``, ``load_params``, ``share_params``)."""
        return self._input_names(params=True)

    def _input_names(self, params: bool) -> list[str]:
        return [str(self._get_input_name(i)) for i in range(self._get_num_inputs())
                if bool(self._get_input_is_param(i)) == params]

    @property
    def num_outputs(self) -> int:
        return int(self._get_num_outputs())

    # ---- execution -------------------------------------------------------------------------
    def run(self, **inputs: Any) -> None:
        """Set the given inputs by name, then execute the graph once.

        Every input must have been set (parameters count once loaded), else ValueError names those
        never set. One call at a time per runtime: while another thread is in ``run`` (or
        ``set_input``, ``set_params``, ``load_params``, ``get_output(i, out)``) on this runtime, the
        call raises RuntimeError "runtime is busy" instead of corrupting shared buffers; threads that
        run at the same time each take a :meth:`frame`.
        """
        if self._watchdog is None:
            if inputs:
                self.set_input(**inputs)
            self._run()
            return
        with self._watchdog:  # inputs that live on a remote device cross the connection too
            try:
                if inputs:
                    self.set_input(**inputs)
                self._run()
            except Exception as err:
                if self._watchdog.fired:
                    raise TimeoutError(
                        f"{self._watchdog.address} did not answer within {self._watchdog.timeout} s during run; "
                        "the connection was closed (create a new runtime after reconnecting)"
                    ) from err
                raise

    def get_output(self, index: int, out: tvm.runtime.Tensor | None = None) -> tvm.runtime.Tensor:
        """Output ``index``: the runtime's own tensor, or copied into ``out``."""
        if out is not None:
            return self._get_output(index, out)
        return self._get_output(index)

    def get_outputs(self) -> list[np.ndarray]:
        """Every output as a numpy array, like :meth:`PipelineModule.get_output`."""
        return [self._get_output(i).numpy() for i in range(self.num_outputs)]

    def bind_output(self, index: int, out: Any) -> None:
        """Zero copy: every later run writes output ``index`` straight into ``out`` (checked like
        ``set_input(..., copy=False)``)."""
        self._bind_output(index, _as_bindable(out, f"output {index}"))

    def frame(self, scratch: tvm.runtime.Tensor | None = None) -> Frame:
        """A new frame: the per-run memory of this model, sharing its plan and parameters (set the
        parameters first). Each thread that runs at the same time as others takes its own frame::

            frame = rt.frame()
            frame.set_input("x", x)
            frame.run()
            y = frame.get_output(0).numpy()

        ``scratch``: memory (a uint8 tensor of at least :meth:`scratch_bytes` of its device) for the
        values a run computes, instead of the frame's own. Frames that never run at the same time
        (the graphs of one generation session) may share one scratch (two frames running at once
        must not); an output not bound is then valid until any of them runs.
        """
        return Frame(self._frame(scratch), self)

    def scratch_bytes(self, device: tvm.runtime.Device | None = None) -> int:
        """Bytes a frame takes from a scratch on ``device`` (default: the primary device)."""
        return int(self._scratch_bytes(device if device is not None else self.primary_device))

    def plan(self) -> str:
        """The execution plan, one line per step: kind, node, device, arguments, memory touched."""
        return str(self._plan())

    # ---- parameters ------------------------------------------------------------------------
    def set_params(self, params: dict[str, Any]) -> None:
        """Bind parameters by name: all are checked before any is written, and caches derived from
        the old values (e.g. an external backend's reordered weights) are dropped."""
        for name in params:
            if not isinstance(name, str) or self._get_input_index(name) < 0:
                raise KeyError(f"set_params: the graph has no input named {name!r}")
        self._set_params({name: self._to_tensor(value, f"parameter {name!r}") for name, value in params.items()})

    def load_params(self, param_bytes: bytes | bytearray, what: str = "load_params") -> None:
        """Set parameters from ``tvm.runtime.save_param_dict`` bytes; the whole blob is validated
        (sizes, names, shapes, dtypes) before anything is written. ``what`` is named in errors."""
        self._load_params(bytes(param_bytes), what)

    def share_params(self, other: GraphModule, param_bytes: bytes | bytearray) -> None:
        """Use ``other``'s parameter memory (the names in ``param_bytes``) instead of copying."""
        self._share_params(other.module, bytes(param_bytes))

    # ---- inspection ------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counts: num_nodes, num_groups, num_copies, device_switches, storage_bytes per device..."""
        return json.loads(self._stats())

    def trace(self, path: str | None = None, runs: int = 1) -> dict:
        """Run ``runs`` times recording every step, and return (and write to ``path``) a Chrome
        trace-event JSON that opens in Perfetto: one track per device, spans for kernels, copies,
        offloaded groups, and the waits between them (see :mod:`tvm_hetero.timeline`)."""
        from .timeline import chrome_trace

        spans = json.loads(self._trace(int(runs)))
        trace = chrome_trace(spans)
        if path is not None:
            with open(path, "w") as f:
                json.dump(trace, f)
        return trace

    def timeline(self, runs: int = 1) -> dict:
        """Per-device busy, waiting and overlap times (µs) of the last of ``runs`` traced runs."""
        from .timeline import summarize

        return summarize(json.loads(self._trace(int(runs))))

    def profile(self, repeat: int = 1) -> dict:
        """Per-node and per-group times (µs, averaged over ``repeat`` runs) and device of each."""
        result = json.loads(self._profile(int(repeat)))
        by_device: dict[int, float] = {}
        for group in result["groups"]:
            by_device[group["device"]] = by_device.get(group["device"], 0.0) + group["time_us"]
        result["device_time_us"] = by_device
        result["total_us"] = sum(by_device.values())
        return result

    # ---- life cycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release what the runtime holds beyond itself: the watchdog's timer and the remote
        sessions, libraries and runners. Idempotent; the runtime is not used afterwards."""
        if self._watchdog is not None:
            self._watchdog.__exit__(None, None, None)
            self._watchdog = None
        self._keep_alive = ()

    @property
    def closed(self) -> bool:
        return self._watchdog is None and not self._keep_alive

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Frame:
    """The per-run state of one compiled model (``GraphModule.frame()``): inputs, outputs, storage.

    Frames of one runtime share its plan and parameters (held once); each thread serving requests
    at the same time as others uses its own frame. One call at a time per frame.
    """

    def __init__(self, module: tvm.runtime.Module, runtime: GraphModule):
        self.module = module
        self.runtime = runtime  # the runtime must outlive the frame (the module keeps it too)
        self._set_input = module["set_input"]
        self._bind_input = module["bind_input"]
        self._bind_output = module["bind_output"]
        self._run = module["run"]
        self._get_output = module["get_output"]
        self._get_input = module["get_input"]
        self._io_bytes_copied = module["io_bytes_copied"]
        self._allocated_bytes = module["allocated_bytes"]
        self._get_input_index = runtime._get_input_index
        self._get_input_name = runtime._get_input_name
        self._get_num_inputs = runtime._get_num_inputs
        self._to_tensor = runtime._to_tensor

    @property
    def input_names(self) -> list[str]:
        """The inputs a caller feeds (the runtime's :attr:`GraphModule.input_names`)."""
        return self.runtime.input_names

    @property
    def param_names(self) -> list[str]:
        return self.runtime.param_names

    def set_input(self, key: int | str | None = None, value: Any = None, copy: bool = True, **params: Any) -> None:
        """Like :meth:`GraphModule.set_input` (``copy=False`` binds without copying)."""
        if key is not None:
            _set_one_input(self, self._set_input if copy else self._bind_input, key, value, copy)
        for name, val in params.items():
            _set_one_input(self, self._set_input if copy else self._bind_input, name, val, copy)

    def bind_output(self, index: int, out: Any) -> None:
        """Zero copy: every later run writes output ``index`` straight into ``out``."""
        self._bind_output(index, _as_bindable(out, f"output {index}"))

    def run(self, **inputs: Any) -> None:
        """Set the given inputs by name (copied), then execute the graph once."""
        if inputs:
            self.set_input(**inputs)
        self._run()

    def get_input(self, key: int | str) -> tvm.runtime.Tensor:
        return self._get_input(key)

    def get_output(self, index: int, out: tvm.runtime.Tensor | None = None) -> tvm.runtime.Tensor:
        """Output ``index``: the frame's own tensor (valid until its next run), or copied into ``out``."""
        if out is not None:
            return self._get_output(index, out)
        return self._get_output(index)

    def get_outputs(self) -> list[np.ndarray]:
        return [self._get_output(i).numpy() for i in range(self.runtime.num_outputs)]

    @property
    def io_bytes_copied(self) -> int:
        """Bytes ``set_input`` and ``get_output(i, out)`` copied in this frame so far."""
        return int(self._io_bytes_copied())

    @property
    def allocated_bytes(self) -> int:
        """Memory this frame allocated (parameters are the runtime's, not counted here)."""
        return int(self._allocated_bytes())


def check_local_devices(devices: Sequence[tvm.runtime.Device], libraries: Mapping[int, Any]) -> None:
    """A device with a foreign library must be remote: this process cannot run its kernels."""
    for position, library in sorted(libraries.items()):
        if position >= len(devices):
            raise ValueError(f"device {position} has a kernel library for {library.arch} but only "
                             f"{len(devices)} devices were given")
        if not is_remote(devices[position]):
            raise ValueError(
                f"device {position} ({name_of(devices[position])}) has kernels for {library.arch} (target "
                f"{library.target_kind()}) but is a local device of this {host_architecture()} "
                f"host, which cannot run them: pass a device of an RPC session on an {library.arch} board "
                "(session.cpu(0); see docs/board.md)"
            )
