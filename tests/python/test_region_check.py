"""The check after partitioning turns a broken region into a build error that names the region.

A deliberately broken backend (oneDNN's patterns with every check accepting, the behaviour that
once let regions swallow values read outside them) must be stopped, and so must hand-broken
partitioned modules: a region called before its input exists, with the wrong argument count, or
without an anchor op.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm import relax
from tvm.relax.transform import FusionPattern
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_hetero.backends import DnnlBackend
from tvm_hetero.backends.partition import partition_for_backends, region_calls
from tvm_hetero.backends.region_check import PartitionError, check_partitioned

HAS_DNNL = bool(tvm.get_global_func("tvm_hetero.dnnl.available")())
pytestmark = pytest.mark.skipif(not HAS_DNNL, reason="libtvm_hetero was built without oneDNN")
WEIGHTS = frozenset({"w1", "w2"})


@I.ir_module
class ConvReadTwice:
    """``a = conv1(x); t = a + conv2(x); return t * a``: ``a`` is read after the residual add."""

    @R.function
    def main(
        x: R.Tensor((1, 3, 8, 8), "float32"),
        w1: R.Tensor((4, 3, 3, 3), "float32"),
        w2: R.Tensor((4, 3, 3, 3), "float32"),
    ) -> R.Tensor((1, 4, 8, 8), "float32"):
        with R.dataflow():
            a = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
            c = R.nn.conv2d(x, w2, padding=[1, 1, 1, 1])
            t = R.add(a, c)
            y = R.multiply(t, a)
            R.output(y)
        return y


class AcceptEveryMatch(DnnlBackend):
    """oneDNN's patterns with checks that accept every match, leaks included (deliberately broken)."""

    def patterns(self, is_weight):
        accept = lambda _ctx: True
        return [FusionPattern(p.name, p.pattern, p.annotation_patterns, accept) for p in super().patterns(is_weight)]


def partitioned() -> tuple[tvm.IRModule, dict]:
    return partition_for_backends(ConvReadTwice, [DnnlBackend()], "main", WEIGHTS)


def with_bindings(mod: tvm.IRModule, reorder) -> tvm.IRModule:
    func = mod["main"]
    (block,) = func.body.blocks
    body = relax.SeqExpr([relax.DataflowBlock(reorder(list(block.bindings)))], func.body.body)
    out = mod.clone()
    out["main"] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
    return out


def test_correct_partition_passes_and_keeps_conv_output_out_of_the_residual_region():
    mod, regions = partitioned()
    check_partitioned(mod, "main", regions)
    # `a` is read by the multiply, so it cannot be a region's intermediate: two conv regions,
    # the residual add fused with conv2 (right operand), `a` an output of its own region.
    calls = region_calls(mod["main"], regions)
    assert sorted(r.pattern for _v, r in calls) == ["dnnl.conv2d", "dnnl.conv2d_residual"]


def test_a_backend_whose_region_leaks_a_value_is_a_build_error_naming_the_region():
    with pytest.raises(PartitionError, match=r"dnnl region 'fused_relax_nn_conv2d_relax_add\w*_dnnl'"):
        partition_for_backends(ConvReadTwice, [AcceptEveryMatch()], "main", WEIGHTS)
    params = {n: np.ones((4, 3, 3, 3), "float32") for n in WEIGHTS}
    with pytest.raises(PartitionError, match="returns 2 values, not one tensor"):
        tvm_hetero.build(ConvReadTwice, [("cpu:0", "llvm")], params=params, backends=[AcceptEveryMatch()])


def test_region_called_before_its_input_is_defined_is_named():
    mod, regions = partitioned()
    (first_var, _first), (_second_var, second) = region_calls(mod["main"], regions)
    # The residual region reads the first region's output; swap the two calls.
    broken = with_bindings(mod, lambda bs: [bs[1], bs[0], *bs[2:]])
    with pytest.raises(PartitionError, match=rf"dnnl region '{second.name}' .* reads '{first_var.name}' before"):
        check_partitioned(broken, "main", regions)


def test_region_call_with_the_wrong_number_of_arguments_is_named():
    mod, regions = partitioned()

    def extra_argument(bindings):
        b = bindings[0]
        call = b.value
        return [relax.VarBinding(b.var, relax.Call(call.op, [*call.args, call.args[0]])), *bindings[1:]]

    broken = with_bindings(mod, extra_argument)
    name = region_calls(mod["main"], regions)[0][1].name
    with pytest.raises(PartitionError, match=rf"region '{name}' .* called with 3 arguments, its function takes 2"):
        check_partitioned(broken, "main", regions)


def test_region_without_an_anchor_op_is_named():
    mod, regions = partitioned()
    name = next(iter(regions))
    spec = {k: v for k, v in regions[name].spec.items() if k != "op"}
    broken = {**regions, name: dataclasses.replace(regions[name], spec=spec, ops=["relax.add"])}
    with pytest.raises(PartitionError, match=rf"region '{name}' .* holds no anchor op \(ops: relax.add\)"):
        check_partitioned(mod, "main", broken)
