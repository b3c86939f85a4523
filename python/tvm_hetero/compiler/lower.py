"""Lowering: a Relax IRModule to a device-placed :class:`~tvm_hetero.graph.Graph`.

``lower_to_graph`` takes the entry function of a Relax module (as TVM's ONNX or PyTorch
frontends produce it) and returns the graph of fused kernel calls, each on one device, plus the
kernels as TIR. ``compile_kernels`` (:mod:`.compile_kernels`) compiles those kernels, each
device's with its own target.

The steps, in order:

1. **Place** every Relax op call of the entry function, before anything is lowered: the
   placement policy (:mod:`.placement`) sees one :class:`OpInfo` per call.
2. **Legalize**: first TVM's library dispatch passes of each device's target (:mod:`.dispatch`:
   sort, scan, sampling), then ``LegalizeOps``. The bound variable of each op call survives
   both, so every resulting ``call_tir`` is traced back to the op it came from (the helper
   bindings a legalization emits belong to the op bound right after them).
3. **Specialize** kernels per device: each PrimFunc is copied once per (device, op) that calls
   it and the copy is tagged with both, so a kernel used on two devices gets two symbols
   (``add`` and ``add_dev1``) and each fused kernel can tell where its parts came from.
4. **Fence** the device boundaries (:mod:`.fence_devices`, the ``FenceDeviceBoundaries`` pass):
   every cross-device dataflow edge goes through an opaque identity kernel, so ``FuseOps`` never
   builds a fused group holding two devices. The fences are aliases and disappear when the
   graph is built.
5. **Fuse** (``AnnotateTIROpPattern``, ``FuseOps``, ``FuseTIR``), then check that every fused
   group reads a single device tag (an error otherwise) and build the :class:`Graph`: one
   ``null`` node per function parameter and per tensor constant, then one ``tvm_op`` node per
   kernel call in binding order.
6. **Fold constants** (:mod:`.fold_constants`): kernels reading only IR-bound constants run at
   build time and become parameters.

Copies between devices are not inserted here; a later pass does that on the graph.

**External backends** (``backends=``, :mod:`tvm_hetero.backends`): before step 1 the entry
function is partitioned (``partition_for_backends``); each region is a call to a function run
by a backend on the backend's device. Such calls pass through legalization and fusion untouched
(fenced like kernels), become graph nodes whose ``func_name`` is the region's symbol, and
:func:`compile_kernels` imports each backend's codegen module into the kernel library.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..backends import Backend, Region, resolve_backends
from ..backends.partition import partition_for_backends, region_calls, region_of
from ..graph import Entry, Graph, Node
from ..ir.fold_constant_ops import computed_weight_notes
from ..ir.relax_helpers import (
    ALIAS_OPS,
    CALL_TIR,
    DEVICE_ATTR,
    OP_ATTR,
    LoweringError,
    is_alias_op,
    is_call_tir,
    replace_body,
    same_kind_block,
    static_shape,
    tensor_type,
)
from .dispatch import dispatch_library_ops
from .fence_devices import FENCE_PREFIX, FenceDeviceBoundaries
from .fold_constants import fold_constants
from .index_checks import insert_index_checks
from .placement import Fallback, OpInfo, PlacementSpec, resolve_placement

#: Index of the Relax op a kernel computes, only when the lowering tracks ops (track_ops=True).
OP_INDEX_ATTR = "tvm_hetero.relax_op_index"


@dataclass
class LoweredGraph:
    """The output of :func:`lower_to_graph`."""

    #: Kernel nodes placed on devices; null nodes for inputs and params come first.
    graph: Graph
    #: One PrimFunc per kernel, each with a ``global_symbol`` equal to its graph ``func_name``.
    kernels: tvm.IRModule
    #: Device each kernel is compiled for.
    kernel_devices: dict[str, int]
    #: Values of the parameters and constants, keyed by their null node's name.
    params: dict[str, np.ndarray]
    #: Names of the null nodes the caller feeds at run time (the non-param function parameters).
    input_names: list[str]
    #: Ops the placement put on a fallback device (Capabilities), in op order.
    fallbacks: list[Fallback]
    #: Number of devices the graph was placed for.
    num_devices: int
    #: Every Relax op call of the entry function with the device it was given.
    op_placement: list[tuple[OpInfo, int]] = field(default_factory=list)
    #: Regions of external backends, by symbol (those the graph still calls).
    regions: dict[str, Region] = field(default_factory=dict)
    #: The backends that made them.
    backends: list[Backend] = field(default_factory=list)
    #: With ``track_ops``: the ops (:attr:`OpInfo.index`) each kernel node computes, by node name.
    node_op_indices: dict[str, list[int]] = field(default_factory=dict)
    #: Convolutions and matmuls no backend could take because their weight is computed from
    #: constants, not a constant: one line each, with the reason (:mod:`.fold_constant_ops`).
    declined: list[str] = field(default_factory=list)

    def kernel_ops(self, func_name: str) -> list[str]:
        """Relax ops fused into the kernel ``func_name`` (from the first node calling it)."""
        for node in self.graph.nodes:
            if node.func_name == func_name:
                return list(node.relax_ops)
        raise KeyError(func_name)


# ---- entry point ----------------------------------------------------------------------------
def lower_to_graph(
    mod: tvm.IRModule,
    placement: PlacementSpec,
    num_devices: int,
    params: dict[str, Any] | None = None,
    entry: str = "main",
    backends: Sequence[Any] = (),
    fold: bool = True,
    targets: Sequence[Any] | None = None,
    track_ops: bool = False,
    kernel_free_devices: Collection[int] = (),
) -> LoweredGraph:
    """Lower the Relax function ``entry`` of ``mod`` to a device-placed kernel graph.

    ``placement`` is anything :func:`~tvm_hetero.compiler.placement.resolve_placement` accepts.
    ``params`` maps function parameter names to values (numpy arrays or TVM tensors); such
    parameters become null nodes with values in :attr:`LoweredGraph.params`, like the ones a
    frontend lists in the function's ``"params"`` attribute (ONNX ``keep_params_in_input``).
    Constants bound in the IR become named null nodes too. ``backends`` (names, ``(name,
    device)`` pairs or :class:`~tvm_hetero.backends.Backend` objects) partition the function first.
    ``fold``: run the kernels that read only IR-bound constants at build time (:mod:`.fold_constants`).
    ``targets[d]`` is device ``d``'s target, for the ops TVM dispatches per target before
    legalization (:mod:`.dispatch`; ``llvm`` for every device when None).
    ``track_ops``: record which ops each kernel node computes (:attr:`LoweredGraph.node_op_indices`;
    automatic placement needs it). Every op then gets a kernel of its own before fusion, so equal
    kernels are no longer shared: the kernels are the same computations, under more names.
    ``kernel_free_devices``: positions that run no TVM kernels (an NPU behind a vendor SDK runs only its backend's
    regions); an op placed there that no region took falls back to device 0 and is recorded in
    :attr:`LoweredGraph.fallbacks`.
    """
    resolved = resolve_placement(placement, num_devices)
    backend_list = resolve_backends(backends)
    for backend in backend_list:
        for device in [backend.device] if backend.device is not None else sorted(backend.devices or ()):
            if not 0 <= device < num_devices:
                raise ValueError(f"backend {backend.name!r} is on device {device}, outside [0, {num_devices})")
    func = _entry_function(mod, entry)
    param_values = _param_values(func, params)
    func = func.without_attr("params") if func.attrs is not None and "params" in func.attrs else func
    mod = _with_function(mod, entry, func)
    _check_supported(func)
    if _has_non_dataflow_bindings(func):
        mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
        func = mod[entry]
    regions: dict[str, Region] = {}
    if backend_list:
        place = _call_placer(mod, entry, resolved, annotations=placement is None)
        # A pinned backend's moves are reported against a placement the user gave (a policy or IR
        # annotations), not against the default of everything on device 0.
        explicit = placement is not None or bool(_annotated_devices(mod, entry))
        mod, regions = partition_for_backends(mod, backend_list, entry, frozenset(param_values), place,
                                              param_values, report_moves=explicit)
        func = mod[entry]
        declined = computed_weight_notes(func, [backend.name for backend in backend_list])
    else:
        declined = []

    annotated = _annotated_devices(mod, entry) if placement is None else {}
    op_placement, op_of_var = _place_ops(func, resolved, annotated)
    if kernel_free_devices:
        op_placement, op_of_var = _off_kernel_free_devices(op_placement, op_of_var, set(kernel_free_devices),
                                                           resolved.fallbacks)
    for var, region in region_calls(func, regions):
        op_of_var[var] = (region.device, region.name)
    # Every gather's and scatter's indices checked on its device, a region's on a TVM device before it.
    mod, guards = insert_index_checks(mod, entry, regions, kernel_free_devices)
    op_of_var.update(guards)

    mod = dispatch_library_ops(mod, entry, {var: dev for var, (dev, _op) in op_of_var.items()}, targets)
    mod = relax.transform.LegalizeOps()(mod)
    if track_ops:
        index_of = {var: i for i, var in enumerate(op_of_var) if i < len(op_placement)}  # ops come first
        op_of_var = {var: (*tag, index_of[var]) if var in index_of else tag for var, tag in op_of_var.items()}
    tags = _trace_legalized(mod[entry], op_of_var)
    mod = _specialize_kernels(mod, entry, tags)
    mod = FenceDeviceBoundaries(entry, regions)(mod)
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseOps()(mod)
    fused_tags = _fused_group_tags(mod)
    fused_indices = _fused_op_indices(mod) if track_ops else {}
    mod = relax.transform.FuseTIR()(mod)

    builder = _GraphBuilder(mod, mod[entry], fused_tags, param_values, regions, fused_indices)
    graph, kernels, kernel_devices = builder.build()
    param_arrays = builder.param_arrays
    if fold:
        constants = {builder.nodes[e.node].name for e in builder.const_entries.values()}
        folded = fold_constants(graph, kernels, param_arrays, constants)
        graph, param_arrays = folded.graph, folded.params
    called = {n.func_name for n in graph.nodes}
    if len(called) < len(kernel_devices):
        kernels = tvm.IRModule({gv: f for gv, f in kernels.functions.items() if gv.name_hint in called})
        kernel_devices = {name: d for name, d in kernel_devices.items() if name in called}
    return LoweredGraph(
        graph=graph,
        kernels=kernels,
        kernel_devices=kernel_devices,
        params=param_arrays,
        input_names=builder.input_names,
        fallbacks=list(resolved.fallbacks),
        num_devices=num_devices,
        op_placement=op_placement,
        regions={name: r for name, r in regions.items() if name in called},
        backends=backend_list,
        node_op_indices={n.name: builder.node_op_indices[n.name] for n in graph.nodes if n.name in builder.node_op_indices},
        declined=declined,
    )


def op_infos(mod: tvm.IRModule, entry: str = "main") -> list[OpInfo]:
    """The :class:`OpInfo` of every op call of ``entry``, in order, as :func:`lower_to_graph` asks
    a placement about them (without lowering anything; IR annotations are not read)."""
    decisions, _ops = _place_ops(_entry_function(mod, entry), lambda _info: 0, {})
    return [info for info, _device in decisions]


# ---- step 0: checks and parameters ----------------------------------------------------------
def _entry_function(mod: tvm.IRModule, entry: str) -> relax.Function:
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if entry not in names:
        raise LoweringError(f"module has no function '{entry}' (functions: {sorted(names)})")
    func = mod[entry]
    if not isinstance(func, relax.Function):
        raise LoweringError(f"'{entry}' is a {type(func).__name__}, not a Relax function")
    return func


def _with_function(mod: tvm.IRModule, name: str, func: relax.Function) -> tvm.IRModule:
    mod = mod.clone()
    mod[name] = func
    return mod


def _param_values(func: relax.Function, params: dict[str, Any] | None) -> dict[str, np.ndarray]:
    """Values of function parameters: the ``"params"`` attribute, then ``params`` on top."""
    values: dict[str, np.ndarray] = {}
    names = [p.name for p in func.params]
    attached = func.attrs["params"] if func.attrs is not None and "params" in func.attrs else None
    if attached is not None:
        for var, value in zip(func.params[len(names) - len(attached) :], attached):
            values[var.name] = _to_numpy(value)
    for name, value in (params or {}).items():
        if name not in names:
            raise LoweringError(
                f"params has '{name}', which is no parameter of the function (parameters: {names})"
            )
        values[name] = _to_numpy(value)
    for var in func.params:
        if var.name in values:
            shape, dtype = tensor_type(var.ty, f"parameter '{var.name}'")
            got = values[var.name]
            if tuple(got.shape) != shape or str(got.dtype) != dtype:
                raise LoweringError(
                    f"value of parameter '{var.name}' is {got.dtype}{list(got.shape)}, "
                    f"the function expects {dtype}{list(shape)}"
                )
    return values


def _to_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _check_static_input(var: relax.Var) -> None:
    """An input whose dims are still symbolic (an ONNX ``dim_param`` such as "batch"): named, with its
    dims and the ways to give its shape."""
    ty = var.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return
    if static_shape(ty) is not None:
        return
    dims = ", ".join(str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values)
    raise LoweringError(
        f"input '{var.name}' has symbolic dims ({dims}); the build needs static shapes: give them when "
        f"importing (from_onnx(model, input_shapes={{'{var.name}': (...)}}), or tvm-hetero compile "
        f"--input-shape {var.name}=D0,D1,...) or bind them (relax.transform.BindSymbolicVars)"
    )


def _check_supported(func: relax.Function) -> None:
    """Reject what a static kernel graph cannot express, naming the culprit."""
    for var in func.params:
        _check_static_input(var)
        tensor_type(var.ty, f"parameter '{var.name}'")
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.MatchCast):
                _static_type(binding.var.ty, f"match_cast '{binding.var.name}'")
                continue
            value = binding.value
            if isinstance(value, relax.If):
                raise LoweringError(f"'{binding.var.name}': control flow (R.If) is not supported")
            if isinstance(value, relax.Call):
                what = f"{_call_name(value)} '{binding.var.name}'"
                if not isinstance(value.op, tvm.ir.Op):
                    raise LoweringError(f"{what}: only op calls are supported, not calls to functions")
                _static_type(binding.var.ty, what)
                for arg in value.args:
                    if isinstance(arg, relax.Var | relax.Tuple) or _is_tensor_const(arg):
                        _static_type(arg.ty, f"argument of {what}")
    if not isinstance(func.body.body, relax.Var | relax.Tuple) and not _is_tensor_const(func.body.body):
        raise LoweringError(
            f"the function returns a {type(func.body.body).__name__}; expected a var or tuple"
        )


def _has_non_dataflow_bindings(func: relax.Function) -> bool:
    return any(not isinstance(b, relax.DataflowBlock) and len(b.bindings) for b in func.body.blocks)


# ---- step 1: op-level placement -------------------------------------------------------------
def _annotated_devices(mod: tvm.IRModule, entry: str) -> dict[int, int]:
    """Device position requested by the IR for each binding (by binding position).

    ``RealizeVDevice`` spreads ``R.hint_on_device`` / ``R.to_vdevice`` to every value they
    reach; a value's device is the position of its vdevice in ``global_infos["vdevice"]``.
    Without such a list, one is made from the hints with position = the hint's device index.
    """
    infos = mod.global_infos
    func = mod[entry]
    hints = [
        b.value
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and _call_name(b.value) == "relax.hint_on_device"
    ]
    has_vdevices = "vdevice" in infos and len(infos["vdevice"]) > 0
    if not has_vdevices and not hints:
        return {}
    if not has_vdevices:
        mod = _with_hint_vdevices(mod, hints)
    vdevices = list(mod.global_infos["vdevice"])
    realized = relax.transform.RealizeVDevice()(mod)[entry]
    bindings = [b for block in func.body.blocks for b in block.bindings]
    realized_bindings = [b for block in realized.body.blocks for b in block.bindings]
    if len(bindings) != len(realized_bindings):
        raise LoweringError("RealizeVDevice changed the number of bindings; cannot read device annotations")
    devices: dict[int, int] = {}
    for pos, binding in enumerate(realized_bindings):
        vdevice = _first_vdevice(binding.var.ty)
        if vdevice is None:
            continue
        for index, candidate in enumerate(vdevices):
            if tvm_ffi.structural_equal(vdevice, candidate):
                devices[pos] = index
                break
    return devices


def _with_hint_vdevices(mod: tvm.IRModule, hints: list[relax.Call]) -> tvm.IRModule:
    kinds = {1: "llvm", 2: "cuda", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm"}
    by_index: dict[int, int] = {}
    for hint in hints:
        dev_type, index = int(hint.attrs.device_type), int(hint.attrs.index)
        if by_index.setdefault(index, dev_type) != dev_type:
            raise LoweringError(f"hint_on_device uses index {index} for two device types; add a vdevice list")
        if dev_type not in kinds:
            raise LoweringError(f"hint_on_device: unsupported device type {dev_type}; add a vdevice list")
    vdevices = [
        relax.VDevice(tvm.target.Target(kinds[by_index.get(i, 1)]), i) for i in range(max(by_index) + 1)
    ]
    mod = mod.clone()
    mod.update_global_info("vdevice", vdevices)
    return mod


def _first_vdevice(ty: Any) -> Any:
    if isinstance(ty, relax.TensorType):
        return ty.vdevice
    if isinstance(ty, relax.TupleType):
        for field_ty in ty.fields:
            found = _first_vdevice(field_ty)
            if found is not None:
                return found
    return None


def _place_ops(
    func: relax.Function, placement: Any, annotated: dict[int, int]
) -> tuple[list[tuple[OpInfo, int]], dict[relax.Var, tuple[int, str]]]:
    """Ask the placement for every op call; returns the decisions and ``var -> (device, op)``."""
    decisions: list[tuple[OpInfo, int]] = []
    op_of_var: dict[relax.Var, tuple[int, str]] = {}
    position = 0
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            pos, position = position, position + 1
            if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
                continue
            name = value.op.name
            if name in ALIAS_OPS:
                continue
            info = OpInfo(
                op=name,
                index=len(decisions),
                name=binding.var.name,
                input_shapes=[_shape_or_none(arg) for arg in _op_inputs(value)],
                output_shape=_output_shape(binding.var.ty),
                dtype=_first_dtype(binding.var.ty),
                annotated_device=annotated.get(pos),
                call=value,
            )
            device = placement(info)
            decisions.append((info, device))
            op_of_var[binding.var] = (device, name)
    return decisions, op_of_var


def _off_kernel_free_devices(op_placement, op_of_var, kernel_free: set[int], fallbacks: list[Fallback]):
    """Ops that a placement put on a device running no TVM kernels, and that no region took, go to
    device 0, each recorded as a fallback."""
    for info, device in op_placement:
        if device in kernel_free:
            fallbacks.append(Fallback(info.op, info.index, info.name, 0))
    op_placement = [(info, 0 if device in kernel_free else device) for info, device in op_placement]
    op_of_var = {var: ((0, op) if device in kernel_free else (device, op)) for var, (device, op) in op_of_var.items()}
    return op_placement, op_of_var


def _call_placer(mod: tvm.IRModule, entry: str, placement: Any, annotations: bool):
    """``place(func) -> {bound variable: device}`` for backends that follow the placement. It asks the
    placement before partitioning; the ops left after it are asked again, so fallbacks and their
    warnings are recorded then, once."""

    def place(func: relax.Function) -> dict[relax.Var, int]:
        annotated = _annotated_devices(_with_function(mod, entry, func), entry) if annotations else {}
        kept = len(placement.fallbacks)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _decisions, op_of_var = _place_ops(func, placement, annotated)
        del placement.fallbacks[kept:]
        return {var: device for var, (device, _op) in op_of_var.items()}

    return place


def _op_inputs(call: relax.Call) -> list[Any]:
    """The data arguments of a call: for ``call_tir`` the tensors passed to the kernel."""
    if call.op.name == CALL_TIR and len(call.args) > 1 and isinstance(call.args[1], relax.Tuple):
        return list(call.args[1].fields)
    return list(call.args)


def _shape_or_none(expr: Any) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    return static_shape(ty) if isinstance(ty, relax.TensorType) else None


def _output_shape(ty: Any) -> Any:
    if isinstance(ty, relax.TupleType):
        return tuple(_output_shape(f) for f in ty.fields)
    return static_shape(ty) if isinstance(ty, relax.TensorType) else None


def _first_dtype(ty: Any) -> str | None:
    if isinstance(ty, relax.TensorType):
        return str(ty.dtype)
    if isinstance(ty, relax.TupleType) and len(ty.fields):
        return _first_dtype(ty.fields[0])
    return None


# ---- step 2: trace legalized calls back to ops ----------------------------------------------
def _trace_legalized(
    func: relax.Function, op_of_var: dict[relax.Var, tuple[int, str]]
) -> dict[relax.Var, tuple[int, str]]:
    """``(device, op)`` of every ``call_tir`` binding of the legalized function.

    LegalizeOps keeps each op's bound variable and emits the helper bindings of its lowering
    right before it; an op whose variable did not survive is an error, never a guess.
    """
    tags: dict[relax.Var, tuple[int, str]] = {}
    seen: set[relax.Var] = set()
    for block in func.body.blocks:
        pending: list[relax.Var] = []
        for binding in block.bindings:
            value = binding.value
            if binding.var in op_of_var:
                seen.add(binding.var)
                for var in [*pending, binding.var]:
                    tags[var] = op_of_var[binding.var]
                pending = []
            elif (
                isinstance(value, relax.Call)
                and not is_alias_op(value)
                and not _is_static_shape_value(binding)
            ):
                pending.append(binding.var)
            if (
                isinstance(value, relax.Call)
                and not is_call_tir(value)
                and not is_alias_op(value)
                and not _is_region_call(value)
                and not _is_static_shape_value(binding)
            ):
                op = tags.get(binding.var, (None, _call_name(value)))[1]
                raise LoweringError(
                    f"op {op} '{binding.var.name}' has no TIR lowering (LegalizeOps left {_call_name(value)})"
                )
        if pending:
            left = ", ".join(v.name for v in pending)
            raise LoweringError(f"cannot tell which op the legalized bindings {left} belong to")
    lost = [f"{op_of_var[v][1]} '{v.name}'" for v in op_of_var if v not in seen]
    if lost:
        raise LoweringError(f"lost track of {', '.join(lost)} during legalization")
    return tags


# ---- step 3: one kernel copy per (device, op) -----------------------------------------------
def _specialize_kernels(
    mod: tvm.IRModule, entry: str, tags: dict[relax.Var, tuple[int, str]]
) -> tvm.IRModule:
    """Give each (kernel, device, op) its own PrimFunc, tagged with the device and the op.

    The first user of a kernel keeps its name; another device gets ``<name>_dev<k>``.
    """
    func = mod[entry]
    builder = relax.BlockBuilder(mod)
    copies: dict[tuple[str, int, str], tvm.ir.GlobalVar] = {}
    first_device: dict[str, int] = {}

    def kernel_for(gv: tvm.ir.GlobalVar, device: int, op: str, *index: int) -> tvm.ir.GlobalVar:
        key = (gv.name_hint, device, op, *index)
        if key not in copies:
            tagged = mod[gv].with_attr(DEVICE_ATTR, device).with_attr(OP_ATTR, op)
            if index:
                tagged = tagged.with_attr(OP_INDEX_ATTR, index[0])
            if gv.name_hint not in first_device:
                first_device[gv.name_hint] = device
                builder.update_func(gv, tagged)
                copies[key] = gv
            else:
                same = device == first_device[gv.name_hint]  # per-op copies (index) get fresh names
                copies[key] = builder.add_func(
                    tagged, gv.name_hint if same else f"{gv.name_hint}_dev{device}"
                )
        return copies[key]

    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value
            if binding.var in tags and is_call_tir(value):
                device, op, *index = tags[binding.var]
                kernel = kernel_for(value.args[0], device, op, *index)
                value = relax.Call(value.op, [kernel, *value.args[1:]], value.attrs, value.ty_args)
                binding = relax.VarBinding(binding.var, value)
            bindings.append(binding)
        blocks.append(same_kind_block(block, bindings))
    builder.update_func(mod.get_global_var(entry), builder.normalize(replace_body(func, blocks)))
    return builder.get()




# ---- step 5: fused groups and the graph -----------------------------------------------------
def _fused_group_tags(mod: tvm.IRModule) -> dict[str, tuple[int, list[str]]]:
    """``fused function name -> (device, relax ops)``; a group holding two devices is an error."""
    tags: dict[str, tuple[int, list[str]]] = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or func.attrs is None or "Primitive" not in func.attrs:
            continue
        devices, ops = set(), []
        for block in func.body.blocks:
            for binding in block.bindings:
                if is_call_tir(binding.value):
                    callee = mod[binding.value.args[0]]
                    if callee.attrs is not None and DEVICE_ATTR in callee.attrs:
                        devices.add(int(callee.attrs[DEVICE_ATTR]))
                        ops.append(str(callee.attrs[OP_ATTR]))
        if len(devices) != 1:
            raise LoweringError(f"fused kernel {gv.name_hint} mixes devices {sorted(devices)} (ops {ops})")
        tags[gv.name_hint] = (devices.pop(), ops)
    return tags


def _fused_op_indices(mod: tvm.IRModule) -> dict[str, list[int]]:
    """``fused function name -> indices of the ops it computes`` (from its kernels' tags)."""
    indices: dict[str, list[int]] = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs is not None and "Primitive" in func.attrs:
            found = []
            for block in func.body.blocks:
                for binding in block.bindings:
                    if is_call_tir(binding.value):
                        attrs = mod[binding.value.args[0]].attrs
                        if attrs is not None and OP_INDEX_ATTR in attrs:
                            found.append(int(attrs[OP_INDEX_ATTR]))
            indices[gv.name_hint] = sorted(set(found))
    return indices


class _GraphBuilder:
    """Walks the fused entry function once and emits the Graph and its kernels."""

    def __init__(
        self,
        mod: tvm.IRModule,
        func: relax.Function,
        fused_tags: dict[str, tuple[int, list[str]]],
        param_values: dict[str, np.ndarray],
        regions: dict[str, Region] | None = None,
        fused_indices: dict[str, list[int]] | None = None,
    ) -> None:
        self.mod = mod
        self.fused_indices = fused_indices or {}
        #: Ops computed by each kernel node (by node name), when the lowering tracks ops.
        self.node_op_indices: dict[str, list[int]] = {}
        self.regions = regions or {}
        self.func = func
        self.fused_tags = fused_tags
        self.param_values = param_values
        self.nodes: list[Node] = []
        self.names: set[str] = set()
        self.env: dict[relax.Var, Any] = {}  # var -> Entry, tuple of values, or None (non-tensor)
        self.const_entries: dict[Any, Entry] = {}
        self.param_arrays: dict[str, np.ndarray] = {}
        self.input_names: list[str] = []
        self.kernels: dict[str, tuple[tvm.tirx.PrimFunc, int]] = {}

    def build(self) -> tuple[Graph, tvm.IRModule, dict[str, int]]:
        for var in self.func.params:
            shape, dtype = tensor_type(var.ty, f"parameter '{var.name}'")
            entry = self._add_null(var.name, shape, dtype)
            self.env[var] = entry
            if var.name in self.param_values:
                self.param_arrays[self.nodes[entry.node].name] = self.param_values[var.name]
            else:
                self.input_names.append(self.nodes[entry.node].name)
        self._add_constants()
        for block in self.func.body.blocks:
            for binding in block.bindings:
                self._bind(binding)
        heads = self._flatten(self._value(self.func.body.body, "the function result"), "the function result")
        graph = _drop_dead_kernels(Graph(self.nodes, heads))
        graph.validate()
        used = {n.func_name for n in graph.nodes if not n.is_input}
        kernels = tvm.IRModule(
            {
                tvm.ir.GlobalVar(name): _clean_kernel(prim, name)
                for name, (prim, _) in self.kernels.items()
                if name in used
            }
        )
        devices = {name: device for name, (_, device) in self.kernels.items() if name in used}
        return graph, kernels, devices

    # -- nodes --
    def _add_null(self, name: str, shape: tuple[int, ...], dtype: str) -> Entry:
        name = _unique(name, self.names)
        self.names.add(name)
        self.nodes.append(Node(name=name, op="null", shapes=[shape], dtypes=[dtype]))
        return Entry(len(self.nodes) - 1, 0)

    def _add_constants(self) -> None:
        """One null node per distinct tensor constant, in order of first use."""

        def visit(expr: Any) -> None:
            if _is_tensor_const(expr) and expr not in self.const_entries:
                shape, dtype = tensor_type(expr.ty, "constant")
                entry = self._add_null(f"const_{len(self.const_entries)}", shape, dtype)
                self.const_entries[expr] = entry
                self.param_arrays[self.nodes[entry.node].name] = expr.value.numpy()
            elif isinstance(expr, relax.Tuple):
                for f in expr.fields:
                    visit(f)
            elif isinstance(expr, relax.Call):
                for a in expr.args:
                    visit(a)

        for block in self.func.body.blocks:
            for binding in block.bindings:
                visit(binding.value)
        visit(self.func.body.body)

    def _bind(self, binding: relax.Binding) -> None:
        var, value = binding.var, binding.value
        if isinstance(binding, relax.MatchCast):
            self.env[var] = self._value(value, var.name)
        elif is_call_tir(value):
            self.env[var] = self._kernel_call(var, value)
        elif is_alias_op(value):
            self.env[var] = self._value(value.args[0], var.name)
        elif region_of(value, self.regions) is not None:
            region = region_of(value, self.regions)
            args = [self._value(a, f"argument of '{var.name}'") for a in value.args]
            self.env[var] = self._add_call(var, region.name, args, region.device, [*region.ops])
        elif isinstance(value, relax.Call):
            raise LoweringError(f"{_call_name(value)} '{var.name}': unsupported after lowering")
        elif isinstance(value, relax.TupleGetItem):
            source = self._value(value.tuple_value, var.name)
            if not isinstance(source, tuple):
                raise LoweringError(f"'{var.name}' indexes a value that is not a tuple")
            self.env[var] = source[value.index]
        elif isinstance(value, relax.Tuple | relax.Var) or _is_tensor_const(value):
            self.env[var] = self._value(value, var.name)
        else:
            self.env[var] = None  # shapes, prim values, strings: not tensors

    def _kernel_call(self, var: relax.Var, call: relax.Call) -> Any:
        gv = call.args[0]
        if len(call.args) > 2:
            raise LoweringError(f"kernel call '{var.name}' ({gv.name_hint}) takes symbolic shape arguments")
        args = [self._value(a, f"argument of '{var.name}'") for a in call.args[1].fields]
        if gv.name_hint.startswith(FENCE_PREFIX):
            return args[0]
        device, ops = self._kernel_tags(gv)
        name = gv.name_hint
        if self.kernels.setdefault(name, (self.mod[gv], device))[1] != device:
            raise LoweringError(f"kernel {name} is used on two devices (internal error)")
        entries = self._add_call(var, name, args, device, list(ops))
        attrs = self.mod[gv].attrs
        if name in self.fused_indices:
            self.node_op_indices[self.nodes[-1].name] = self.fused_indices[name]
        elif attrs is not None and OP_INDEX_ATTR in attrs:
            self.node_op_indices[self.nodes[-1].name] = [int(attrs[OP_INDEX_ATTR])]
        return entries

    def _add_call(self, var: relax.Var, name: str, args: list[Any], device: int, ops: list[str]) -> Any:
        """A node calling ``name`` (a kernel or a region) on ``device``; returns its entries."""
        inputs = []
        for arg in args:
            if not isinstance(arg, Entry):
                raise LoweringError(f"call '{var.name}' ({name}) has an argument that is not a tensor")
            inputs.append(arg)
        out_types = list(var.ty.fields) if isinstance(var.ty, relax.TupleType) else [var.ty]
        shapes, dtypes = zip(*(tensor_type(t, f"output of '{var.name}'") for t in out_types))
        node_name = _unique(var.name, self.names)
        self.names.add(node_name)
        self.nodes.append(
            Node(
                name=node_name,
                inputs=inputs,
                func_name=name,
                device=device,
                shapes=list(shapes),
                dtypes=list(dtypes),
                relax_ops=list(ops),
            )
        )
        nid = len(self.nodes) - 1
        if isinstance(var.ty, relax.TupleType):
            return tuple(Entry(nid, i) for i in range(len(out_types)))
        return Entry(nid, 0)

    def _kernel_tags(self, gv: tvm.ir.GlobalVar) -> tuple[int, list[str]]:
        if gv.name_hint in self.fused_tags:
            return self.fused_tags[gv.name_hint]
        attrs = self.mod[gv].attrs
        if attrs is None or DEVICE_ATTR not in attrs:
            raise LoweringError(f"kernel {gv.name_hint} carries no device (internal error)")
        return int(attrs[DEVICE_ATTR]), [str(attrs[OP_ATTR])]

    def _value(self, expr: Any, where: str) -> Any:
        if isinstance(expr, relax.Var):
            if expr not in self.env:
                raise LoweringError(f"{where}: '{expr.name}' is not defined before use")
            return self.env[expr]
        if _is_tensor_const(expr):
            return self.const_entries[expr]
        if isinstance(expr, relax.Tuple):
            return tuple(self._value(f, where) for f in expr.fields)
        return None

    def _flatten(self, value: Any, where: str) -> list[Entry]:
        if isinstance(value, Entry):
            return [value]
        if isinstance(value, tuple):
            return [e for v in value for e in self._flatten(v, where)]
        raise LoweringError(f"{where} holds a value that is not a tensor")


def _drop_dead_kernels(graph: Graph) -> Graph:
    """Remove kernel nodes whose outputs reach no head (null nodes always stay)."""
    live = {e.node for e in graph.heads}
    for nid in range(len(graph.nodes) - 1, -1, -1):
        if nid in live:
            live.update(e.node for e in graph.nodes[nid].inputs)
    keep = [nid for nid, n in enumerate(graph.nodes) if n.is_input or nid in live]
    if len(keep) == len(graph.nodes):
        return graph
    new_id = {old: new for new, old in enumerate(keep)}
    nodes = []
    for old in keep:
        node = graph.nodes[old]
        node.inputs = [Entry(new_id[e.node], e.index) for e in node.inputs]
        nodes.append(node)
    return Graph(nodes, [Entry(new_id[e.node], e.index) for e in graph.heads])


def _clean_kernel(prim: tvm.tirx.PrimFunc, name: str) -> tvm.tirx.PrimFunc:
    for key in (DEVICE_ATTR, OP_ATTR, OP_INDEX_ATTR, "target"):
        if prim.attrs is not None and key in prim.attrs:
            prim = prim.without_attr(key)
    return prim.with_attr("global_symbol", name)




# ---- small helpers --------------------------------------------------------------------------


def _is_region_call(value: Any) -> bool:
    """A call to a function of an external backend (it carries the ``Codegen`` attribute)."""
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)


