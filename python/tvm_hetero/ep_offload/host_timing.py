"""The child process of :func:`tvm_hetero.ep_offload.auto_placement.host_time`: one offload group (its plain
ONNX model) built for the host device alone with tvm-hetero's default backends, then timed there; replies
the fastest of ``HOST_RUNS`` runs in seconds. Run as ``python -m tvm_hetero.ep_offload.host_timing WORKDIR``
(:func:`.child_process.run_once`); nothing imports it (it imports the whole package).
"""

from __future__ import annotations

from tvm_hetero import build
from tvm_hetero.ep_offload.auto_placement import HOST_RUNS
from tvm_hetero.ep_offload.child_process import serve_once
from tvm_hetero.importers import from_onnx
from tvm_hetero.runtime.measure import wall_times
from tvm_hetero.sample_inputs import onnx_index_bounds, onnx_inputs, sample_values


def _time_alone(job: dict) -> float:
    """The child's job: build the group for the host device and time it (inputs seeded, a Gather's
    indices within the axis it indexes)."""
    import onnx
    import tvm

    proto = onnx.load_from_string(job["model"])
    device = tvm.runtime.device(*job["device"])
    art = build(from_onnx(proto), [(device, job["target"])])
    runtime = art.create(execution="serial")
    for name, value in sample_values(onnx_inputs(proto), index_bounds=onnx_index_bounds(job["model"])).items():
        runtime.set_input(name, value)
    runtime.run()  # warm-up: first touch of memory, oneDNN's primitive creation
    times = wall_times(runtime.run, HOST_RUNS)
    runtime.close()
    return min(times)


if __name__ == "__main__":
    raise SystemExit(serve_once(_time_alone))
