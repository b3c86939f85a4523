"""The pipeline executor from Python: two hand-made stage graphs on cpu(0) and cpu(1)."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
import tvm
from conftest import elementwise_kernel, inp, op
from tvm_hetero import graph_runtime, pipeline_runtime
from tvm_hetero.graph import Entry, Graph

DEVICES = [tvm.cpu(0), tvm.cpu(1)]
WIRING = {
    "inputs": ["x", "y"],
    "stages": [
        {"name": "front", "inputs": {"x": "x", "y": "y"}},
        {
            "name": "back",
            "inputs": {"A": {"stage": 0, "output": 0}, "B": {"stage": 0, "output": 1}},
            "params": ["W"],
        },
    ],
    # back's result, and front's second output (a stage output that is also a pipeline output)
    "outputs": [{"stage": 1, "output": 0}, {"stage": 0, "output": 1}],
}
W = np.linspace(0.5, 2.0, 4, dtype="float32")


def front_graph(shape=(4,)) -> str:
    """s = x + y, p = x * y."""
    return Graph(
        [
            inp("x", shape=shape),
            inp("y", shape=shape),
            op("s", "add", [0, 1], 0, shape=shape),
            op("p", "mul", [0, 1], 0, shape=shape),
        ],
        [Entry(2), Entry(3)],
    ).to_json()


def back_graph(shape=(4,)) -> str:
    """q = A * W - B."""
    return Graph(
        [
            inp("A", shape=shape),
            inp("B", shape=shape),
            inp("W", shape=shape),
            op("r", "mul", [0, 2], 0, shape=shape),
            op("q", "sub", [3, 1], 0, shape=shape),
        ],
        [Entry(4)],
    ).to_json()


def make_pipeline(kernels, options=None) -> pipeline_runtime.PipelineModule:
    pipe = pipeline_runtime.create([front_graph(), back_graph()], kernels, DEVICES, WIRING, options)
    pipe.set_params("back", {"W": W})
    return pipe


def sequential(kernels):
    """The same two stages run one after another: the reference."""
    front = graph_runtime.create(front_graph(), kernels, tvm.cpu(0))
    back = graph_runtime.create(back_graph(), kernels, tvm.cpu(1))
    back.set_input(W=W)

    def run(x, y):
        front.run(x=x, y=y)
        back.run(A=front.get_output(0), B=front.get_output(1))
        return [back.get_output(0).numpy(), front.get_output(1).numpy()]

    return run


def random_inputs(count, seed):
    rng = np.random.default_rng(seed)
    return [
        {"x": rng.standard_normal(4).astype("float32"), "y": rng.standard_normal(4).astype("float32")}
        for _ in range(count)
    ]


def assert_bit_identical(got, want, i):
    assert len(got) == len(want)
    for o, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes(), f"inference {i} output {o} differs from the sequential result"


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def test_thousand_inferences_bit_identical_to_sequential(kernels):
    reference = sequential(kernels)
    batch = random_inputs(1000, seed=0)
    with make_pipeline(kernels, {"queue_capacity": 3}) as pipe:
        assert pipe.input_names == ["x", "y"] and pipe.stage_names == ["front", "back"]
        results = pipe.run_batch(batch)
        stats = pipe.stats()
    assert len(results) == 1000
    for i, (inputs, got) in enumerate(zip(batch, results)):
        assert_bit_identical(got, reference(inputs["x"], inputs["y"]), i)
    assert stats["total_inferences"] == 1000 and stats["in_flight"] == 0
    assert stats["throughput"] > 0
    for stage in stats["stages"]:
        assert stage["inferences"] == 1000 and stage["busy_s"] > 0
        assert stage["queue_max"] <= 3
    assert stats["output_queue_max"] <= 3


def test_producer_and_consumer_threads_see_submission_order(kernels):
    reference = sequential(kernels)
    batch = random_inputs(300, seed=1)
    with make_pipeline(kernels) as pipe:
        producer = threading.Thread(target=lambda: [pipe.run(inputs) for inputs in batch])
        producer.start()
        results = [pipe.get_output(block=True) for _ in batch]
        producer.join()
        assert pipe.get_output(block=False) is None
    for i, (inputs, got) in enumerate(zip(batch, results)):
        assert_bit_identical(got, reference(inputs["x"], inputs["y"]), i)


def test_inputs_as_list_and_params_from_bytes(kernels):
    reference = sequential(kernels)
    pipe = pipeline_runtime.create([front_graph(), back_graph()], kernels, DEVICES, WIRING)
    pipe.load_params(None, tvm.runtime.save_param_dict({"W": tvm.runtime.tensor(W)}))
    x, y = random_inputs(1, seed=2)[0].values()
    pipe.run([x, y])
    assert_bit_identical(pipe.get_output(), reference(x, y), 0)
    with pytest.raises(KeyError, match="'nope' is a parameter of no stage"):
        pipe.set_params(None, {"nope": W})
    with pytest.raises(KeyError, match="missing \\['y'\\]"):
        pipe.run({"x": x})
    pipe.close()


@pytest.fixture(scope="module")
def kernels8() -> tvm.runtime.Module:
    """add8 and mul8 over float32[8]: a front stage that works on eight elements."""
    mod = tvm.IRModule(
        {
            "add8": elementwise_kernel("add8", lambda a, b: a + b, shape=(8,)),
            "mul8": elementwise_kernel("mul8", lambda a, b: a * b, shape=(8,)),
        }
    )
    return tvm.compile(mod, "llvm").mod


def failing_pipeline(kernels, kernels8) -> pipeline_runtime.PipelineModule:
    """front works on float32[8]; back's graph says [8] too, but its kernels take [4]: they fail in Run."""
    front = Graph(
        [
            inp("x", shape=(8,)),
            inp("y", shape=(8,)),
            op("s", "add8", [0, 1], 0, shape=(8,)),
            op("p", "mul8", [0, 1], 0, shape=(8,)),
        ],
        [Entry(2), Entry(3)],
    ).to_json()
    pipe = pipeline_runtime.create([front, back_graph(shape=(8,))], [kernels8, kernels], DEVICES, WIRING)
    pipe.set_params(1, {"W": np.ones(8, "float32")})
    return pipe


