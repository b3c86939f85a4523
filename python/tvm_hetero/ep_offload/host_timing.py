"""The child process of :func:`tvm_hetero.ep_offload.auto_placement.host_time`: one offload group (its plain
ONNX model) built for the host device alone with tvm-hetero's default backends, then timed there; prints
the fastest of ``HOST_RUNS`` runs in seconds. Run as ``python -m tvm_hetero.ep_offload.host_timing JOB``;
nothing imports it (it imports the whole package).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from tvm_hetero import build
from tvm_hetero.ep_offload.auto_placement import HOST_RUNS
from tvm_hetero.importers import from_onnx


def _time_alone(job: dict) -> float:
    """The child's job: build the group for the host device and time it."""
    import onnx
    import tvm

    proto = onnx.load(job["model"])
    device = tvm.runtime.device(*job["device"])
    art = build(from_onnx(proto), [(device, job["target"])])
    runtime = art.create(execution="serial")
    rng = np.random.default_rng(0)
    for value in proto.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        data = (rng.standard_normal(shape) if np.issubdtype(dtype, np.floating)
                else rng.integers(0, 8, size=shape)).astype(dtype)
        runtime.set_input(value.name, data)
    runtime.run()  # warm-up: first touch of memory, oneDNN's primitive creation
    times = []
    for _ in range(HOST_RUNS):
        start = time.perf_counter()
        runtime.run()
        times.append(time.perf_counter() - start)
    runtime.close()
    return min(times)


if __name__ == "__main__":
    print(_time_alone(json.loads(sys.argv[1])))
