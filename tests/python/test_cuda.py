"""cpu + cuda through build, runtime (serial and concurrent), placement and the trace: the CUDA kind's
record (asynchronous, its own memory, a completion wait) exercised on a real GPU. Skipped, with the
reason, where TVM sees no CUDA device; CI never has one."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero import devices
from tvm_hetero.testing import models


def _cuda_present() -> bool:
    try:
        return bool(tvm.cuda(0).exist)
    except (RuntimeError, ValueError):
        return False


pytestmark = pytest.mark.skipif(not _cuda_present(), reason="no CUDA device visible to TVM on this machine")

TARGETS = [(tvm.cpu(0), "llvm"), (tvm.cuda(0), "cuda")]


def test_the_cuda_kind_is_asynchronous_with_its_own_memory() -> None:
    kind = devices.kind_of(tvm.cuda(0))
    assert kind.asynchronous and not kind.host_memory and devices.needs_completion_wait(tvm.cuda(0))


@pytest.mark.parametrize("execution", ["serial", "concurrent"])
def test_mlp_split_over_cpu_and_cuda_matches_numpy(execution: str) -> None:
    mod, params = models.mlp()
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    art = tvm_hetero.build(mod, TARGETS, placement={"relax.matmul": 1}, params=params)
    assert art.build_report.num_copies > 0  # separate memory: the edges are copies
    rt = art.create(execution=execution)
    rt.set_input("x", x)
    rt.run()
    h = np.maximum(x @ params["w1"] + params["b1"], 0)
    np.testing.assert_allclose(rt.get_output(0).numpy(), h @ params["w2"], rtol=1e-4, atol=1e-4)


def test_a_trace_span_on_cuda_is_the_kernels_work_not_its_launch() -> None:
    mod, params = models.mlp()
    art = tvm_hetero.build(mod, TARGETS, placement={"relax.matmul": 1}, params=params)
    rt = art.create()
    rt.set_input("x", np.ones((4, 16), "float32"))
    trace = rt.trace()
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)
