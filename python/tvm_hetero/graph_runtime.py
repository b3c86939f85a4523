"""Python API of the heterogeneous graph runtime, mirroring TVM's GraphModule."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from . import _lib  # noqa: F401  (registers tvm_hetero.graph_runtime.create)

RPC_SESS_MASK = 128
DEVICE_INDEX_KINDS = ("position", "device_type")


def is_remote(device: tvm.runtime.Device) -> bool:
    """Whether the device lives behind a TVM RPC session."""
    return device.dlpack_device_type() >= RPC_SESS_MASK


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


def create(
    graph_json: str,
    lib: tvm.runtime.Module,
    devices: tvm.runtime.Device | Sequence[tvm.runtime.Device],
    device_index_kind: str = "position",
    offload: str = "group",
    remote_timeout: float | None = None,
    device_libs: Mapping[int, Any] | None = None,
) -> GraphModule:
    """Create a runtime for ``graph_json`` (docs/graph-format.md).

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
    remote_timeout : seconds a run may take when remote devices are involved; past it the
        connections are closed and ``run`` raises TimeoutError (a remote device that hangs).
    device_libs : ``Artifact.device_libs``: per device position, the kernel library of a device whose
        architecture differs from this machine's (uploaded to its session; the device must be remote).
    """
    if not isinstance(graph_json, str):
        raise TypeError(f"graph_json must be a str, got {type(graph_json).__name__}")
    if offload not in OFFLOAD_MODES:
        raise ValueError(f"offload must be one of {OFFLOAD_MODES}, got {offload!r}")
    if device_index_kind not in DEVICE_INDEX_KINDS:
        raise ValueError(f"device_index_kind must be one of {DEVICE_INDEX_KINDS}, got {device_index_kind!r}")
    devices = _as_device_list(devices)
    remote = [is_remote(d) for d in devices]
    if device_libs:
        from .compiler.kernel_libraries import check_local_devices

        check_local_devices(devices, device_libs)
        if remote[0]:
            raise ValueError(f"device 0 ({devices[0]}) must be local when other devices have kernel libraries of "
                             "another architecture (the host drives them)")
    if all(remote):
        return _create_remote(graph_json, lib, devices, device_index_kind)
    if any(remote):
        from .offload import create_mixed

        return create_mixed(graph_json, lib, devices, device_index_kind, offload, remote_timeout, device_libs)
    fcreate = tvm_ffi.get_global_func("tvm_hetero.graph_runtime.create")
    return GraphModule(fcreate(graph_json, lib, device_index_kind, *devices), devices[0])


def _create_remote(graph_json, lib, devices, device_index_kind) -> GraphModule:
    """Every device is on one RPC session: the whole runtime runs in the remote process."""
    session = getattr(devices[0], "_rpc_sess", None)
    if session is None or any(getattr(d, "_rpc_sess", None) is not session for d in devices):
        raise ValueError("remote devices must all come from one RPC session")
    fcreate = session.get_function("tvm_hetero.graph_runtime.create")
    # RPC strips the session mask from devices on the way, so the remote sees its own devices.
    return GraphModule(fcreate(graph_json, lib, device_index_kind, *devices), devices[0])


class GraphModule:
    """A loaded graph: set inputs, run, read outputs (TVM's GraphModule API)."""

    def __init__(self, module: tvm.runtime.Module, primary_device: tvm.runtime.Device, keep_alive: tuple = ()):
        self.module = module
        self.primary_device = primary_device
        # Sessions, remote libraries and runners this runtime uses; they must outlive it.
        self._keep_alive = keep_alive
        # Set for runtimes with remote devices and a remote_timeout (see tvm_hetero.offload).
        self._watchdog = None
        self._set_input = module["set_input"]
        self._run = module["run"]
        self._get_output = module["get_output"]
        self._get_input = module["get_input"]
        self._get_input_index = module["get_input_index"]
        self._get_input_name = module["get_input_name"]
        self._get_num_inputs = module["get_num_inputs"]
        self._get_num_outputs = module["get_num_outputs"]
        self._load_params = module["load_params"]
        self._share_params = module["share_params"]
        self._set_params = module["set_params"]
        self._stats = module["stats"]
        self._profile = module["profile"]

    # ---- inputs ----------------------------------------------------------------------------
    def _to_tensor(self, value: Any, what: str) -> tvm.runtime.Tensor:
        if isinstance(value, tvm.runtime.Tensor):
            if is_remote(self.primary_device) and not is_remote(value.device):
                return tvm.runtime.tensor(value.numpy(), self.primary_device)
            return value
        try:
            array = np.asarray(value, order="C")  # keeps 0-d arrays 0-d (ascontiguousarray would not)
        except Exception as err:
            raise TypeError(f"{what}: cannot convert {type(value).__name__} to a tensor") from err
        if array.dtype == object:
            raise TypeError(f"{what}: cannot convert {type(value).__name__} to a tensor")
        device = self.primary_device if is_remote(self.primary_device) else tvm.cpu(0)
        return tvm.runtime.tensor(array, device)

    def set_input(self, key: int | str | None = None, value: Any = None, **params: Any) -> None:
        """Set one input by name or index (numpy array or TVM tensor), and/or several by keyword."""
        if key is not None:
            self._set_one(key, value)
        for name, val in params.items():
            self._set_one(name, val)

    def _set_one(self, key: int | str, value: Any) -> None:
        if isinstance(key, str):
            if self._get_input_index(key) < 0:
                raise KeyError(f"the graph has no input named {key!r}")
            what = f"input {key!r}"
        elif isinstance(key, (int, np.integer)):
            key = int(key)
            if not 0 <= key < self.get_num_inputs():
                raise IndexError(f"input index {key} is out of range: the graph has {self.get_num_inputs()} inputs")
            what = f"input {key} ({self._get_input_name(key)!r})"
        else:
            raise TypeError(f"input key must be a name or an index, got {type(key).__name__}")
        if value is None:
            raise ValueError(f"{what}: no value given")
        self._set_input(key, self._to_tensor(value, what))

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

    # ---- execution -------------------------------------------------------------------------
    def run(self, **inputs: Any) -> None:
        """Set the given inputs by name, then execute the graph once."""
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
                        f"a remote device did not answer within {self._watchdog.timeout} s; "
                        "its connection was closed (create a new runtime after reconnecting)"
                    ) from err
                raise

    def get_output(self, index: int, out: tvm.runtime.Tensor | None = None) -> tvm.runtime.Tensor:
        """Output ``index``: the runtime's own tensor, or copied into ``out``."""
        if out is not None:
            return self._get_output(index, out)
        return self._get_output(index)

    # ---- parameters ------------------------------------------------------------------------
    def set_params(self, params: dict[str, Any]) -> None:
        for name, value in params.items():
            self._set_one(name, value)

    def load_params(self, param_bytes: bytes | bytearray) -> None:
        """Set parameters from ``tvm.runtime.save_param_dict`` bytes."""
        self._load_params(bytes(param_bytes))

    def share_params(self, other: GraphModule, param_bytes: bytes | bytearray) -> None:
        """Use ``other``'s parameter memory (the names in ``param_bytes``) instead of copying."""
        self._share_params(other.module, bytes(param_bytes))

    # ---- inspection ------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counts: num_nodes, num_groups, num_copies, device_switches, storage_bytes per device..."""
        return json.loads(self._stats())

    def profile(self, repeat: int = 1) -> dict:
        """Per-node and per-group times (µs, averaged over ``repeat`` runs) and device of each."""
        result = json.loads(self._profile(int(repeat)))
        by_device: dict[int, float] = {}
        for group in result["groups"]:
            by_device[group["device"]] = by_device.get(group["device"], 0.0) + group["time_us"]
        result["device_time_us"] = by_device
        result["total_us"] = sum(by_device.values())
        return result
