"""Index checks: no gather or scatter reads or writes outside its tensor, whatever the indices hold.

TVM's kernels for ``take`` (mode ``fast``, what ONNX Gather and torch embeddings become),
``gather_elements``, ``gather_nd``, ``scatter_elements``, ``scatter_nd``, ``index_tensor`` and
``index_put`` trust their indices: an index outside the axis reads (or, for scatters, writes) memory
outside the tensor. This pass routes every index argument of those ops through a small check kernel
that runs on the op's device just before it:

- every element ``v`` must lie in ``[-n, n)`` for the extent ``n`` of the axis it selects (for
  ``gather_nd`` / ``scatter_nd`` the extent of the coordinate's axis); a negative one keeps its ONNX
  meaning (``-1`` is the last entry) and is passed on as ``v + n``;
- the first element outside calls the packed function ``tvm_hetero.index_out_of_range`` (registered by
  libtvm_hetero, src/support/index_error.cc), which raises IndexError naming the op (the ONNX node's
  name when the importer kept it as the call's span), the input, the element and the bound; the kernel
  returns that error before the op runs, and the runtime stays usable for the next run.

Indices reach the op through the frontends' own steps: a ``reshape``, an integer ``astype`` (torch
casts token ids to int32: a huge int64 id would wrap to a valid row) and ONNX's negative-index
normalization ``where(x < 0, x + extent, x)`` with the extent computed from shapes. The check reads
the value before those steps (the user's value, which it names in the error) and writes the index the
op takes, so the steps are left without readers and dropped. Constant indices are checked (and
normalized) at build time instead, with a :class:`LoweringError`.

Ops inside a backend's region (an accelerator region's Gather: a vendor may fail its whole graph on any index outside
``[0, n)``, negative ones included, without naming it) are guarded the same way on a TVM device
before the region call, for each index the region takes from outside.

Guarantee: after the pass, every integer index argument of the ops in :data:`INDEX_OPS` of the entry function
(and of the region functions it calls, for indices that are region inputs) is a checked, normalized
value or a constant in ``[0, n)``, of the argument's own type (the pass checks it: a region's parameter
may be int64 where the op inside reads it cast to int32). ``take`` in mode ``wrap`` or ``clip`` selects
safely by itself and is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..ir.relax_helpers import LoweringError, replace_body, same_kind_block, static_shape

#: The packed function a check kernel calls on a bad index (src/support/index_error.cc).
ERROR_FUNCTION = "tvm_hetero.index_out_of_range"
#: Name of the check kernels (the graph nodes running them are named after the op they guard). It
#: sorts before every op's kernel name on purpose: TVM 0.27's LLVM codegen emits a library's kernels in
#: name order, and those emitted before a kernel making a packed call lose the noalias compute function
#: (a 128-row gather ran 4x slower, a small BERT 1.9x); emitted after it, they compile as without checks.
KERNEL_NAME = "_tvm_hetero_check_indices"
#: The op name a check kernel guarding a region carries in the graph (one the report can show).
GUARD_OP = "tvm_hetero.check_indices"
_OPAQUE = 8  # relax OpPatternKind::kOpaque: FuseOps keeps the check a kernel of its own


@dataclass(frozen=True)
class IndexInput:
    """One index argument of an op call: where it sits and the extents it selects within."""

    #: Position of the argument in the call.
    arg: int
    #: Field of a tuple argument (``index_tensor``, ``index_put``), None for a tensor argument.
    field: int | None
    #: The input's name in errors ("indices", "indices[1]").
    name: str
    #: Extent per coordinate: one entry for every element alike, k entries when the last axis of the
    #: index holds k coordinates (``gather_nd``, ``scatter_nd``).
    extents: tuple[int, ...]


def _shape(expr: Any) -> tuple[int, ...]:
    ty = expr.ty
    shape = static_shape(ty) if isinstance(ty, relax.TensorType) else None
    if shape is None:
        raise LoweringError(f"index checks need static shapes, got {ty}")
    return shape


def _axis(shape: tuple[int, ...], axis: Any) -> int:
    axis = int(axis)
    return axis + len(shape) if axis < 0 else axis


def _take(call: relax.Call) -> list[IndexInput]:
    if str(call.attrs.mode) != "fast":  # wrap and clip select inside the axis by themselves
        return []
    data = _shape(call.args[0])
    extent = int(np.prod(data)) if call.attrs.axis is None else data[_axis(data, call.attrs.axis)]
    return [IndexInput(1, None, "indices", (extent,))]


def _along_axis(call: relax.Call) -> list[IndexInput]:
    data = _shape(call.args[0])
    return [IndexInput(1, None, "indices", (data[_axis(data, call.attrs.axis)],))]


def _gather_nd(call: relax.Call) -> list[IndexInput]:
    data, coordinates = _shape(call.args[0]), _shape(call.args[1])[-1]
    batch = int(call.attrs.batch_dims)
    return [IndexInput(1, None, "indices", tuple(data[batch : batch + coordinates]))]


def _scatter_nd(call: relax.Call) -> list[IndexInput]:
    data, coordinates = _shape(call.args[0]), _shape(call.args[1])[-1]
    return [IndexInput(1, None, "indices", tuple(data[:coordinates]))]


def _per_axis_tuple(call: relax.Call) -> list[IndexInput]:
    data, indices = _shape(call.args[0]), call.args[1]
    if not isinstance(indices, relax.Tuple):
        raise LoweringError(f"{call.op.name}: expected a tuple of index tensors, got {type(indices).__name__}")
    return [IndexInput(1, j, f"indices[{j}]", (data[j],)) for j in range(len(indices.fields))]


#: Ops whose arguments select memory: op name -> its index inputs.
INDEX_OPS: dict[str, Callable[[relax.Call], list[IndexInput]]] = {
    "relax.take": _take,
    "relax.gather_elements": _along_axis,
    "relax.scatter_elements": _along_axis,
    "relax.gather_nd": _gather_nd,
    "relax.scatter_nd": _scatter_nd,
    "relax.index_tensor": _per_axis_tuple,
    "relax.index_put": _per_axis_tuple,
}


def CheckIndices(entry: str = "main") -> tvm.transform.Pass:
    """The pass: every index argument of ``entry``'s gathers and scatters checked (see the module)."""

    def run(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return insert_index_checks(mod, entry)[0]

    return tvm.transform.module_pass(run, opt_level=0, name="CheckIndices")


def insert_index_checks(
    mod: tvm.IRModule,
    entry: str = "main",
    regions: Mapping[str, Any] | None = None,
    kernel_free_devices: Collection[int] = (),
) -> tuple[tvm.IRModule, dict[relax.Var, tuple[int, str]]]:
    """``mod`` with checks before the index arguments of ``entry``'s ops and of the calls to the
    ``regions`` (symbol -> :class:`~tvm_hetero.backends.Region`) whose functions index with an input.

    A check before an op is bound right before it, so the lowering gives it the op's device. Returns
    the module and ``{check variable: (device, GUARD_OP)}`` for the checks guarding a region: each
    runs on the region's device, or device 0 where that device runs no TVM kernels.
    """
    func = mod[entry]
    inserter = _CheckInserter(mod, func, regions or {}, set(kernel_free_devices))
    blocks = []
    for block in func.body.blocks:
        bindings: list[relax.Binding] = []
        for binding in block.bindings:
            bindings.extend(inserter.rewrite(binding, isinstance(block, relax.DataflowBlock)))
        blocks.append(same_kind_block(block, bindings))
    if not inserter.changed:
        return mod, {}
    out = inserter.builder.get()
    out[entry] = replace_body(func, blocks)
    return out, inserter.guard_tags


class _CheckInserter:
    """Walks the entry's bindings once; adds one check kernel per (shape, dtypes, extents, names)."""

    def __init__(self, mod: tvm.IRModule, func: relax.Function, regions: Mapping[str, Any],
                 kernel_free: set[int]) -> None:
        self.builder = relax.BlockBuilder(mod)
        self.func = func
        self.regions = regions
        self.kernel_free = kernel_free
        self.bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
        self.kernels: dict[tuple, tvm.ir.GlobalVar] = {}
        self.guard_tags: dict[relax.Var, tuple[int, str]] = {}
        self.changed = False

    def rewrite(self, binding: relax.Binding, dataflow: bool) -> list[relax.Binding]:
        value = binding.value
        if not isinstance(value, relax.Call):
            return [binding]
        if isinstance(value.op, tvm.ir.Op) and value.op.name in INDEX_OPS:
            inputs = INDEX_OPS[value.op.name](value)
            where = _describe(value, binding.var)
            return self._checked(binding, [(i, i.arg, i.field, where) for i in inputs], dataflow)
        region = _region_of(value, self.regions)
        if region is not None:
            device = 0 if region.device in self.kernel_free else region.device
            guarded = list(_region_index_inputs(self.builder.get(), value, self.bound))
            return self._checked(binding, guarded, dataflow, device)
        return [binding]

    def _checked(self, binding: relax.Binding, inputs: list[tuple[IndexInput, int, int | None, str]],
                 dataflow: bool, guard_device: int | None = None) -> list[relax.Binding]:
        call = binding.value
        args = list(call.args)
        fields = {k: list(a.fields) for k, a in enumerate(args) if isinstance(a, relax.Tuple)}
        out: list[relax.Binding] = []
        inputs = [i for i in inputs if _is_int(_arg(args, fields, i[1], i[2]).ty.dtype)]  # bool masks select no memory
        for index, arg, field, where in inputs:
            current = _arg(args, fields, arg, field)
            root = _trace(current, self.bound, _extent_check(index.extents, self.bound))
            name = f"{where}, input '{index.name}'"
            if isinstance(root, tvm.ir.Constant):
                # dtype given: relax.const makes a 0-d int64 array an int32 scalar otherwise
                checked = relax.const(_checked_constant(root.value.numpy(), current, index, name),
                                      str(current.ty.dtype))
            else:
                var_type = relax.DataflowVar if dataflow else relax.Var
                checked = var_type(f"{binding.var.name}_{_slug(index.name)}_checked", current.ty)
                kernel = self._kernel(root, current, index, name, _value_name(root))
                out.append(relax.VarBinding(checked, relax.call_tir(kernel, relax.Tuple([root]), current.ty)))
                if guard_device is not None:
                    self.guard_tags[checked] = (guard_device, GUARD_OP)
            if not tvm_ffi.structural_equal(checked.ty, current.ty):  # the op or region takes it unchanged
                raise LoweringError(f"{name}: the checked index is {checked.ty}, the argument {current.ty}")
            if field is not None:
                fields[arg][field] = checked
            else:
                args[arg] = checked
            self.changed = True
        if not inputs:
            return [binding]
        for k, new_fields in fields.items():
            args[k] = relax.Tuple(new_fields)
        new_call = relax.Call(call.op, args, call.attrs, call.ty_args, call.span)
        out.append(relax.VarBinding(binding.var, self.builder.normalize(new_call)))
        return out

    def _kernel(self, root: Any, target: Any, index: IndexInput, where: str, tensor: str) -> tvm.ir.GlobalVar:
        shape, dtype = _shape(root), str(root.ty.dtype)
        key = (shape, dtype, _shape(target), str(target.ty.dtype), index.extents, where, tensor)
        if key not in self.kernels:
            prim = check_kernel(shape, dtype, str(target.ty.dtype), _shape(target), index.extents, where, tensor)
            self.kernels[key] = self.builder.add_func(prim, KERNEL_NAME)
        return self.kernels[key]


def check_kernel(shape: tuple[int, ...], dtype: str, out_dtype: str, out_shape: tuple[int, ...],
                 extents: tuple[int, ...], where: str, tensor: str) -> tvm.tirx.PrimFunc:
    """The PrimFunc ``(source, checked)``: ``checked`` (of ``out_shape`` and ``out_dtype``, as many
    elements as ``source``) holds each element of ``source`` normalized into ``[0, n)``, where ``n`` is
    ``extents[position % len(extents)]``; the first element outside ``[-n, n)`` calls
    :data:`ERROR_FUNCTION` instead, which raises. Serial on purpose: an error raised inside a parallel
    loop would be reported by every worker that meets a bad index."""
    size = int(np.prod(shape, dtype=np.int64))
    if size != int(np.prod(out_shape, dtype=np.int64)):
        raise LoweringError(f"{where}: the index check reads {shape} but writes {out_shape}")
    unsigned = dtype.startswith("uint")
    k = len(extents)
    extent_of = repr(extents[0]) if k == 1 else _select_extent(extents)
    out_shape_text = repr(tuple(out_shape)) if out_shape else "()"
    bad = "value >= extent" if unsigned else "value < -extent or value >= extent"
    dims = "".join(f", T.int64({d})" for d in shape)
    # An unsigned value above int64's range must not read as a negative one: it is capped first.
    element = f"T.min(source_flat[i], T.{dtype}({2**62}))" if unsigned else "source_flat[i]"
    source = f"""
@T.prim_func(private=True)
def check(source: T.Buffer({tuple(shape)!r}, "{dtype}"), checked: T.Buffer({out_shape_text}, "{out_dtype}")):
    T.func_attr({{"op_pattern": {_OPAQUE}, "tirx.noalias": True}})
    source_flat = T.decl_buffer(({size},), "{dtype}", data=source.data)
    checked_flat = T.decl_buffer(({size},), "{out_dtype}", data=checked.data)
    for i in range(T.int64({size})):
        value: T.int64 = T.Cast("int64", {element})
        extent: T.int64 = T.int64({extent_of})
        if {bad}:
            T.evaluate(T.call_packed("{ERROR_FUNCTION}", {where!r}, {tensor!r}, value, i,
                                     {"T.int64(0)" if unsigned else "-extent"}, extent{dims}))
        checked_flat[i] = T.Cast("{out_dtype}", T.if_then_else(value < T.int64(0), value + extent, value))
"""
    return tvm.script.from_source(source)


def _arg(args: list[Any], fields: dict[int, list[Any]], arg: int, field: int | None) -> Any:
    return fields[arg][field] if field is not None else args[arg]


def _select_extent(extents: tuple[int, ...]) -> str:
    """``extents[i % k]`` as a TVMScript expression (a chain of selects; k is small)."""
    k = len(extents)
    text = f"T.int64({extents[-1]})"
    for j in range(k - 2, -1, -1):
        text = f"T.if_then_else(i % T.int64({k}) == T.int64({j}), T.int64({extents[j]}), {text})"
    return text


def _checked_constant(values: np.ndarray, target: Any, index: IndexInput, where: str) -> np.ndarray:
    """A constant index checked at build time, normalized into ``[0, n)`` like the kernel would."""
    flat = values.reshape(-1).astype(np.int64) if values.dtype.kind in "iu" else None
    if flat is None:
        raise LoweringError(f"{where}: indices of dtype {values.dtype} (expected integers)")
    if values.dtype.kind == "u" and values.size and values.max() > np.iinfo(np.int64).max:
        flat = np.minimum(values.reshape(-1), np.iinfo(np.int64).max).astype(np.int64)
    extents = np.resize(np.asarray(index.extents, dtype=np.int64), flat.size)
    bad = np.flatnonzero((flat < -extents) | (flat >= extents))
    if bad.size:
        at = int(bad[0])
        position = list(np.unravel_index(at, values.shape)) if values.shape else []
        raise LoweringError(
            f"{where}: constant index {int(flat[at])} at [{', '.join(map(str, position))}] is outside "
            f"[{-int(extents[at])}, {int(extents[at])})"
        )
    normalized = np.where(flat < 0, flat + extents, flat)
    return normalized.astype(str(target.ty.dtype)).reshape(_shape(target))


def _reshape_or_cast_source(value: Any) -> Any:
    """The operand of a reshape, or of a cast between integer types; None otherwise."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    if value.op.name == "relax.reshape":
        return value.args[0]
    if value.op.name == "relax.astype":
        source = value.args[0]
        if isinstance(source.ty, relax.TensorType) and _is_int(source.ty.dtype) and _is_int(value.ty.dtype):
            return source
    return None


def _trace(expr: Any, bound: Mapping[relax.Var, Any], extent_ok: Callable[[Any], bool],
           resolve: Callable[[Any], Any] = lambda e: e) -> Any:
    """The value ``expr`` was made from by steps that keep an in-range index's meaning: reshapes,
    integer casts and the frontends' ``where(x < 0, x + extent, x)`` (``extent_ok(extent)``).
    ``resolve`` gives the value behind a function parameter (a region's argument)."""
    for _ in range(64):  # a chain of such steps is short; the bound only guards against a cycle
        value = bound.get(expr) if isinstance(expr, relax.Var) else None
        inner = None if value is None else _reshape_or_cast_source(value)
        if inner is None and value is not None:
            inner = _normalization_source(value, bound, extent_ok, resolve)
        if inner is None:
            return expr
        expr = inner
    return expr


def _normalization_source(value: Any, bound: Mapping[relax.Var, Any], extent_ok: Callable[[Any], bool],
                          resolve: Callable[[Any], Any]) -> Any:
    """``x`` of ``where(less(x, 0), add(x, extent), x)`` with an ``extent`` that ``extent_ok`` accepts
    (the frontends' negative-index normalization, which a check makes redundant); None otherwise."""
    if not _is_op(value, "relax.where"):
        return None
    condition, shifted, x = _bound_value(value.args[0], bound), _bound_value(value.args[1], bound), value.args[2]
    if not (_is_op(condition, "relax.less") and _is_op(shifted, "relax.add")):
        return None
    if not condition.args[0].same_as(x) or not shifted.args[0].same_as(x) or not _is_zero(resolve(condition.args[1])):
        return None
    if _shape(x) != _shape(value.args[2]) or not extent_ok(shifted.args[1]):
        return None
    return x


def _extent_check(extents: tuple[int, ...], bound: Mapping[relax.Var, Any],
                  outer: Callable[[Any], Any] = lambda e: e) -> Callable[[Any], bool]:
    """Whether an ``extent`` added to negative indices is the true one: a constant equal to
    ``extents`` (per coordinate), or a value computed from shapes alone (the frontends' way)."""

    def ok(expr: Any) -> bool:
        expr = outer(expr)
        if isinstance(expr, tvm.ir.Constant):
            values = expr.value.numpy().reshape(-1)
            return values.size in (1, len(extents)) and bool(np.all(values == np.resize(extents, values.size)))
        return _from_shapes(expr, bound)

    return ok


def _from_shapes(expr: Any, bound: Mapping[relax.Var, Any], depth: int = 8) -> bool:
    """Whether ``expr`` is computed from tensor shapes alone (the frontends' axis extents)."""
    value = bound.get(expr) if isinstance(expr, relax.Var) else None
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op) or depth == 0:
        return False
    if value.op.name == "relax.shape_of":
        return True
    if value.op.name not in ("relax.shape_to_tensor", "relax.take", "relax.strided_slice", "relax.astype",
                             "relax.reshape"):
        return False
    tensors = [a for a in value.args if isinstance(a, relax.Var | tvm.ir.Constant)]
    return all(isinstance(a, tvm.ir.Constant) or _from_shapes(a, bound, depth - 1) for a in tensors)


def _region_index_inputs(mod: tvm.IRModule, region_call: relax.Call, entry_bound: Mapping[relax.Var, Any]
                         ) -> Iterator[tuple[IndexInput, int, None, str]]:
    """The index inputs of the ops inside the region ``region_call`` calls that come from the region's
    inputs (through reshapes, casts and normalizations): ``(input, argument position, None, what)``."""
    region = mod[region_call.op]
    params = {p: k for k, p in enumerate(region.params)}
    bound = _flattened(mod, region)

    def outer(expr: Any) -> Any:  # a region parameter is the call's argument
        return region_call.args[params[expr]] if expr in params else expr

    for var, call in bound.items():
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or call.op.name not in INDEX_OPS:
            continue
        for index in INDEX_OPS[call.op.name](call):
            if index.field is not None:
                continue
            source = _trace(call.args[index.arg], bound, _extent_check(index.extents, entry_bound, outer), outer)
            if source in params:
                yield index, params[source], None, f"{_describe(call, var)} in region {region_call.op.name_hint}"


def _flattened(mod: tvm.IRModule, func: relax.Function) -> dict[relax.Var, Any]:
    """``func``'s bindings with each call of a one-op function (a region's composite) replaced by that
    op's call on ``func``'s own values, so that chains across composites read as one."""
    out: dict[relax.Var, Any] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                single = _single_op(mod[value.op], list(value.args))
                value = value if single is None else single
            out[binding.var] = value
    return out


def _single_op(func: Any, args: list[Any]) -> relax.Call | None:
    """The one op call ``func`` makes (through the local composite function it may wrap it in), on
    ``args`` in place of its parameters; None when it makes more or other calls."""
    if not isinstance(func, relax.Function):
        return None
    local, calls = {}, []
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Function):
                local[binding.var] = binding.value
            else:
                calls.append(binding)
    if len(calls) != 1 or not calls[0].var.same_as(func.body.body) or not isinstance(calls[0].value, relax.Call):
        return None
    mapping = dict(zip(func.params, args))
    call = calls[0].value
    inner_args = [mapping.get(a, a) if isinstance(a, relax.Var) else a for a in call.args]
    if isinstance(call.op, relax.Var) and call.op in local:
        return _single_op(local[call.op], inner_args)
    if isinstance(call.op, tvm.ir.Op):
        # The composite's own type (a Call built from parts has none until normalized).
        return relax.Call(call.op, inner_args, call.attrs, call.ty_args, call.span, ret_ty=call.ty)
    return None


