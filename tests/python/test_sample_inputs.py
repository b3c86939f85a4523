"""The one maker of sample inputs (tvm_hetero.sample_inputs): dtypes, index bounds, seeding, and the
probe, measuring and fixtures drawing from it."""

from __future__ import annotations

import numpy as np
import pytest
from tvm_hetero.sample_inputs import onnx_index_bounds, onnx_inputs, sample_value, sample_values


def test_each_dtype_gets_its_own_kind_of_value() -> None:
    values = sample_values({"f32": ((64,), "float32"), "f16": ((64,), "float16"), "flag": ((64,), "bool"),
                            "q": ((256,), "int8"), "u": ((256,), "uint8"), "ids": ((64,), "int64"),
                            "i32": ((64,), "int32")}, seed=3, default_bound=5)
    assert {k: v.dtype.name for k, v in values.items()} == {
        "f32": "float32", "f16": "float16", "flag": "bool", "q": "int8", "u": "uint8", "ids": "int64", "i32": "int32"}
    assert values["f32"].std() > 0.5 and values["f32"].min() < 0 < values["f32"].max()  # standard normal
    assert set(np.unique(values["flag"])) == {False, True}
    assert values["q"].min() < -64 and values["q"].max() > 64  # the whole 8-bit range
    assert values["u"].max() > 192
    assert 0 <= values["ids"].min() and values["ids"].max() == 4 and values["i32"].max() < 5
    assert sample_value((3, 0), "float32", np.random.default_rng(0)).shape == (3, 0)


def test_float_styles_keep_their_promises() -> None:
    rng = np.random.default_rng(0)
    uniform = sample_value((4096,), "float32", rng, floats="uniform")
    assert -1.0 <= uniform.min() and uniform.max() <= 1.0
    away = np.abs(sample_value((4096,), "float32", rng, floats="away_from_zero"))
    assert 0.25 <= away.min() and away.max() <= 2.0
    with pytest.raises(ValueError, match="floats='gaussian'"):
        sample_value((2,), "float32", rng, floats="gaussian")
    with pytest.raises(ValueError, match="dtype 'complex64'"):
        sample_value((2,), "complex64", rng)


def test_index_bounds_are_respected_and_the_default_draws_zeros() -> None:
    values = sample_values([("idx", (10_000,), "int64"), ("other", (100,), "int64")], seed=1,
                           index_bounds={"idx": 7})
    assert values["idx"].min() == 0 and values["idx"].max() == 6  # every index of the axis, none beyond
    assert not values["other"].any()  # no bound known: 0, in range of any axis
    with pytest.raises(ValueError, match="index bound of 0"):
        sample_values([("idx", (2,), "int32")], index_bounds={"idx": 0})


def test_the_same_seed_gives_the_same_values_and_another_seed_others() -> None:
    specs = {"x": ((8, 8), "float32"), "i": ((8,), "int32")}
    a, b = sample_values(specs, seed=5, default_bound=9), sample_values(specs, seed=5, default_bound=9)
    c = sample_values(specs, seed=6, default_bound=9)
    assert all(np.array_equal(a[k], b[k]) for k in specs)
    assert not np.array_equal(a["x"], c["x"])
    rng = np.random.default_rng(5)  # a generator continues where it is
    assert np.array_equal(sample_values(specs, rng, default_bound=9)["x"], a["x"])


def test_a_gathers_indices_are_bounded_by_the_axis_it_indexes() -> None:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)], "g",
        [helper.make_tensor_value_info("table", TensorProto.FLOAT, [5, 3]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [64])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    assert onnx_inputs(model) == [("table", [5, 3], "float32"), ("ids", [64], "int64")]
    bounds = onnx_index_bounds(model.SerializeToString())
    assert bounds == {"ids": 5}
    ids = sample_values(onnx_inputs(model), index_bounds=bounds)["ids"]
    assert ids.max() == 4 and ids.min() == 0


def test_the_probe_draws_from_the_shared_maker() -> None:
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    from tvm_hetero.ep_offload.capability_probe import INDEX_BOUND, sample_feeds

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
         helper.make_node("Cast", ["n"], ["n_float"], to=TensorProto.FLOAT),
         helper.make_node("Div", ["x", "x"], ["one"])], "g",
        [helper.make_tensor_value_info("table", TensorProto.FLOAT, [3, 2]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [256]),
         helper.make_tensor_value_info("n", TensorProto.INT32, [256]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT16, [256])],
        [helper.make_tensor_value_info(name, elem, None) for name, elem in
         (("rows", TensorProto.FLOAT), ("n_float", TensorProto.FLOAT), ("one", TensorProto.FLOAT16))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    feeds = sample_feeds(model, seed=2)
    assert feeds["ids"].max() == 2  # the Gather's axis (3), below the probe's own bound
    assert feeds["n"].dtype == np.int32 and feeds["n"].max() == INDEX_BOUND - 1
    assert feeds["x"].dtype == np.float16 and np.abs(feeds["x"]).min() >= 0.25  # away from zero
    again = sample_feeds(model, seed=2)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
