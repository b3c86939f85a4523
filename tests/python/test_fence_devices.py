"""Tests of compiler/fence_devices.py: the pass that keeps FuseOps from joining two devices."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_hetero.compiler.fence_devices import FENCE_PREFIX, FenceDeviceBoundaries
from tvm_hetero.ir.relax_helpers import DEVICE_ATTR


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            a = R.add(x, x)
            b = R.multiply(a, a)
            R.output(b)
        return b


def _legalized_on(devices: dict[str, int]) -> tvm.IRModule:
    """Chain legalized, each PrimFunc tagged with the device ``devices[name]``."""
    mod = relax.transform.LegalizeOps()(Chain)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc):
            mod.update_func(gv, func.with_attr(DEVICE_ATTR, devices[gv.name_hint]))
    return mod


def _fused_groups(mod: tvm.IRModule) -> list[set[str]]:
    """The kernels each fused (``Primitive``) function calls."""
    mod = relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(mod))
    groups = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and func.attrs is not None and "Primitive" in func.attrs:
            groups.append(
                {
                    b.value.args[0].name_hint
                    for block in func.body.blocks
                    for b in block.bindings
                    if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
                    and b.value.op.name == "relax.call_tir"
                }
            )
    return groups


def _fences(mod: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.startswith(FENCE_PREFIX)]


def test_an_edge_between_devices_gets_one_opaque_fence_and_fusion_stops_there() -> None:
    fenced = FenceDeviceBoundaries("main")(_legalized_on({"add": 0, "multiply": 1}))
    assert _fences(fenced) == [f"{FENCE_PREFIX}_0"]
    assert int(fenced[f"{FENCE_PREFIX}_0"].attrs["op_pattern"]) == 8  # opaque
    groups = _fused_groups(fenced)
    assert not any({"add", "multiply"} <= g for g in groups), groups


def test_the_same_device_is_not_fenced_and_fuses() -> None:
    mod = _legalized_on({"add": 1, "multiply": 1})
    fenced = FenceDeviceBoundaries("main")(mod)
    assert _fences(fenced) == []
    assert any({"add", "multiply"} <= g for g in _fused_groups(fenced))


def test_without_the_pass_two_devices_would_fuse() -> None:
    # Why the pass exists: FuseOps alone joins the kernels of two devices into one group.
    assert any({"add", "multiply"} <= g for g in _fused_groups(_legalized_on({"add": 0, "multiply": 1})))
