"""Per-op dispatch overhead: tvm-hetero's graph runtime vs the Relax VM vs a raw C++ loop.

A chain of N tiny ops (float32[1] + 1) is built once in Relax; the Relax VM runs it, and our
runtime runs the same chain with the *same compiled kernels* (the VM executable's own module is
our kernel library). The floor is a bare C++ loop calling that kernel with pre-packed arguments.
All three are measured side by side in one run; ratios are what to read, absolute times are context.

    python bench/dispatch_overhead.py [--ops 500] [--repeat 200]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time

import numpy as np
import tvm
import tvm_ffi
import tvm_hetero
from tvm import relax, te
from tvm_hetero.graph import Entry, Graph, Node


def kernel_call_floor():
    """The bare kernel-call loop from bench/kernel_call_floor.cc (build/libtvm_hetero_bench.so, or
    the file named by TVM_HETERO_BENCH_LIB); loading it registers the function."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("TVM_HETERO_BENCH_LIB", os.path.join(root, "build", "libtvm_hetero_bench.so"))
    if not os.path.exists(path):
        raise SystemExit(f"{path} not found: build the C++ project (cmake --build build) or set TVM_HETERO_BENCH_LIB")
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return tvm_ffi.get_global_func("tvm_hetero.testing.kernel_call_floor_ns")


def build_relax_chain(num_ops: int) -> tvm.IRModule:
    """main(x, one) = add(...add(add(x, one), one)..., one), each add a call_tir of one PrimFunc."""
    a = te.placeholder((1,), "float32", name="a")
    b = te.placeholder((1,), "float32", name="b")
    c = te.compute((1,), lambda i: a[i] + b[i], name="c")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    one = relax.Var("one", relax.TensorType((1,), "float32"))
    with bb.function("main", [x, one]):
        with bb.dataflow():
            gv = bb.add_func(te.create_prim_func([a, b, c]).with_attr("global_symbol", "add_one"), "add_one")
            value = x
            for _ in range(num_ops):
                value = bb.emit(relax.call_tir(gv, (value, one), relax.TensorType((1,), "float32")))
            out = bb.emit_output(value)
        bb.emit_func_output(out)
    return bb.get()


def chain_graph(num_ops: int) -> Graph:
    nodes = [Node("x", op="null", shapes=[(1,)], dtypes=["float32"]),
             Node("one", op="null", shapes=[(1,)], dtypes=["float32"])]
    prev = 0
    for i in range(num_ops):
        nodes.append(Node(f"add{i}", inputs=[Entry(prev), Entry(1)], func_name="add_one",
                          shapes=[(1,)], dtypes=["float32"]))
        prev = len(nodes) - 1
    return Graph(nodes, [Entry(prev)])


def timed(fn, repeat: int) -> float:
    """Median seconds of one call over `repeat` timed calls (after a warm-up)."""
    for _ in range(5):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    n = args.ops

    executable = tvm.compile(build_relax_chain(n), "llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    x = tvm.runtime.tensor(np.zeros(1, "float32"))
    one = tvm.runtime.tensor(np.ones(1, "float32"))
    vm.set_input("main", x, one)
    vm_s = timed(lambda: vm.invoke_stateful("main"), args.repeat)
    vm_out = vm.get_outputs("main").numpy()

    # Same kernels: the VM executable's module, searched through its imports.
    rt = tvm_hetero.graph_runtime.create(chain_graph(n).to_json(), executable.mod, tvm.cpu(0))
    rt.set_input(x=x, one=one)
    run = rt.module["run"]
    ours_s = timed(run, args.repeat)
    assert np.array_equal(rt.get_output(0).numpy(), vm_out), "runtime and VM disagree"

    kernel = executable.mod.get_function("add_one", True)
    out = tvm.runtime.empty((1,), "float32")
    floor_ns = kernel_call_floor()(kernel, 200_000, x, one, out)

    result = {
        "ops": n,
        "floor_ns_per_op": floor_ns,
        "ours_ns_per_op": ours_s / n * 1e9,
        "relax_vm_ns_per_op": vm_s / n * 1e9,
    }
    result["ours_vs_floor"] = result["ours_ns_per_op"] / floor_ns
    result["vm_vs_ours"] = result["relax_vm_ns_per_op"] / result["ours_ns_per_op"]
    # Overhead = time per op above the bare kernel call.
    ours_over = max(result["ours_ns_per_op"] - floor_ns, 1e-3)
    result["vm_overhead_vs_ours_overhead"] = (result["relax_vm_ns_per_op"] - floor_ns) / ours_over
    print(f"chain of {n} ops (float32[1] add), median of {args.repeat} runs")
    print(f"  raw C++ loop (floor) : {floor_ns:8.1f} ns/op")
    print(f"  tvm-hetero runtime   : {result['ours_ns_per_op']:8.1f} ns/op   {result['ours_vs_floor']:.2f}x floor")
    print(f"  Relax VM             : {result['relax_vm_ns_per_op']:8.1f} ns/op   "
          f"{result['vm_vs_ours']:.1f}x ours; overhead above floor {result['vm_overhead_vs_ours_overhead']:.0f}x ours")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
