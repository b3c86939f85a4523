"""Export a small MLP split over cpu:0 and cpu:1 as an artifact directory, and save the expected
output of examples/run_artifact.cc's ramp input next to it (used by the C++ test)."""

import sys

import numpy as np
import tvm
import tvm_hetero
from tvm_hetero.testing import models


def main(out_dir: str) -> None:
    mlp, params = models.mlp()
    art = tvm_hetero.build(mlp, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], placement={"matmul": 1},
                           params=params)
    art.export(out_dir)
    x = (np.arange(64) % 17 / 17.0 - 0.5).astype("float32").reshape(4, 16)
    expected = np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"]
    print(f"expected output sum {expected.sum():.6f}")
    with open(f"{out_dir}/expected_sum.txt", "w") as f:
        f.write(f"{expected.sum():.6f}\n")


if __name__ == "__main__":
    main(sys.argv[1])