def _is_static_shape_value(binding: relax.Binding) -> bool:
    """A binding such as ``R.shape_of(x)`` of a static-shaped tensor: a known shape, not a kernel.

    Frontends leave these behind (ONNX Gather, Size, ...); after legalization nothing reads them
    at run time, and a kernel graph has no place for them.
    """
    ty = getattr(binding.var, "ty", None)
    return (
        isinstance(ty, relax.ShapeType)
        and ty.values is not None
        and all(isinstance(v, tvm.tirx.IntImm) for v in ty.values)
    )


def _is_tensor_const(expr: Any) -> bool:
    return isinstance(expr, tvm.ir.Constant) and isinstance(getattr(expr, "ty", None), relax.TensorType)


def _call_name(call: relax.Call) -> str:
    op = call.op
    if isinstance(op, tvm.ir.Op):
        return op.name
    return getattr(op, "name_hint", None) or getattr(op, "global_symbol", None) or type(op).__name__


def _static_type(ty: Any, what: str) -> None:
    if isinstance(ty, relax.TensorType):
        if static_shape(ty) is None or ty.dtype is None or str(ty.dtype) == "":
            raise LoweringError(f"{what}: dynamic shape {ty} is not supported (only static shapes)")
    elif isinstance(ty, relax.TupleType):
        for f in ty.fields:
            _static_type(f, what)


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


