"""Index checks (compiler/index_checks.py): no index reads or writes outside its tensor.

Every case runs in a child process (index_check_worker.py, one per model, kept for the module): an
out-of-range read or write that crashed would fail the test, not pytest. Each op gets the eight kinds
of bad index (n, n+1, 50,000,000, 2**31-1, -n-1, -1001, -2**31, a huge int64), each an IndexError naming
the node, the input, the value and the bound, each followed by a good run that must still match ONNX
Runtime (the runtime stays usable). In-range indices, negatives included, match ONNX Runtime exactly;
hypothesis draws index tensors in and out of range for every op and for a tiny decoder's token ids.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

N = 1000  # rows of every table (index_check_worker.ROWS)
#: The eight kinds of bad index for an axis of N entries.
BAD = [N, N + 1, 50_000_000, 2**31 - 1, -N - 1, -1001, -(2**31), 2**40 + 7]
WORKER = Path(__file__).with_name("index_check_worker.py")


class IndexWorker:
    """A child process running one model on the index tensors it is sent (index_check_worker.py)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.process = subprocess.Popen([sys.executable, str(WORKER), model], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._read().get("ready"), f"worker {model} did not start"

    def ask(self, values: np.ndarray) -> dict:
        """The worker's answer for one index tensor; a crashed worker fails the calling test."""
        request = {"values": np.asarray(values).tolist(), "dtype": str(np.asarray(values).dtype)}
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # _read reports how the worker died
        return self._read(values)

    def _read(self, values: object = None) -> dict:
        for line in self.process.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        code = self.process.wait()
        tail = self.process.stderr.read()[-2000:]
        pytest.fail(f"worker {self.model} died (exit code {code}) on indices {values}:\n{tail}")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


_workers: dict[str, IndexWorker] = {}


@pytest.fixture(scope="module")
def worker():
    """``worker(model)``: the model's child process, started once for the module."""

    def get(model: str) -> IndexWorker:
        if model not in _workers or _workers[model].process.poll() is not None:
            _workers[model] = IndexWorker(model)
        return _workers[model]

    yield get
    for w in _workers.values():
        w.close()
    _workers.clear()


def assert_matches(answer: dict, what: str) -> None:
    assert answer["ok"], f"{what}: {answer.get('message')}"
    assert answer["matches"], f"{what}: differs from the reference by {answer['max_diff']}"


def assert_index_error(answer: dict, node: str, value: int, low: int, high: int, element: str) -> None:
    assert not answer["ok"], f"index {value} ran without an error"
    assert answer["kind"] == "IndexError", answer
    message = answer["message"]
    assert f"node '{node}'" in message, message
    assert "input 'indices'" in message, message
    assert f"index {value} at {element} is outside [{low}, {high})" in message, message


# ---- the eight bad indices for each op, a good run after each ---------------------------------
OPS = {
    # model: (node, a good index tensor, where the bad value goes, the element's name)
    "gather": ("embed_tokens", np.array([[0, 5, 999], [-1, -1000, 7]]), (1, 2), "ids[1, 2]"),
    "gather_elements": ("pick_rows", np.array([[0, 1, 2, 3], [-1, 500, 999, -1000], [4, 4, 4, 4]]), (2, 1),
                        "ids[2, 1]"),
    "gather_nd": ("lookup_cells", np.array([[0, 0], [-1, 3], [999, -4]]), (1, 0), "ids[1, 0]"),
    "scatter_elements": ("scatter_rows", np.array([[0, 1, 2, 3], [-1, 500, 999, -1000], [0, 1, 2, 3]]),
                         (0, 3), "ids[0, 3]"),
    "scatter_nd": ("scatter_nd_rows", np.array([[0], [-1], [0]]), (2, 0), "ids[2, 0]"),
}


GOOD_IDS = np.array([[0, 5, 999], [-1, -1000, 7]])  # the (2, 3) ids of the gather models


def each_bad_value_raises_then_a_good_run_matches(w: IndexWorker, good: np.ndarray, position: tuple,
                                                   values=BAD, kind: str = "IndexError") -> list[dict]:
    """``good`` matches; then each value put at ``position`` raises ``kind``, and ``good`` matches again
    after it (the runtime stays usable). Returns the answers to the bad ones."""
    assert_matches(w.ask(good), f"{w.model} in range")
    answers = []
    for value in values:
        bad = good.copy()
        bad[position] = value
        answer = w.ask(bad)
        assert not answer["ok"] and answer["kind"] == kind, (value, answer)
        answers.append(answer)
        assert_matches(w.ask(good), f"{w.model} after the bad index {value}")
    return answers


@pytest.mark.parametrize("model", sorted(OPS))
def test_every_bad_index_is_an_error_naming_the_node_and_the_next_run_is_right(worker, model):
    node, good, position, element = OPS[model]
    for value, answer in zip(BAD, each_bad_value_raises_then_a_good_run_matches(worker(model), good, position)):
        assert_index_error(answer, node, value, -N, N, element)
        assert answer["reference_refused"], f"ONNX Runtime accepted {value}"


def test_a_gather_on_another_devices_executor(worker):
    """The check runs on the gather's device (cpu:1, its own executor thread); the error crosses
    back to the caller naming that device, and the next run is right."""
    answers = each_bad_value_raises_then_a_good_run_matches(worker("gather_two_devices"), GOOD_IDS, (1, 1))
    for value, answer in zip(BAD, answers):
        assert_index_error(answer, "embed_tokens", value, -N, N, "ids[1, 1]")
        assert "on device 1 (cpu:1)" in answer["message"], answer


def test_a_gather_on_a_remote_device(worker):
    """The check runs in the remote process with the gather; the error comes back over RPC (kind
    RPCError, the message intact) and the next run is right."""
    values = (N, 50_000_000, -1001, 2**40 + 7)
    answers = each_bad_value_raises_then_a_good_run_matches(worker("gather_remote"), GOOD_IDS, (0, 0), values,
                                                            kind="RPCError")
    for value, answer in zip(values, answers):
        assert "node 'embed_tokens'" in answer["message"] and "input 'indices'" in answer["message"]
        assert f"index {value} at ids[0, 0] is outside [-{N}, {N})" in answer["message"], answer


def test_indices_of_an_htp_region_are_checked_on_the_cpu_before_it(worker):
    """QNN takes the Gather (and ONNX's normalization of negatives) into its region; the check runs on
    the CPU before the region, so QNN never sees a bad index and -1 still means the last row."""
    pytest.importorskip("onnxruntime_qnn")
    for value, answer in zip(BAD, each_bad_value_raises_then_a_good_run_matches(worker("gather_htp"), GOOD_IDS,
                                                                                 (0, 2))):
        assert_index_error(answer, "embed_tokens", value, -N, N, "ids[0, 2]")
        assert "in region" in answer["message"], answer


def test_torch_ids_cast_inside_an_htp_region_are_checked_before_the_cast(worker):
    """torch casts the ids to int32 inside the HTP region: the guard checks the int64 ids (2**32 + 5
    would wrap to row 5) and hands the region int64 ids, as its parameter takes them."""
    pytest.importorskip("onnxruntime_qnn")
    good = np.array([[0, 5, 999], [-1, -1000, 7]])
    answers = each_bad_value_raises_then_a_good_run_matches(worker("torch_embedding_htp"), good, (1, 0),
                                                            [*BAD, 2**32 + 5])
    for value, answer in zip([*BAD, 2**32 + 5], answers):
        assert "relax.take" in answer["message"] and "in region" in answer["message"], answer
        assert f"index {value} at input[1, 0] is outside [-{N}, {N})" in answer["message"], answer


def test_gather_nd_checks_each_coordinate_against_its_own_axis(worker):
    w = worker("gather_nd")
    ok = np.array([[0, 3], [1, -4], [2, 0]])
    assert_matches(w.ask(ok), "coordinates in range")
    for value in (4, -5):
        bad = ok.copy()
        bad[2, 1] = value
        assert_index_error(w.ask(bad), "lookup_cells", value, -4, 4, "ids[2, 1]")


def test_int32_indices(worker):
    w = worker("gather_int32")
    good = np.array([[0, 5, 999], [-1, -1000, 7]], dtype=np.int32)
    assert_matches(w.ask(good), "int32 in range")
    for value in (N, 50_000_000, 2**31 - 1, -(2**31), -1001):
        bad = good.copy()
        bad[0, 1] = value
        assert_index_error(w.ask(bad), "embed_tokens", value, -N, N, "ids[0, 1]")


def test_torch_embedding(worker):
    """``nn.Embedding``: torch casts the ids to int32 before the lookup; a huge int64 id must not wrap
    into a valid row, so the check reads the ids before the cast."""
    w = worker("torch_embedding")
    good = np.array([[0, 5, 999], [3, 2, 1]])
    assert_matches(w.ask(good), "embedding in range")
    for value in [*BAD, 2**32 + 5]:
        bad = good.copy()
        bad[1, 0] = value
        answer = w.ask(bad)
        assert not answer["ok"] and answer["kind"] == "IndexError", (value, answer)
        assert "relax.take" in answer["message"] and "input 'indices'" in answer["message"], answer
        assert f"index {value} at input[1, 0] is outside [-{N}, {N})" in answer["message"], answer
        assert_matches(w.ask(good), f"embedding after {value}")


def test_torch_advanced_indexing(worker):
    """``table[rows, cols]`` (Relax ``index_tensor``): each index tensor against its own axis."""
    w = worker("torch_indexing")
    good = np.array([[0, 5, 999], [1, 2, 7]])
    assert_matches(w.ask(good), "indexing in range")
    assert_matches(w.ask(np.array([[0, -1, -1000], [1, -8, -1]])), "negative indices in range")
    for row, (value, low, high) in [(0, (v, -N, N)) for v in BAD] + [(1, (8, -8, 8)), (1, (-9, -8, 8))]:
        bad = good.copy()
        bad[row, 2] = value
        answer = w.ask(bad)
        assert not answer["ok"] and answer["kind"] == "IndexError", (value, answer)
        assert "relax.index_tensor" in answer["message"] and f"input 'indices[{row}]'" in answer["message"]
        assert f"index {value} at " in answer["message"] and f"is outside [{low}, {high})" in answer["message"]
        assert_matches(w.ask(good), f"indexing after {value}")


# ---- properties: drawn index tensors, in and out of range -------------------------------------
def index_values(shape: tuple[int, ...], extents: tuple[int, ...] = (N,), dtype=np.int64):
    """Index tensors of ``shape`` whose last-axis coordinate j selects within ``extents[j % k]``:
    mostly in range (negatives included), sometimes one value far outside."""
    info = np.iinfo(dtype)
    size = int(np.prod(shape))
    in_range = st.lists(st.integers(0, 10**9), min_size=size, max_size=size)
    return st.tuples(in_range, st.one_of(st.none(), st.tuples(st.integers(0, size - 1), st.one_of(
        st.integers(int(info.min), int(info.max)), st.sampled_from([N, -N - 1, 2**31 - 1, -(2**31)]))))).map(
        lambda drawn: _place(drawn, shape, extents, dtype))


def _place(drawn, shape, extents, dtype):
    raw, bad = drawn
    k = len(extents)
    values = [r % (2 * extents[j % k]) - extents[j % k] for j, r in enumerate(raw)]  # each in [-n, n)
    if bad is not None:
        values[bad[0]] = bad[1]
    return np.array(values, dtype=dtype).reshape(shape)


def in_range(ids: np.ndarray, extents: tuple[int, ...]) -> bool:
    bounds = np.resize(np.asarray(extents), ids.size).reshape(ids.shape)
    return bool(np.all((ids >= -bounds) & (ids < bounds)))


PROPERTY_CASES = {
    "gather": ((2, 3), (N,)),
    "gather_int32": ((2, 3), (N,)),
    "gather_elements": ((3, 4), (N,)),
    "gather_nd": ((3, 2), (N, 4)),
    "scatter_elements": ((3, 4), (N,)),
    "scatter_nd": ((3, 1), (N,)),
    "torch_embedding": ((2, 3), (N,)),
    "tiny_decoder": ((1, 8), (N,)),
}


@pytest.mark.parametrize("model", sorted(PROPERTY_CASES))
def test_drawn_indices_match_the_reference_or_raise(worker, model):
    shape, extents = PROPERTY_CASES[model]
    dtype = np.int32 if model == "gather_int32" else np.int64
    w = worker(model)

    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(index_values(shape, extents, dtype))
    def check(ids):
        answer = w.ask(ids)
        if in_range(ids, extents):
            assert_matches(answer, f"{model} {ids.tolist()}")
        else:
            assert not answer["ok"] and answer["kind"] == "IndexError", (ids.tolist(), answer)
            assert "outside [" in answer["message"], answer

    check()


# ---- the pass itself, on lowered graphs (nothing runs: in process) ------------------------------
def gather_module(indices=None, index_shape=(4,)):
    """An ONNX Gather (node "embed_tokens") over a 1000 x 8 table, then a Relu; ``indices`` given:
    a constant index tensor instead of the input."""
    import onnx
    from onnx import TensorProto, helper
    from tvm_hetero import importers

    table = np.zeros((N, 8), dtype=np.float32)
    inits = [onnx.numpy_helper.from_array(table, "table")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*index_shape, 8])]
    if indices is None:
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, list(index_shape)))
    else:
        inits.append(onnx.numpy_helper.from_array(np.asarray(indices, dtype=np.int64), "ids"))
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed_tokens", axis=0),
             helper.make_node("Add", ["rows", "x"], ["sum"], name="add"),
             helper.make_node("Relu", ["sum"], ["out"], name="relu")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT,
                                                                              [*index_shape, 8])], inits)
    return importers.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_the_check_runs_on_the_ops_device_right_before_it():
    from tvm_hetero.compiler.lower import lower_to_graph

    lowered = lower_to_graph(gather_module(), lambda info: 1 if info.op == "relax.take" else 0, 2)
    nodes = lowered.graph.nodes
    check = next(i for i, n in enumerate(nodes) if n.func_name.startswith("_tvm_hetero_check_indices"))
    gather = next(i for i, n in enumerate(nodes) if any(e.node == check for e in n.inputs))
    assert nodes[check].device == nodes[gather].device == 1
    assert nodes[gather].relax_ops == ["relax.take"]
    assert nodes[nodes[check].inputs[0].node].name == "ids"  # the user's ids, before ONNX's normalization
    assert not any("where" in op for n in nodes for op in n.relax_ops)  # that normalization is dropped


