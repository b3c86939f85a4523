"""The rewrites that prepare a graph for the HTP: constant chains folded, cheap values copied per reader.

Both must keep what the function computes (checked by running it before and after) and change only
what their rule names (checked on the bindings).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R
from tvm_hetero.ep_offload.constant_chains import FoldConstantChains, fold_constant_chains
from tvm_hetero.ep_offload.copy_per_reader import CopyPerReader, copy_per_reader


def _run(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _ops(mod: tvm.IRModule) -> list[str]:
    return [b.value.op.name for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _gather_module() -> tvm.IRModule:
    """What TVM's ONNX frontend makes of a Gather from a quantized table: index normalisation from
    ``shape_of`` of the table, a quantized scalar as ``quantize(constant)``."""
    table = np.arange(-64, 64, dtype="int8").reshape(32, 4)

    @R.function
    def main(ids: R.Tensor((1, 6), "int64"), x: R.Tensor((1, 6, 4), "float32")) -> R.Tensor((1, 6, 4), "float32"):
        with R.dataflow():
            w = R.dequantize(R.const(table), R.const(0.5, "float32"), R.const(0, "int8"), axis=0)
            shape = R.shape_of(w)
            rows = R.shape_to_tensor(shape)
            n = R.take(rows, R.const(0, "int64"), axis=0)
            negative = R.less(ids, R.const(0, "int64"))
            wrapped = R.add(ids, n)
            index = R.where(negative, wrapped, ids)
            looked_up = R.take(w, index, axis=0)
            half_q = R.quantize(R.const(0.5, "float32"), R.const(0.25, "float32"), R.const(0, "uint8"))
            half = R.dequantize(half_q, R.const(0.25, "float32"), R.const(0, "uint8"))
            big = R.broadcast_to(R.const(1.0, "float32"), R.shape([1, 6, 4]))
            bias = R.reshape(R.dequantize(R.const(np.array([3, -2, 1, 5], "int32")), R.const(0.01, "float32"),
                                          R.const(0, "int32")), R.shape([1, 1, 4]))
            y = R.add(R.add(R.multiply(looked_up, half), R.multiply(x, big)), bias)
            R.output(y)
        return y

    return tvm.IRModule({"main": main})


def test_constant_chains_fold_and_the_function_computes_the_same() -> None:
    mod = _gather_module()
    folded = FoldConstantChains()(mod)
    ids = np.array([[0, 3, -1, 31, -32, 7]], "int64")
    x = np.random.default_rng(0).standard_normal((1, 6, 4)).astype("float32")
    np.testing.assert_array_equal(_run(folded, ids, x), _run(mod, ids, x))
    ops = _ops(folded)
    # The table's row count became a constant, the quantized scalar too: no shape_of, no quantize left.
    assert "relax.shape_of" not in ops and "relax.shape_to_tensor" not in ops and "relax.quantize" not in ops
    # The weights' dequantizes stay (a QDQ unit must see its weights), the bias reshaped for its add
    # too, and what reads the ids stays.
    assert ops.count("relax.dequantize") == 3 and "relax.reshape" in ops
    assert "relax.where" in ops and "relax.less" in ops


def test_a_constant_chain_larger_than_what_it_reads_is_not_folded() -> None:
    @R.function
    def main(x: R.Tensor((256, 256), "float32")) -> R.Tensor((256, 256), "float32"):
        with R.dataflow():
            big = R.broadcast_to(R.const(2.0, "float32"), R.shape([256, 256]))  # 256 KiB from 4 bytes
            y = R.multiply(x, big)
            R.output(y)
        return y

    mod = tvm.IRModule({"main": main})
    assert "relax.broadcast_to" in _ops(FoldConstantChains()(mod))


def _shared_module() -> tvm.IRModule:
    """A dequantized activation read by a matmul and a residual add (two QDQ units); a 16-element
    mask made from an input and read by two units; a large input-derived value read twice."""

    @R.function
    def main(q: R.Tensor((1, 16, 8), "uint8"), mask: R.Tensor((1, 16), "int64"),
             big: R.Tensor((64, 128), "float32")) -> R.Tensor((1, 16, 8), "float32"):
        with R.dataflow():
            a = R.dequantize(q, R.const(0.1, "float32"), R.const(128, "uint8"))
            mm = R.matmul(a, R.const(np.eye(8, dtype="float32")))
            mm_q = R.quantize(mm, R.const(0.1, "float32"), R.const(128, "uint8"))
            residual = R.add(R.dequantize(mm_q, R.const(0.1, "float32"), R.const(128, "uint8")), a)
            m1 = R.expand_dims(mask, axis=[2])
            m2 = R.astype(m1, "float32")
            m3 = R.subtract(R.const(1.0, "float32"), m2)
            first = R.add(residual, m3)
            first_q = R.quantize(first, R.const(0.1, "float32"), R.const(128, "uint8"))
            second = R.multiply(R.dequantize(first_q, R.const(0.1, "float32"), R.const(128, "uint8")), m3)
            b2 = R.multiply(big, big)
            s = R.sum(R.add(b2, R.const(1.0, "float32"))) + R.sum(R.multiply(b2, R.const(2.0, "float32")))
            y = R.add(second, s)
            R.output(y)
        return y

    return tvm.IRModule({"main": main})


def test_each_reader_gets_its_own_dequantize_and_small_mask_chain() -> None:
    mod = _shared_module()
    copied = CopyPerReader()(mod)
    rng = np.random.default_rng(1)
    args = (rng.integers(0, 255, (1, 16, 8)).astype("uint8"), (rng.random((1, 16)) > 0.3).astype("int64"),
            rng.standard_normal((64, 128)).astype("float32"))
    np.testing.assert_array_equal(_run(copied, *args), _run(mod, *args))
    before, after = _ops(mod), _ops(copied)
    assert after.count("relax.dequantize") == before.count("relax.dequantize") + 1
    # The mask chain (expand_dims -> astype -> subtract, 16 elements) once per reader.
    for op in ("relax.expand_dims", "relax.astype", "relax.subtract"):
        assert after.count(op) == 2 * before.count(op), op
    # A value of 8192 elements is not small: read twice, computed once.
    assert after.count("relax.multiply") == before.count("relax.multiply")
    # Each copy is read by one binding only.
    func = copied["main"]
    readers: dict = {}
    for block in func.body.blocks:
        for b in block.bindings:
            for used in relax.analysis.free_vars(b.value):
                readers[used] = readers.get(used, 0) + 1
    shared = [b.var.name for block in func.body.blocks for b in block.bindings
              if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
              and b.value.op.name in ("relax.dequantize", "relax.subtract") and readers.get(b.var, 0) > 1]
    assert not shared, shared


def test_nothing_shared_or_constant_means_nothing_changed() -> None:
    @R.function
    def main(q: R.Tensor((4,), "uint8")) -> R.Tensor((4,), "float32"):
        with R.dataflow():
            a = R.dequantize(q, R.const(0.1, "float32"), R.const(0, "uint8"))
            y = R.add(R.multiply(a, a), a)  # one unit reading its dequantize twice (as a decomposed LRN does)
            R.output(y)
        return y

    assert copy_per_reader(main) is main
    assert fold_constant_chains(main) is main


def _pool_module(padding, count_include_pad, size=7) -> tvm.IRModule:
    @R.function
    def main(x: R.Tensor((1, 8, 6, 6), "float32")):
        with R.dataflow():
            y = R.nn.avg_pool2d(x, pool_size=[size, size], strides=[1, 1], padding=padding,
                                count_include_pad=count_include_pad)
            R.output(y)
        return y

    return tvm.IRModule({"main": main})


def test_an_average_pool_over_the_whole_map_becomes_a_mean() -> None:
    """Inception-v1's last pool: 7x7 over 6x6, one row and column of padding bottom-right, not counted."""
    from tvm_hetero.qnn.pool_as_mean import PoolAsMean

    x = np.random.default_rng(2).standard_normal((1, 8, 6, 6)).astype("float32")
    mod = _pool_module([0, 0, 1, 1], False)
    rewritten = PoolAsMean()(mod)
    assert _ops(rewritten) == ["relax.mean"]
    np.testing.assert_allclose(_run(rewritten, x), _run(mod, x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_run(rewritten, x), x.mean(axis=(2, 3), keepdims=True), rtol=1e-6, atol=1e-6)


def test_pools_that_are_not_one_whole_window_stay_pools() -> None:
    from tvm_hetero.qnn.pool_as_mean import PoolAsMean

    counted = _pool_module([0, 0, 1, 1], True)  # the padding is counted: the divisor is 49, not 36
    smaller = _pool_module([0, 0, 0, 0], False, size=3)  # several windows
    for mod in (counted, smaller):
        assert _ops(PoolAsMean()(mod)) == ["relax.nn.avg_pool2d"]
