"""Real CNNs split over two devices: logits equal ONNX Runtime's, storage never shared across devices.

The ONNX wheel's light models (ResNet-50, ShuffleNet, SqueezeNet, Inception v1) with seeded random
weights (tvm_hetero.testing.models) are each built twice for two CPU devices: with every conv2d on device 1
(many device switches), and with the first half of the Relax ops on device 1 and the rest on device
0 (one switch). Each model is imported once and built once per placement.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero.testing.models import light_model, model_inputs, onnxruntime_outputs, relax_module

pytest.importorskip("onnxruntime")

MODELS = ("resnet50", "shufflenet", "squeezenet", "inception_v1")
PLACEMENTS = ("conv2d_on_1", "first_half_on_1")
TARGETS = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]

pytestmark = pytest.mark.slow


@functools.cache
def reference(name: str) -> tuple[tvm.IRModule, dict[str, np.ndarray], np.ndarray]:
    """The model as Relax, its input and ONNX Runtime's logits."""
    model = light_model(name)
    inputs = model_inputs(model)
    return relax_module(model), inputs, onnxruntime_outputs(model, inputs)[0]


@functools.cache
def artifact(name: str, placement: str) -> tvm_hetero.Artifact:
    mod = reference(name)[0]
    if placement == "conv2d_on_1":
        return tvm_hetero.build(mod, TARGETS, placement={"conv2d": 1})
    # The number of Relax op calls, from the report of the conv2d build (built anyway).
    num_ops = sum(artifact(name, "conv2d_on_1").build_report.ops_per_device)
    return tvm_hetero.build(mod, TARGETS, placement=lambda info: 1 if info.index < num_ops / 2 else 0)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_onnxruntime(name: str, placement: str) -> None:
    _, inputs, expected = reference(name)
    art = artifact(name, placement)
    ops = art.build_report.ops_per_device
    assert ops[0] > 0 and ops[1] > 0, f"{name} {placement}: a device got no ops ({ops})"

    rt = art.create()
    rt.run(**inputs)
    assert rt.get_num_outputs() == 1
    got = rt.get_output(0).numpy()

    assert got.shape == expected.shape
    scale = float(np.max(np.abs(expected)))
    error = float(np.max(np.abs(got - expected))) / scale
    print(f"{name} {placement}: ops per device {ops}, max error / max |logit| = {error:.2e}")
    assert error < 1e-4


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", MODELS)
def test_memory_planner_never_shares_storage_across_devices(name: str, placement: str) -> None:
    art = artifact(name, placement)
    graph = json.loads(art.graph_json)
    storage_ids = graph["attrs"]["storage_id"][1]
    node_devices = graph["attrs"]["device_index"][1]
    row_ptr = graph["node_row_ptr"]
    assert len(node_devices) == len(graph["nodes"])  # one device per node

    devices_of_storage: dict[int, set[int]] = {}
    for nid, device in enumerate(node_devices):
        for eid in range(row_ptr[nid], row_ptr[nid + 1]):
            devices_of_storage.setdefault(storage_ids[eid], set()).add(device)
    shared = {sid: sorted(devs) for sid, devs in devices_of_storage.items() if len(devs) > 1}
    assert not shared, f"{name} {placement}: storage ids used on several devices: {shared}"
    # Both devices hold some storage, and some storage is actually shared within a device once
    # there are enough kernel nodes to share it (oneDNN blocks can leave a few nodes per device).
    assert {d for devs in devices_of_storage.values() for d in devs} == {0, 1}
    kernel_nodes = sum(1 for n in graph["nodes"] if n["op"] != "null")
    assert len(devices_of_storage) < len(storage_ids) or kernel_nodes <= 8, kernel_nodes

    memory = art.build_report.memory
    ratios = []
    for device, (planned, bound) in enumerate(zip(memory["planned_bytes"], memory["lower_bound_bytes"])):
        assert planned >= bound, f"device {device}: planned {planned} B is below the lower bound {bound} B"
        ratios.append(f"device {device}: {planned / bound:.3f}x" if bound else f"device {device}: -")
    print(f"{name} {placement}: planned / lower bound: {', '.join(ratios)}")