def _region_of(call: relax.Call, regions: Mapping[str, Any]) -> Any:
    if isinstance(call.op, tvm.ir.GlobalVar):
        return regions.get(call.op.name_hint)
    return None


def _describe(call: relax.Call, var: relax.Var) -> str:
    """"node 'embed_tokens' (relax.take 'gv')", or "relax.take 'gv'" without a node name."""
    op = f"{call.op.name} '{var.name}'"
    span = call.span
    node = span.source_name.name if span is not None and span.source_name is not None else ""
    return f"node '{node}' ({op})" if node else op


def _value_name(expr: Any) -> str:
    return expr.name if isinstance(expr, relax.Var) else "indices"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def _bound_value(expr: Any, bound: Mapping[relax.Var, Any]) -> Any:
    return bound.get(expr, expr) if isinstance(expr, relax.Var) else expr


def _is_op(value: Any, name: str) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == name


def _is_zero(expr: Any) -> bool:
    return isinstance(expr, tvm.ir.Constant) and expr.value.numpy().size == 1 and int(expr.value.numpy()) == 0


def _is_int(dtype: Any) -> bool:
    return str(dtype).startswith(("int", "uint"))


__all__ = [
    "ERROR_FUNCTION",
    "GUARD_OP",
    "INDEX_OPS",
    "CheckIndices",
    "IndexInput",
    "check_kernel",
    "insert_index_checks",
]