def test_stage_error_names_the_stage_and_stops_the_pipeline(kernels, kernels8):
    baseline = thread_count()
    pipe = failing_pipeline(kernels, kernels8)
    inputs = {"x": np.ones(8, "float32"), "y": np.ones(8, "float32")}
    pipe.run(inputs)
    with pytest.raises(Exception, match=r"pipeline stage 1 'back' failed: while running node 3 'r'") as info:
        pipe.get_output()
    assert "shape" in str(info.value)  # the kernel's own message survives
    with pytest.raises(Exception, match="pipeline stage 1 'back' failed"):
        pipe.run(inputs)
    assert pipe.stats()["failed"]
    assert thread_count() == baseline  # the failure joined the workers already
    pipe.close()


def test_wiring_errors_name_the_stage_and_input(kernels):
    def create(**changes):
        wiring = {**WIRING, "stages": [dict(s) for s in WIRING["stages"]]}
        wiring["stages"][1].update(changes)
        return pipeline_runtime.create([front_graph(), back_graph()], kernels, DEVICES, wiring)

    with pytest.raises(
        ValueError, match="stage 1 'back': input 'W' is neither wired nor declared a parameter"
    ):
        create(params=[])
    with pytest.raises(
        ValueError, match="stage 1 'back' input 'A': comes from stage 1, which is not an earlier"
    ):
        create(inputs={"A": {"stage": 1, "output": 0}, "B": {"stage": 0, "output": 1}})
    with pytest.raises(KeyError, match="stage 1 'back': wiring names input 'Z'"):
        create(inputs={"Z": "x", "A": {"stage": 0, "output": 0}, "B": {"stage": 0, "output": 1}})
    with pytest.raises(
        ValueError,
        match=r"stage 1 'back' input 'A': stage 0 'front' output 0 is \(4,\) float32, "
        r"the input is \(8,\) float32",
    ):
        pipeline_runtime.create([front_graph(), back_graph(shape=(8,))], kernels, DEVICES, WIRING)
    with pytest.raises(ValueError, match="stage 0 'front': core 4096 does not exist"):
        pipeline_runtime.create(
            [front_graph(), back_graph()], kernels, DEVICES, WIRING, {"stages": [{"cores": [4096]}]}
        )
    with pytest.raises(ValueError, match="unknown field 'num_thread'"):
        create(num_thread=1)


def test_no_thread_outlives_the_pipeline(kernels, kernels8):
    sequential(kernels)(W, W)  # any thread TVM starts for this (main) thread exists from here on
    gc.collect()  # runtimes of earlier tests take their executor threads with them first
    baseline = thread_count()
    options = {"stages": [{"cores": [0], "num_threads": 1}, {"num_threads": 1}]}
    with make_pipeline(kernels, options) as pipe:
        assert thread_count() >= baseline + 2  # a worker per stage
        pipe.run_batch(random_inputs(50, seed=3))
        pipe.run_batch(random_inputs(4, seed=4)[:2])
        for inputs in random_inputs(3, seed=5):
            pipe.run(inputs)  # left in flight on purpose
    assert thread_count() == baseline

    pipe = make_pipeline(kernels)
    for inputs in random_inputs(3, seed=6):
        pipe.run(inputs)
    del pipe  # dropped without close(): the destructor joins the workers
    gc.collect()
    assert thread_count() == baseline

    with failing_pipeline(kernels, kernels8) as pipe:
        pipe.run({"x": np.ones(8, "float32"), "y": np.ones(8, "float32")})
        with pytest.raises(Exception, match="pipeline stage 1 'back' failed"):
            pipe.get_output()
    assert thread_count() == baseline


def test_stages_sharing_memory_hand_frames_along_without_copying_boundaries(kernels):
    # cpu:0 and cpu:1 share memory: each stage reads its inputs from, and writes its outputs into,
    # the pipeline frame's boundary tensors (x, y in; s, p across; q out: 7 copies before frames).
    reference = sequential(kernels)
    batch = random_inputs(200, seed=3)
    with make_pipeline(kernels) as pipe:
        results = pipe.run_batch(batch)
        stats = pipe.stats()
    assert stats["boundary_copies_without_frames"] == 7
    assert stats["boundary_copies"] == 0
    for i, (inputs, got) in enumerate(zip(batch, results)):
        assert_bit_identical(got, reference(inputs["x"], inputs["y"]), i)


def test_a_stage_parameter_loaded_after_creation_reaches_every_frame_and_is_required(kernels):
    pipe = pipeline_runtime.create([front_graph(), back_graph()], kernels, DEVICES, WIRING)
    x = np.ones(4, "float32")
    with pytest.raises(Exception, match="never set: 'W'"):
        pipe.run_batch([{"x": x, "y": x}])
    pipe = make_pipeline(kernels)  # W set after the stages' frames were made
    got = pipe.run_batch([{"x": x, "y": x}])[0]
    assert_bit_identical(got, sequential(kernels)(x, x), 0)