def test_check_kernels_sort_before_every_other_kernel():
    """TVM 0.27 compiles the kernels emitted before a packed call without their noalias compute
    function (a gather 4x slower): the check kernels' names must sort first."""
    from tvm_hetero.compiler.lower import lower_to_graph

    names = sorted(gv.name_hint for gv in lower_to_graph(gather_module(), None, 1).kernels.functions)
    assert names[0].startswith("_tvm_hetero_check_indices"), names


def constant_index_module(indices):
    """``take(data, constant indices)`` (a gather whose table is an input, so nothing folds it)."""
    from tvm import relax

    builder = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType((N, 2), "float32"))
    with builder.function("main", [data]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.take(data, relax.const(np.asarray(indices, "int64")), axis=0))
        builder.emit_func_output(out)
    return builder.get()


def test_constant_indices_are_checked_and_normalized_at_build_time():
    from tvm_hetero.compiler.lower import lower_to_graph
    from tvm_hetero.ir.relax_helpers import LoweringError

    lowered = lower_to_graph(constant_index_module([3, -1, 0, 999]), None, 1)
    assert not any(n.func_name.startswith("_tvm_hetero_check") for n in lowered.graph.nodes)
    assert [v.tolist() for v in lowered.params.values()] == [[3, N - 1, 0, 999]]
    with pytest.raises(LoweringError, match=r"relax.take 'gv', input 'indices': constant index 1000 at \[2\] "
                                            r"is outside \[-1000, 1000\)"):
        lower_to_graph(constant_index_module([3, -1, 1000, 0]), None, 1)


