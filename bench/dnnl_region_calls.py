"""Time per oneDNN region call: a chain of small conv+bias+ReLU regions, one thread.

Each region computes little (16 channels, 8x8, 3x3), so the time per call is mostly the call
path itself: pointing memories at the arguments, the reorders in and out of oneDNN's blocked
layout, and the primitive's launch. Built twice: one region per conv (``merge=False``: the time
per region call) and the default, one block holding every conv (the time per step inside a block,
no reorders between steps). Each output is checked against onnxruntime first.

    PYTHONPATH=python python bench/dnnl_region_calls.py [--regions 64] [--repeat 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def chain_model(num: int, channels: int, size: int):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, last = [], [], "x"
    for i in range(num):
        weight = (rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype("float32")
        inits += [
            numpy_helper.from_array(weight, f"W{i}"),
            numpy_helper.from_array(rng.standard_normal(channels).astype("float32"), f"B{i}"),
        ]
        nodes += [
            helper.make_node("Conv", [last, f"W{i}", f"B{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        last = f"r{i}"
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        nodes,
        "conv_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--regions", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["TVM_NUM_THREADS"] = "1"

    import numpy as np
    import onnxruntime as ort
    import tvm
    import tvm_hetero
    from tvm.relax.frontend.onnx import from_onnx

    model = chain_model(args.regions, 16, 8)
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype("float32")
    from tvm_hetero.backends import DnnlBackend

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    expected = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})[0]
    for label, merge in (("region calls (one per conv)", False), ("steps in one block", True)):
        art = tvm_hetero.build(
            from_onnx(model, keep_params_in_input=False), [(tvm.cpu(0), "llvm")], backends=[DnnlBackend(merge=merge)]
        )
        regions = sum(count for _, _, count, _ in art.build_report.backend_regions)
        rt = art.create()
        rt.run(x=x)
        np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            rt.run()
            times.append(time.perf_counter() - start)
        per_conv = statistics.median(times) / args.regions * 1e6
        print(f"{args.regions} convs as {regions} region(s): {per_conv:.2f} us per conv ({label}), median of {args.repeat} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
