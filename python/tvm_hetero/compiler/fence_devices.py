"""The device-fence pass: no fused kernel can hold two devices.

Every dataflow edge from a kernel on one device to a kernel on another goes through an identity
``call_tir`` whose PrimFunc is marked opaque (``op_pattern`` 8). ``FuseOps`` never fuses an
opaque call nor fuses across one, so no fused group can hold two devices; tuples that gather
values of several devices are fenced the same way. The fences are aliases and disappear when the
graph is built (lower.py, step 4).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, te

from ..backends import Region
from ..backends.partition import region_of
from ..ir.relax_helpers import (
    DEVICE_ATTR,
    is_alias_op,
    is_call_tir,
    replace_body,
    same_kind_block,
    tensor_type,
)

FENCE_PREFIX = "tvm_hetero_fence"


OPAQUE = 8  # relax OpPatternKind::kOpaque


def FenceDeviceBoundaries(entry: str = "main", regions: dict[str, Region] | None = None) -> tvm.transform.Pass:
    """The pass: route every cross-device dataflow edge of ``entry`` through an opaque identity kernel.

    Every PrimFunc called from ``entry`` must have the ``"tvm_hetero.device"`` attribute (lowering
    step 3 sets it); calls to the external-backend functions in ``regions`` run on the region's
    device. A following ``FuseOps`` then keeps each device's kernels apart.
    """
    return tvm.transform.module_pass(
        lambda mod, _ctx: _DeviceFencer(mod, regions or {}).run(entry), opt_level=0, name="FenceDeviceBoundaries"
    )


class _DeviceFencer:
    """Inserts fences in one pass over the bindings, tracking the device each value comes from."""

    def __init__(self, mod: tvm.IRModule, regions: dict[str, Region]) -> None:
        self.mod = mod
        self.regions = regions  # calls to these run on the region's device
        self.builder = relax.BlockBuilder(mod)
        self.device_of: dict[relax.Var, int | None] = {}  # producer device of each bound value
        self.bound: dict[relax.Var, Any] = {}  # original value of each binding
        self.kernels: dict[tuple, tvm.ir.GlobalVar] = {}  # (shape, dtype) -> identity kernel
        self.bindings: list[relax.Binding] = []  # the block being rebuilt
        self.fenced: dict[tuple[relax.Var, int], relax.Var] = {}  # fences of that block
        self.dataflow = True

    def run(self, entry: str) -> tvm.IRModule:
        func = self.mod[entry]
        blocks = []
        for block in func.body.blocks:
            self.bindings, self.fenced = [], {}
            self.dataflow = isinstance(block, relax.DataflowBlock)
            for binding in block.bindings:
                self.bound[binding.var] = binding.value
                self.bindings.append(self._visit(binding))
            blocks.append(same_kind_block(block, self.bindings))
        self.builder.update_func(
            self.mod.get_global_var(entry), self.builder.normalize(replace_body(func, blocks))
        )
        return self.builder.get()

    def _visit(self, binding: relax.Binding) -> relax.Binding:
        var, value = binding.var, binding.value
        if is_call_tir(value):
            device = int(self.mod[value.args[0]].attrs[DEVICE_ATTR])
            self.device_of[var] = device
            fields = [self._fenced_for(arg, device) for arg in value.args[1].fields]
            new_args = [value.args[0], relax.Tuple(fields), *value.args[2:]]
            return relax.VarBinding(var, relax.Call(value.op, new_args, value.attrs, value.ty_args))
        region = region_of(value, self.regions)
        if region is not None:
            self.device_of[var] = region.device
            args = [self._fenced_for(arg, region.device) for arg in value.args]
            return relax.VarBinding(var, relax.Call(value.op, args, value.attrs, value.ty_args))
        if isinstance(value, relax.Tuple):
            # A tuple may gather values of several devices; FuseOps could join their producers
            # through it, so all but the first device's fields are fenced.
            first = next((d for d in map(self._device, value.fields) if d is not None), None)
            if first is not None:
                fields = [self._fenced_for(f, first) for f in value.fields]
                return relax.VarBinding(var, relax.Tuple(fields))
        elif isinstance(value, relax.TupleGetItem):
            source = self.bound.get(value.tuple_value)
            if isinstance(source, relax.Tuple):
                self.device_of[var] = self._device(source.fields[value.index])
            else:
                self.device_of[var] = self._device(value.tuple_value)
        elif isinstance(value, relax.Var):
            self.device_of[var] = self._device(value)
        elif is_alias_op(value):
            self.device_of[var] = self._device(value.args[0])
        return binding

    def _device(self, expr: Any) -> int | None:
        return self.device_of.get(expr) if isinstance(expr, relax.Var) else None

    def _fenced_for(self, expr: Any, device: int) -> Any:
        """``expr`` as read on ``device``: itself, or a fence if it comes from another device."""
        source = self._device(expr)
        if source is None or source == device:
            return expr
        if (expr, device) not in self.fenced:
            var_type = relax.DataflowVar if self.dataflow else relax.Var
            fence = var_type(f"{expr.name}_to_dev{device}", expr.ty)
            call = relax.call_tir(self._identity_kernel(expr.ty), relax.Tuple([expr]), expr.ty)
            self.bindings.append(relax.VarBinding(fence, call))
            self.fenced[(expr, device)] = fence
        return self.fenced[(expr, device)]

    def _identity_kernel(self, ty: relax.TensorType) -> tvm.ir.GlobalVar:
        shape, dtype = tensor_type(ty, "value crossing devices")
        if (shape, dtype) not in self.kernels:
            prim = _identity_prim_func(shape, dtype).with_attr("op_pattern", OPAQUE)
            name = f"{FENCE_PREFIX}_{len(self.kernels)}"
            self.kernels[(shape, dtype)] = self.builder.add_func(prim, name)
        return self.kernels[(shape, dtype)]


def _identity_prim_func(shape: tuple[int, ...], dtype: str) -> tvm.tirx.PrimFunc:
    src = te.placeholder(shape, dtype, name="src")
    dst = te.compute(shape, lambda *i: src(*i), name="dst")
    return te.create_prim_func([src, dst])