def test_take_in_wrap_mode_is_left_alone():
    import tvm
    from tvm import relax
    from tvm_hetero.compiler.index_checks import CheckIndices

    builder = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType((5, 2), "float32"))
    ids = relax.Var("ids", relax.TensorType((3,), "int64"))
    with builder.function("main", [data, ids]):
        with builder.dataflow():
            wrapped = builder.emit(relax.op.take(data, ids, axis=0, mode="wrap"))
            fast = builder.emit_output(relax.op.take(wrapped, ids, axis=0))
        builder.emit_func_output(fast)
    checked = tvm.transform.Sequential([CheckIndices()])(builder.get())  # a pass users can put in theirs
    calls = [b.value for blk in checked["main"].body.blocks for b in blk.bindings]
    assert [str(c.op.name) for c in calls] == ["relax.take", "relax.call_tir", "relax.take"]


def region_module():
    """A stand-in for two HTP regions as the partitioner leaves them, each op in a one-op function:
    ``embed_qnn`` casts its int64 ids to int32 (in a composite, as QNN's patterns wrap it), then takes
    rows of a 1000-row table (torch's embedding); ``pool_qnn`` takes position -1 of 8 with an int64
    scalar constant (BERT's pooler)."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Module:
        @R.function(private=True)
        def cast(x: R.Tensor((1, 8), "int64")) -> R.Tensor((1, 8), "int32"):
            @R.function
            def local_func(x1: R.Tensor((1, 8), "int64")) -> R.Tensor((1, 8), "int32"):
                R.func_attr({"Composite": "qnn.astype"})
                with R.dataflow():
                    gv = R.astype(x1, "int32")
                    R.output(gv)
                return gv

            output = local_func(x)
            return output

        @R.function(private=True)
        def lookup(t: R.Tensor((N, 4), "float32"), i: R.Tensor((1, 8), "int32")
                   ) -> R.Tensor((1, 8, 4), "float32"):
            gv = R.take(t, i, axis=0)
            return gv

        @R.function(private=True)
        def pick(h: R.Tensor((1, 8, 4), "float32"), i: R.Tensor((), "int64")) -> R.Tensor((1, 4), "float32"):
            gv = R.take(h, i, axis=1)
            return gv

        @R.function(private=True)
        def embed_qnn(in0: R.Tensor((1, 8), "int64"), in1: R.Tensor((N, 4), "float32")
                      ) -> R.Tensor((1, 8, 4), "float32"):
            cls = Module
            step0 = cls.cast(in0)
            step1 = cls.lookup(in1, step0)
            return step1

        @R.function(private=True)
        def pool_qnn(in0: R.Tensor((1, 8, 4), "float32"), in1: R.Tensor((), "int64")
                     ) -> R.Tensor((1, 4), "float32"):
            cls = Module
            step0 = cls.pick(in0, in1)
            return step0

        @R.function
        def main(ids: R.Tensor((1, 8), "int64"), table: R.Tensor((N, 4), "float32")
                 ) -> R.Tensor((1, 4), "float32"):
            cls = Module
            with R.dataflow():
                rows = cls.embed_qnn(ids, table)
                pooled = cls.pool_qnn(rows, R.const(-1, "int64"))
                R.output(pooled)
            return pooled

    return Module


def test_a_region_guard_checks_before_the_regions_cast_and_keeps_its_parameter_types():
    """The guard reads the int64 ids (before the region's cast could wrap a huge one into range) and
    hands each region exactly its parameters' types: int64 ids, and the constant -1 checked and
    normalized to 7 at build time, still an int64 scalar."""
    from types import SimpleNamespace

    from tvm import relax
    from tvm_hetero.compiler.index_checks import GUARD_OP, insert_index_checks

    mod = region_module()
    regions = {"embed_qnn": SimpleNamespace(device=1), "pool_qnn": SimpleNamespace(device=1)}
    checked, guards = insert_index_checks(mod, "main", regions)
    relax.analysis.well_formed(relax.transform.Normalize()(checked))  # raises on a type mismatch
    bindings = {b.var.name: b.value for blk in checked["main"].body.blocks for b in blk.bindings}
    guard = bindings["rows_indices_checked"]
    assert guard.op.name == "relax.call_tir" and [a.name for a in guard.args[1].fields] == ["ids"]
    assert str(guard.args[1].fields[0].ty) == 'R.Tensor((1, 8), dtype="int64")'  # the kernel reads ids uncast
    embed, pool = bindings["rows"], bindings["pooled"]
    assert embed.args[0].name == "rows_indices_checked"
    assert str(embed.args[0].ty) == str(mod["embed_qnn"].params[0].ty) == 'R.Tensor((1, 8), dtype="int64")'
    assert str(pool.args[1].ty) == str(mod["pool_qnn"].params[1].ty) == 'R.Tensor((), dtype="int64")'
    assert int(pool.args[1].value.numpy()) == 7
    assert [tag for var, tag in guards.items() if var.name == "rows_indices_checked"] == [(1, GUARD_OP)]
