"""tvm_hetero.pipeline: split, auto_split, build, export/load, create; bits equal to the unsplit graph."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_hetero import pipeline


@I.ir_module
class Net:
    """Five kernels: h1; h2 and h3 share one kernel; y reads h3 and, skipping a stage, h1."""

    @R.function
    def main(
        x: R.Tensor((8, 32), "float32"),
        w1: R.Tensor((32, 64), "float32"),
        b1: R.Tensor((64,), "float32"),
        w2: R.Tensor((64, 64), "float32"),
        w3: R.Tensor((64, 64), "float32"),
        w4: R.Tensor((64, 10), "float32"),
        w5: R.Tensor((64, 10), "float32"),
    ):
        with R.dataflow():
            h1 = R.nn.relu(R.add(R.matmul(x, w1), b1))
            h2 = R.nn.relu(R.matmul(h1, w2))
            h3 = R.nn.relu(R.matmul(h2, w3))
            y = R.add(R.matmul(h3, w4), R.matmul(h1, w5))
            R.output(y, h2)
        return (y, h2)


_rng = np.random.default_rng(0)
PARAMS = {
    name: (_rng.standard_normal(shape) * 0.2).astype("float32")
    for name, shape in {
        "w1": (32, 64), "b1": (64,), "w2": (64, 64), "w3": (64, 64), "w4": (64, 10), "w5": (64, 10),
    }.items()
}  # fmt: skip
KERNELS = ["lv", "gv", "lv1", "lv8", "gv1"]  # node names in the kernel order (see test_kernel_order)
#: The pipelines here run TVM kernels only, compared bit for bit with tvm_hetero.build's TVM kernels
#: (the default, oneDNN, is tested in test_pipeline_backends.py).
TVM_KERNELS = ()
TWO_CORES = len(os.sched_getaffinity(0)) >= 2
PINNED = {"stages": [{"cores": [0], "num_threads": 1}, {"cores": [1 if TWO_CORES else 0], "num_threads": 1}]}


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def inputs(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, 32)).astype("float32")} for _ in range(count)]


def assert_same_bits(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, what
        assert g.tobytes() == w.tobytes(), f"{what}: not bit-identical"


@pytest.fixture(scope="module")
def three_stages() -> pipeline.PipelineArtifact:
    """Stages [lv], [gv, lv1], [lv8, gv1]: the last reads lv from stage 0 directly."""
    return pipeline.build(Net, "llvm", [1, 3], params=PARAMS, backends=TVM_KERNELS)


@pytest.fixture(scope="module")
def unsplit():
    """tvm_hetero.build of the same module on one device (its own compilation)."""
    art = tvm_hetero.build(Net, [(tvm.cpu(0), "llvm")], params=PARAMS, backends=TVM_KERNELS)  # as the pipeline
    runtime = art.create()

    def run(x: np.ndarray) -> list[np.ndarray]:
        runtime.run(x=x)
        return [runtime.get_output(i).numpy() for i in range(runtime.get_num_outputs())]

    return run


# ---- split -------------------------------------------------------------------------------------
def test_kernel_order_is_the_one_device_build_order():
    plan = pipeline.split(Net, [], PARAMS, backends=TVM_KERNELS)
    assert [k.name for k in plan.kernels] == KERNELS
    assert plan.kernels[1].func_name == plan.kernels[2].func_name  # h2 and h3: one kernel
    built = tvm_hetero.build(Net, [(tvm.cpu(0), "llvm")], params=PARAMS, backends=TVM_KERNELS).graph
    assert [n["name"] for n in built["nodes"] if n["op"] != "null"] == KERNELS
    assert "   3 lv8" in plan.describe(kernels=True)


def test_split_points_by_position_or_name_and_boundary_bytes():
    by_position = pipeline.split(Net, [1, 3], PARAMS, backends=TVM_KERNELS)
    by_name = pipeline.split(Net, ["gv", "lv8"], PARAMS, backends=TVM_KERNELS)
    assert by_position.split_points == by_name.split_points == [1, 3]
    assert by_position.ranges() == [(0, 1), (1, 3), (3, 5)]
    # stage 1 receives h1 (8x64 float32); stage 2 receives h3 from stage 1 and h1 from stage 0
    assert by_position.boundary_bytes == [0, 2048, 4096]
    assert by_position.crossing(3) == [(0, 2048), (2, 2048)]
    assert by_position.with_split_points([2]).ranges() == [(0, 2), (2, 5)]


@pytest.mark.parametrize(
    ("points", "error"),
    [
        ([0], "strictly increasing"),
        ([3, 2], "strictly increasing"),
        ([5], "leaves the last stage empty"),
        (["nope"], "'nope' names no kernel node"),
        ([1.5], "a split point is a kernel position"),
    ],
)
def test_split_rejects_points_that_leave_a_stage_empty_or_name_nothing(points, error):
    with pytest.raises((ValueError, TypeError), match=error):
        pipeline.split(Net, points, PARAMS, backends=TVM_KERNELS)


# ---- the dynamic program -----------------------------------------------------------------------
def random_instance(rng: np.random.Generator, n: int, stages: int):
    costs = [list(rng.uniform(1, 10, n)) for _ in range(stages)]
    tensors = []
    for p in range(n - 1):
        users = sorted(set(rng.integers(p + 1, n, rng.integers(1, 3)).tolist()))
        tensors.append((p, users, int(rng.integers(1, 100)) * 64))
    return costs, tensors


def brute_force(costs, tensors, stages: int, copy_bytes_per_us: float):
    """Every cut: (split points, per-stage times, received bytes)."""
    n = len(costs[0])
    for points in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *points, n]
        times, received = [], 0
        for s, (a, b) in enumerate(itertools.pairwise(bounds)):
            into = sum(w for p, users, w in tensors if p < a and any(a <= u < b for u in users))
            out = sum(w for p, users, w in tensors if a <= p < b and max(users) >= b)
            times.append(sum(costs[s][a:b]) + (into + out) / copy_bytes_per_us)
            received += into
        yield list(points), times, received


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("tolerance", [0.0, 0.15])
def test_choose_split_points_matches_brute_force(stages, tolerance):
    rng = np.random.default_rng(stages * 10 + int(tolerance * 100))
    for trial in range(40):
        n = int(rng.integers(stages, 9))
        costs, tensors = random_instance(rng, n, stages)
        points = pipeline.choose_split_points(costs, tensors, tolerance=tolerance, copy_bytes_per_us=500.0)
        cuts = {tuple(p): (max(t), r) for p, t, r in brute_force(costs, tensors, stages, 500.0)}
        best = min(bottleneck for bottleneck, _ in cuts.values())
        allowed = [r for bottleneck, r in cuts.values() if bottleneck <= best * (1 + tolerance) + 1e-9]
        bottleneck, received = cuts[tuple(points)]
        assert bottleneck <= best * (1 + tolerance) + 1e-9, f"trial {trial}: not within tolerance"
        assert received == min(allowed), f"trial {trial}: more boundary bytes than needed"
        if tolerance == 0.0:
            assert bottleneck == pytest.approx(best)


def test_choose_split_points_trades_balance_within_tolerance_for_fewer_bytes():
    # Cutting at 2 balances best (5 | 5) but sends 1000 bytes; at 3, 10 bytes (6 | 4, 20% worse).
    costs = [[2.0, 3.0, 1.0, 4.0]] * 2
    tensors = [(0, [1], 10), (1, [2], 1000), (2, [3], 10)]
    assert pipeline.choose_split_points(costs, tensors, tolerance=0.0, copy_bytes_per_us=None) == [2]
    assert pipeline.choose_split_points(costs, tensors, tolerance=0.25, copy_bytes_per_us=None) == [3]
    assert pipeline.choose_split_points(costs, tensors, tolerance=0.15, copy_bytes_per_us=None) == [2]


# ---- auto_split and build ----------------------------------------------------------------------
def test_auto_split_is_optimal_for_its_measurements_and_build_reuses_its_kernels():
    plan = pipeline.auto_split(Net, 2, "llvm", PARAMS, options=PINNED, rounds=3, backends=TVM_KERNELS)
    assert len(plan.costs_us) == 2 and all(len(c) == len(KERNELS) for c in plan.costs_us)
    assert all(t > 0 for c in plan.costs_us for t in c)
    assert plan.split_points == pipeline.choose_split_points(plan.costs_us, plan.tensors())
    assert len(plan.stage_costs_us) == 2 and plan.ideal_speedup() > 1.0
    art = pipeline.build(Net, ["cpu:0", "cpu:1"], plan, options=PINNED)
    assert art.lib is next(iter(plan.libs.values()))  # compiled once, by auto_split
    assert art.split["split_points"] == plan.split_points
    assert "ideal speedup" in art.report()


def test_build_without_split_points_auto_splits_one_stage_per_device(unsplit):
    art = pipeline.build(Net, ["cpu:0", "cpu:1"], params=PARAMS, options=PINNED, rounds=1, backends=TVM_KERNELS)
    assert art.num_stages == 2 and art.options == PINNED
    batch = inputs(5, seed=3)
    with art.create() as pipe:
        for i, (x, got) in enumerate(zip(batch, pipe.run_batch(batch))):
            assert_same_bits(got, unsplit(x["x"]), f"inference {i}")


def test_wiring_sends_every_tensor_forward(three_stages):
    wiring = three_stages.wiring
    assert wiring["inputs"] == ["x"]
    assert [sorted(s["params"]) for s in wiring["stages"]] == [["b1", "w1"], ["w2", "w3"], ["w4", "w5"]]
    for s, stage in enumerate(wiring["stages"]):
        for source in stage["inputs"].values():
            assert source == "x" or source["stage"] < s
    assert wiring["stages"][2]["inputs"] == {
        "lv": {"stage": 0, "output": 0},
        "lv1": {"stage": 1, "output": 1},
    }
    # y from the last stage; h2 (gv) from stage 1, which also sends it nowhere else
    assert wiring["outputs"] == [{"stage": 2, "output": 0}, {"stage": 1, "output": 0}]


def test_thousand_inferences_bit_identical_to_the_unsplit_graph(three_stages, unsplit):
    baseline = thread_count()
    batch = inputs(1000, seed=1)
    same_lib = three_stages.unsplit().create()
    with three_stages.create(options={"queue_capacity": 3}) as pipe:
        assert pipe.stage_names == ["stage0", "stage1", "stage2"]
        results = pipe.run_batch(batch)
        stats = pipe.stats()
    assert len(results) == 1000 and stats["total_inferences"] == 1000
    for i, (x, got) in enumerate(zip(batch, results)):
        want = unsplit(x["x"])
        assert_same_bits(got, want, f"inference {i} vs tvm_hetero.build")
        if i % 100 == 0:
            same_lib.run(x=x["x"])
            assert_same_bits(
                got, [same_lib.get_output(k).numpy() for k in range(2)], f"inference {i} vs unsplit()"
            )
    assert thread_count() == baseline


def test_export_and_load_round_trip(three_stages, unsplit, tmp_path):
    out = three_stages.export(tmp_path / "pipe")
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "graph.json",
        "lib.so",
        "params.bin",
        "pipeline.json",
        "stage0.json",
        "stage1.json",
        "stage2.json",
    ]
    assert json.loads((out / "pipeline.json").read_text())["format"] == "tvm-hetero-pipeline/2"
    loaded = pipeline.load(out)
    assert loaded.wiring == three_stages.wiring and loaded.stage_targets == three_stages.stage_targets
    assert loaded.split == three_stages.split
    batch = inputs(20, seed=2)
    with loaded.create(options=PINNED) as pipe:
        for i, (x, got) in enumerate(zip(batch, pipe.run_batch(batch))):
            assert_same_bits(got, unsplit(x["x"]), f"loaded, inference {i}")
    with pytest.raises(FileNotFoundError, match="missing pipeline.json"):
        pipeline.load(tmp_path)


def test_create_takes_stage_devices_and_checks_their_number(three_stages):
    with three_stages.create(stage_devices=["cpu:2", tvm.cpu(1), "cpu:0"]) as pipe:
        pipe.run(inputs(1, seed=4)[0])
        assert len(pipe.get_output()) == 2
    with pytest.raises(ValueError, match="2 stage devices for 3 stages"):
        three_stages.create(stage_devices=["cpu:0", "cpu:1"])


@pytest.mark.parametrize("stages", [["cpu:0", "qnn-htp"], ["cpu:0", ("qnn-htp", "llvm")]])
def test_an_htp_stage_is_refused_at_build_naming_the_stage(stages):
    with pytest.raises(ValueError, match=r"stage 1: qnn-htp:0 runs only its vendor's graphs.*not supported yet"):
        pipeline.build(Net, stages, [2], params=PARAMS)


def test_stage_failure_surfaces_at_get_output_naming_the_stage(three_stages):
    # Stage 2's graph claims y is 10x8: its kernel, compiled for 8x10, rejects the buffer in Run.
    graph = json.loads(three_stages.stage_graph_jsons[2])
    row = graph["node_row_ptr"][graph["heads"][0][0]]
    graph["attrs"]["shape"][1][row] = [10, 8]
    broken = pipeline.PipelineArtifact(
        **{
            **three_stages.__dict__,
            "stage_graph_jsons": [*three_stages.stage_graph_jsons[:2], json.dumps(graph)],
        }
    )
    baseline = thread_count()
    pipe = broken.create()
    pipe.run(inputs(1, seed=5)[0])
    with pytest.raises(Exception, match=r"pipeline stage 2 'stage2' failed: while running node \d+ 'gv1'"):
        pipe.get_output()
    assert thread_count() == baseline  # the failure joined every worker
    pipe.close()


def test_create_and_close_leak_no_threads(three_stages):
    baseline = thread_count()
    for _ in range(5):
        with three_stages.create(options=PINNED) as pipe:
            pipe.run(inputs(1, seed=6)[0])
            pipe.get_output()
    assert thread_count() == baseline


def test_stages_with_different_targets_get_their_own_kernel_copies(unsplit):
    # h2 and h3 share one kernel; in stages with different targets each gets its own symbol.
    art = pipeline.build(
        Net, [("cpu:0", "llvm"), ("cpu:1", {"kind": "llvm", "mcpu": "x86-64"})], [2], params=PARAMS,
        backends=TVM_KERNELS,
    )
    funcs = [
        {n["attrs"]["func_name"] for n in json.loads(g)["nodes"] if n["op"] != "null"}
        for g in art.stage_graph_jsons
    ]
    shared = funcs[0] & {f.removesuffix("_t1") for f in funcs[1]}
    assert shared and all(f"{name}_t1" in funcs[1] for name in shared)
    with pytest.raises(ValueError, match="different targets"):
        art.unsplit()
    batch = inputs(5, seed=7)
    with art.create() as pipe:
        for x, got in zip(batch, pipe.run_batch(batch)):
            for g, w in zip(got, unsplit(x["x"])):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
