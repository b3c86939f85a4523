"""tvm_hetero.build end to end: Relax in, a runnable artifact out; export/load; report; CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm import relax
from tvm_hetero import cli
from tvm_hetero.testing import models

TWO_CPUS = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]


MLP, PARAMS = models.mlp()
rng = np.random.default_rng(0)
X = rng.standard_normal((4, 16)).astype("float32")


def relax_vm_output(mod, inputs):
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(v) for v in inputs]).numpy()


@pytest.mark.parametrize("placement", [None, {"matmul": 1}, {"relax.nn.relu": 1, "add": 1},
                                       lambda info: info.index % 2])
def test_mlp_matches_relax_vm_under_any_placement(placement):
    art = tvm_hetero.build(MLP, TWO_CPUS, placement=placement, params=PARAMS)
    rt = art.create()
    rt.run(x=X)
    expected = relax_vm_output(MLP, [X, PARAMS["w1"], PARAMS["b1"], PARAMS["w2"]])
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert rt.get_output(0).device == tvm.cpu(0)  # outputs end on the primary device


def test_split_placement_groups_copies_and_report():
    # TVM kernels only (backends=()): oneDNN would fuse the add and relu into the matmul's device
    art = tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 1}, params=PARAMS, backends=())
    report = art.build_report
    assert report.ops_per_device == [2, 2]
    # Two CPUs share memory: matmul→add, relu→matmul and the output are read in place, not copied.
    assert report.num_copies == 0 and report.shared_edges == 2
    assert len(report.groups) == 3
    text = art.report()
    for expected in ("cpu:0", "cpu:1", "copies 0", "2 tensors read in place", "lower bound", "fallbacks: none"):
        assert expected in text
    rt = art.create()
    stats = rt.stats()
    assert stats["num_copies"] == 0 and stats["num_groups"] == 3 and stats["shared_edges"] == 2
    assert stats["bytes_copied"] == 0


def test_graph_never_shares_storage_across_devices():
    art = tvm_hetero.build(MLP, TWO_CPUS, placement=lambda info: info.index % 2, params=PARAMS)
    graph = art.graph
    device_of_sid: dict[int, int] = {}
    for nid, node in enumerate(graph["nodes"]):
        for k in range(int(node.get("attrs", {}).get("num_outputs", 1))):
            sid = graph["attrs"]["storage_id"][1][graph["node_row_ptr"][nid] + k]
            device = graph["attrs"]["device_index"][1][nid]
            assert device_of_sid.setdefault(sid, device) == device, f"storage id {sid} on two devices"


def test_export_and_load_round_trip(tmp_path):
    art = tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 1}, params=PARAMS, backends=())
    art.export(tmp_path / "mlp")
    loaded = tvm_hetero.load(tmp_path / "mlp")
    assert loaded.input_names == ["x"]
    assert loaded.build_report.shared_edges == 2
    a, b = art.create(), loaded.create()
    a.run(x=X)
    b.run(x=X)
    np.testing.assert_array_equal(a.get_output(0).numpy(), b.get_output(0).numpy())
    with pytest.raises(FileNotFoundError, match="missing graph.json"):
        tvm_hetero.load(tmp_path)


def test_artifact_runs_on_other_devices_than_it_was_built_for():
    art = tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 1}, params=PARAMS)
    rt = art.create([tvm.cpu(2), tvm.cpu(3)])
    rt.run(x=X)
    assert rt.get_output(0).device == tvm.cpu(2)


def test_bad_build_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="at least one"):
        tvm_hetero.build(MLP, [], params=PARAMS)
    with pytest.raises(ValueError, match="device 'gpu-ish'"):
        tvm_hetero.build(MLP, [("gpu-ish", "llvm")], params=PARAMS)
    with pytest.raises(ValueError, match="output_device 5"):
        tvm_hetero.build(MLP, TWO_CPUS, params=PARAMS, output_device=5)
    with pytest.raises(ValueError, match="matmul"):
        tvm_hetero.build(MLP, TWO_CPUS, placement={"matmul": 7}, params=PARAMS)


def test_cli_compile_run_inspect(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4, 3, 3], rng.standard_normal(288).astype("float32"))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], initializer=[w])
    model_path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), model_path)
    out = tmp_path / "out"
    assert cli.main(["compile", str(model_path), "--device", "cpu:0=llvm", "--device", "cpu:1=llvm",
                     "--place", "conv2d=1", "--backend", "none", "-o", str(out)]) == 0
    x = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    assert cli.main(["run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "--save", str(tmp_path)]) == 0
    from tvm_hetero.testing.models import onnxruntime_outputs

    reference = onnxruntime_outputs(onnx.load(model_path), {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "output_0.npy"), reference, rtol=1e-4, atol=1e-4)
    assert cli.main(["inspect", str(out), "--dot", str(tmp_path / "g.dot")]) == 0
    printed = capsys.readouterr().out
    assert "dev1" in printed and "copies" in printed
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith("digraph") and "in place" in dot  # conv (cpu:1) -> relu (cpu:0), no copy
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device_names"] == ["cpu:0", "cpu:1"]
