"""The graph runtime on hand-made graphs: two in-process devices, remote devices, legacy graphs, API."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from conftest import SHAPE, duplex_graph, simplex_graph
from tvm_hetero import graph_runtime

DEVICES = [tvm.cpu(0), tvm.cpu(1)]
rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape or SHAPE).astype("float32")


def test_simplex_on_two_cpu_devices(kernels):
    m = graph_runtime.create(simplex_graph().to_json(), kernels, DEVICES)
    a, b, c = rand(), rand(), rand()
    m.run(A=a, B=b, C=c)
    np.testing.assert_allclose(m.get_output(0).numpy(), (a + b) - c, rtol=1e-6)
    stats = m.stats()
    assert stats["num_groups"] == 2 and stats["num_copies"] == 1 and stats["device_switches"] == 1
    assert stats["group_devices"] == [1, 0]


def test_duplex_reuses_storage_only_within_a_device(kernels):
    g = duplex_graph()
    # entries: A B C D add1 copy1 sub copy2 add2 ; add1 (dev 1) is dead after copy1, add2 (dev 1) reuses it
    storage = [0, 1, 2, 3, 4, 5, 6, 7, 4]
    m = graph_runtime.create(g.to_json(storage), kernels, DEVICES)
    a, b, c, d = rand(), rand(), rand(), rand()
    m.run(A=a, B=b, C=c, D=d)
    np.testing.assert_allclose(m.get_output(0).numpy(), ((a + b) - c) + d, rtol=1e-6)
    assert m.stats()["num_groups"] == 3 and m.stats()["num_copies"] == 2


def test_outputs_are_on_the_device_of_their_node(kernels):
    m = graph_runtime.create(simplex_graph().to_json(), kernels, DEVICES)
    assert m.get_output(0).device == tvm.cpu(0)
    assert m.get_input("A").device == tvm.cpu(1)


def test_storage_id_shared_across_devices_names_both_nodes(kernels):
    g = simplex_graph()
    storage = [0, 1, 2, 3, 3, 4]  # add (dev 1) and copy (dev 0) share id 3
    with pytest.raises(ValueError, match=r"storage_id 3 .*'add'.*device 1.*'copy'.*device 0"):
        graph_runtime.create(g.to_json(storage), kernels, DEVICES)


def test_single_device_and_graph_without_device_column(kernels):
    doc = json.loads(simplex_graph().to_json())
    del doc["attrs"]["device_index"]
    m = graph_runtime.create(json.dumps(doc), kernels, tvm.cpu(0))
    a, b, c = rand(), rand(), rand()
    m.run(A=a, B=b, C=c)
    np.testing.assert_allclose(m.get_output(0).numpy(), (a + b) - c, rtol=1e-6)
    assert m.stats()["num_groups"] == 1


def legacy_json(graph, device_types) -> str:
    doc = json.loads(graph.to_json())
    del doc["attrs"]["device_index_kind"]
    doc["attrs"]["device_index"] = ["list_int", device_types]
    return json.dumps(doc)


def test_legacy_graph_maps_device_types_to_first_device_of_that_type(kernels):
    # TVM <= 0.19 wrote DLDeviceType (1 = CPU) per entry; both cpu(0) and cpu(1) are CPUs,
    # so everything lands on the first listed CPU.
    graph = simplex_graph()
    m = graph_runtime.create(legacy_json(graph, [1] * 6), kernels, [tvm.cpu(1), tvm.cpu(0)],
                             device_index_kind="device_type")
    a, b, c = rand(), rand(), rand()
    m.run(A=a, B=b, C=c)
    np.testing.assert_allclose(m.get_output(0).numpy(), (a + b) - c, rtol=1e-6)
    assert m.get_output(0).device == tvm.cpu(1)
    assert m.stats()["num_groups"] == 1


def test_legacy_graph_attribute_wins_over_create_argument(kernels):
    doc = json.loads(legacy_json(simplex_graph(), [1] * 6))
    doc["attrs"]["device_index_kind"] = ["str", "device_type"]
    m = graph_runtime.create(json.dumps(doc), kernels, DEVICES)  # default "position" is overridden
    assert m.stats()["num_groups"] == 1


def test_legacy_device_type_without_such_device_is_an_error(kernels):
    with pytest.raises(ValueError, match=r"node 3 'add'.*device_index 2.*device type"):
        graph_runtime.create(legacy_json(simplex_graph(), [1, 1, 1, 2, 1, 1]), kernels, DEVICES,
                             device_index_kind="device_type")


def test_legacy_graph_read_as_position_is_out_of_range(kernels):
    with pytest.raises(ValueError, match=r"device_index 2 is out of range for 2 device"):
        graph_runtime.create(legacy_json(simplex_graph(), [1, 1, 1, 2, 1, 1]), kernels, DEVICES)


# ---- Python API ------------------------------------------------------------------------------
@pytest.fixture
def simplex(kernels):
    return graph_runtime.create(simplex_graph().to_json(), kernels, DEVICES)


def test_set_input_by_index_name_and_tensor(simplex):
    a, b, c = rand(), rand(), rand()
    simplex.set_input(0, a)
    simplex.set_input("B", tvm.runtime.tensor(b))
    simplex.set_input(C=c)
    simplex.run()
    np.testing.assert_allclose(simplex.get_output(0).numpy(), (a + b) - c, rtol=1e-6)
    np.testing.assert_array_equal(simplex.get_input("B").numpy(), b)
    np.testing.assert_array_equal(simplex.get_input(2).numpy(), c)
    assert simplex.get_num_inputs() == 3 and simplex.get_num_outputs() == 1
    assert simplex.get_input_index("C") == 2 and simplex.get_input_index("nope") == -1
    out = tvm.runtime.empty(SHAPE, "float32")
    simplex.get_output(0, out)
    np.testing.assert_allclose(out.numpy(), (a + b) - c, rtol=1e-6)


def test_bad_inputs_name_the_input(simplex):
    with pytest.raises(KeyError, match="'nope'"):
        simplex.set_input("nope", rand())
    with pytest.raises(IndexError, match="input index 7"):
        simplex.set_input(7, rand())
    with pytest.raises(ValueError, match=r"input 'A': expected shape \(4,\), got \(5,\)"):
        simplex.set_input("A", rand(5))
    with pytest.raises(TypeError, match="input 'A': expected dtype float32, got float64"):
        simplex.set_input("A", np.zeros(SHAPE))
    with pytest.raises(IndexError, match="output index 3"):
        simplex.get_output(3)
    with pytest.raises(ValueError, match=r"output 0 destination: expected shape"):
        simplex.get_output(0, tvm.runtime.empty((2,), "float32"))


def test_load_params_and_set_params(kernels):
    m = graph_runtime.create(simplex_graph().to_json(), kernels, DEVICES)
    b, c = rand(), rand()
    m.load_params(tvm.runtime.save_param_dict({"B": b, "C": c}))
    a = rand()
    m.run(A=a)
    np.testing.assert_allclose(m.get_output(0).numpy(), (a + b) - c, rtol=1e-6)
    m.set_params({"C": np.zeros(SHAPE, "float32")})
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), a + b, rtol=1e-6)
    with pytest.raises(KeyError, match="'W'"):
        m.load_params(tvm.runtime.save_param_dict({"W": b}))


def test_share_params_uses_the_other_runtimes_memory(kernels):
    params = tvm.runtime.save_param_dict({"B": rand(), "C": rand()})
    first = graph_runtime.create(simplex_graph().to_json(), kernels, DEVICES)
    first.load_params(params)
    second = graph_runtime.create(simplex_graph().to_json(), kernels, DEVICES)
    second.share_params(first, params)
    first.set_input("C", np.full(SHAPE, 5, "float32"))  # visible through the shared memory
    a = rand()
    second.run(A=a)
    expected = a + first.get_input("B").numpy() - 5
    np.testing.assert_allclose(second.get_output(0).numpy(), expected, rtol=1e-6)


def test_profile_reports_nodes_and_groups_by_device(simplex):
    simplex.set_input(A=rand(), B=rand(), C=rand())
    prof = simplex.profile(repeat=3)
    assert [n["name"] for n in prof["nodes"]] == ["add", "copy", "sub"]
    assert [n["device"] for n in prof["nodes"]] == [1, 0, 0]
    assert [g["device"] for g in prof["groups"]] == [1, 0]
    assert all(n["time_us"] >= 0 for n in prof["nodes"]) and set(prof["device_time_us"]) == {0, 1}


def test_storage_bytes_per_device(kernels):
    m = graph_runtime.create(duplex_graph().to_json([0, 1, 2, 3, 4, 5, 6, 7, 4]), kernels, DEVICES)
    # device 1: A, B, D, add1/add2 (shared), copy2 = 5 slots; device 0: C, copy1, sub = 3 slots
    assert m.stats()["storage_bytes"] == [3 * 16, 5 * 16]


def test_missing_kernel_names_node(kernels):
    doc = json.loads(simplex_graph().to_json())
    doc["nodes"][5]["attrs"]["func_name"] = "conv_missing"
    with pytest.raises(ValueError, match=r"node 5 'sub': kernel 'conv_missing' is not in the library"):
        graph_runtime.create(json.dumps(doc), kernels, DEVICES)


def test_kernel_from_imported_module(kernels):
    host = tvm.compile(tvm.IRModule({"mul": __import__("conftest").elementwise_kernel("mul2", lambda x, y: x * y)}),
                       "llvm").mod
    host.import_module(kernels)  # add/sub only reachable through the import
    m = graph_runtime.create(simplex_graph().to_json(), host, DEVICES)
    a, b, c = rand(), rand(), rand()
    m.run(A=a, B=b, C=c)
    np.testing.assert_allclose(m.get_output(0).numpy(), (a + b) - c, rtol=1e-6)


@pytest.mark.parametrize("execution", ["serial", "concurrent"])
def test_reading_another_cpus_output_without_a_copy_reads_it_in_place(kernels, execution):
    # sub on cpu:0 reads add's output on cpu:1 directly: the runtime hands it a view carrying
    # cpu:0 (TVM kernels check the device), so no copy is needed and the result is right.
    doc = json.loads(simplex_graph().to_json())
    doc["nodes"][5]["inputs"][0] = [3, 0, 0]
    m = graph_runtime.create(json.dumps(doc), kernels, DEVICES, execution=execution)
    a, b, c = rand(), rand(), rand()
    m.run(A=a, B=b, C=c)
    np.testing.assert_allclose(m.get_output(0).numpy(), (a + b) - c, rtol=1e-6)
    assert m.stats()["shared_edges"] == 1


# ---- remote ----------------------------------------------------------------------------------
@pytest.mark.parametrize("graph_fn", [simplex_graph, duplex_graph])
def test_graphs_on_remote_cpus(rpc_server, kernels, graph_fn):
    from tvm_hetero.runtime.rpc import upload_library

    session = rpc_server.connect()
    remote_lib = upload_library(session, kernels)
    graph = graph_fn()
    m = graph_runtime.create(graph.to_json(), remote_lib, [session.cpu(0), session.cpu(1)])
    values = {n.name: rand() for n in graph.nodes if n.is_input}
    m.run(**values)
    out = m.get_output(0).numpy()
    v = values
    expected = (v["A"] + v["B"]) - v["C"] if graph_fn is simplex_graph else (v["A"] + v["B"]) - v["C"] + v["D"]
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert m.stats()["num_copies"] == (1 if graph_fn is simplex_graph else 2)
