"""Export a small MLP split over cpu:0 and cpu:1 as an artifact directory, and save the expected
output of examples/run_artifact.cc's ramp input next to it (used by the C++ test)."""

import sys

import numpy as np
import tvm
import tvm_hetero
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class MLP:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"), w1: R.Tensor((16, 32), "float32"),
             b1: R.Tensor((32,), "float32"), w2: R.Tensor((32, 8), "float32")):
        with R.dataflow():
            h = R.nn.relu(R.add(R.matmul(x, w1), b1))
            y = R.matmul(h, w2)
            R.output(y)
        return y


def main(out_dir: str) -> None:
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((16, 32)).astype("float32"),
              "b1": rng.standard_normal(32).astype("float32"),
              "w2": rng.standard_normal((32, 8)).astype("float32")}
    art = tvm_hetero.build(MLP, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], placement={"matmul": 1},
                           params=params)
    art.export(out_dir)
    x = (np.arange(64) % 17 / 17.0 - 0.5).astype("float32").reshape(4, 16)
    expected = np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"]
    print(f"expected output sum {expected.sum():.6f}")
    with open(f"{out_dir}/expected_sum.txt", "w") as f:
        f.write(f"{expected.sum():.6f}\n")


if __name__ == "__main__":
    main(sys.argv[1])
