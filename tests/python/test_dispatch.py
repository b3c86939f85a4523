"""TVM's library dispatch passes run before legalization, for the target of each op's device.

cumsum, cumprod, sort, argsort and topk have no LegalizeOps rule; TVM's default pipeline
dispatches them (DispatchSortScan) first. Built for two CPU devices they must match numpy, and
with a CPU and a GPU target each op must get its own device's implementation.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_hetero
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_hetero.compiler.dispatch import dispatch_library_ops
from tvm_hetero.compiler.lower import lower_to_graph

TWO_CPUS = [("cpu:0", "llvm"), ("cpu:1", "llvm")]


@I.ir_module
class SortsAndScans:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), i: R.Tensor((2, 8), "int32")):
        with R.dataflow():
            a = R.cumsum(x, axis=1)
            b = R.cumsum(i, axis=1, dtype="int32")
            c = R.sort(x, axis=1, descending=True)
            d = R.argsort(x, axis=1, dtype="int32")
            e = R.topk(x, k=3, axis=1, ret_type="values")
            f = R.cumprod(x, axis=0)
            R.output(a, b, c, d, e, f)
        return (a, b, c, d, e, f)


def alternate(info) -> int:
    return info.index % 2


def test_sorts_and_scans_split_over_two_devices_match_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8)).astype("float32")
    i = rng.integers(-5, 5, (2, 8)).astype("int32")
    art = tvm_hetero.build(SortsAndScans, TWO_CPUS, placement=alternate)
    assert art.build_report.ops_per_device == [3, 3]
    rt = art.create()
    rt.run(x=x, i=i)
    expected = [
        np.cumsum(x, axis=1),
        np.cumsum(i, axis=1).astype("int32"),
        -np.sort(-x, axis=1),
        np.argsort(x, axis=1).astype("int32"),
        -np.sort(-x, axis=1)[:, :3],
        np.cumprod(x, axis=0),
    ]
    assert rt.get_num_outputs() == len(expected)
    for k, want in enumerate(expected):
        got = rt.get_output(k).numpy()
        assert got.dtype == want.dtype, k
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"output {k}")


def test_each_op_is_dispatched_for_its_own_device_target():
    mod = relax.transform.ConvertToDataflow(min_size=1)(SortsAndScans)
    bindings = {b.var.name: b for block in mod["main"].body.blocks for b in block.bindings}
    # The float cumsum on the CPU, the int32 cumsum on a GPU target (nothing is compiled here).
    device_of = {bindings["a"].var: 0, bindings["b"].var: 1}
    out = dispatch_library_ops(mod, "main", device_of, ["llvm", "cuda"])
    kernel_of = {
        b.var.name: b.value.args[0].name_hint
        for block in out["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and b.value.op.same_as(tvm.ir.Op.get("relax.call_tir"))
    }
    assert kernel_of["a"] == "cumsum"  # topi.cumsum, the CPU scan
    assert "gpu_2d_continuous_cumsum" in kernel_of.values()  # TVM's GPU scan for device 1
    # An op with no device in the map stays as it is.
    assert [b.value.op.name for b in out["main"].body.blocks[0].bindings if b.var.name == "c"] == ["relax.sort"]


def test_lowering_for_a_cpu_and_a_gpu_device_keeps_every_op_traced_to_its_device():
    lowered = lower_to_graph(SortsAndScans, alternate, 2, targets=["llvm", "cuda"])
    devices = dict(lowered.kernel_devices)
    assert devices["gpu_2d_continuous_cumsum"] == 1 and devices["cumsum"] == 0
    # The GPU scan's reshapes (the VM's reshape builtin) became kernels of device 1 too.
    assert all(d == 1 for name, d in devices.items() if name.startswith("reshape"))
    ops = {op for node in lowered.graph.nodes for op in node.relax_ops}
    assert {"relax.cumsum", "relax.sort", "relax.argsort", "relax.topk", "relax.cumprod"} <= ops
