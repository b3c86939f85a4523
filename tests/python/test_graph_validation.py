"""Malformed graph JSON raises a Python exception naming the node and field; it never crashes."""

from __future__ import annotations

import copy
import json
import time

import pytest
import tvm
from conftest import simplex_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm_hetero import graph_runtime

DEVICES = [tvm.cpu(0), tvm.cpu(1)]
VALID = json.loads(simplex_graph().to_json())


def mutated(fn):
    doc = copy.deepcopy(VALID)
    fn(doc)
    return json.dumps(doc)


def setitem(path, value):
    def apply(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return apply


def delitem(path):
    def apply(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return apply


CASES = {
    "not json": (lambda: "{nodes: ", r"not valid JSON"),
    "top is a list": (lambda: "[]", r"document: expected an object"),
    "missing nodes": (lambda: mutated(delitem(["nodes"])), r"missing field 'nodes'"),
    "missing heads": (lambda: mutated(delitem(["heads"])), r"missing field 'heads'"),
    "missing attrs": (lambda: mutated(delitem(["attrs"])), r"missing field 'attrs'"),
    "node without name": (lambda: mutated(delitem(["nodes", 3, "name"])), r"node 3: missing field 'name'"),
    "node name not a string": (lambda: mutated(setitem(["nodes", 3, "name"], 5)), r"node 3 field 'name'"),
    "unknown op": (lambda: mutated(setitem(["nodes", 3, "op"], "relu")), r"node 3 'add' field 'op'"),
    "missing func_name": (lambda: mutated(delitem(["nodes", 3, "attrs", "func_name"])),
                          r"node 3 'add' attrs: missing field 'func_name'"),
    "unknown func_name": (lambda: mutated(setitem(["nodes", 3, "attrs", "func_name"], "nope")),
                          r"node 3 'add': kernel 'nope' is not in the library"),
    "inputs not a list": (lambda: mutated(setitem(["nodes", 3, "inputs"], 3)), r"node 3 'add' field 'inputs'"),
    "input to missing node": (lambda: mutated(setitem(["nodes", 3, "inputs", 0], [99, 0, 0])),
                              r"node 3 'add' field 'inputs'\[0\]: refers to node 99, which does not exist"),
    "input to missing output": (lambda: mutated(setitem(["nodes", 3, "inputs", 0], [0, 2, 0])),
                                r"node 3 'add' field 'inputs'\[0\]: refers to output 2 of node 0 'A'"),
    "forward reference": (lambda: mutated(setitem(["nodes", 3, "inputs", 0], [4, 0, 0])),
                          r"node 3 'add'.*cycle or forward reference"),
    "self cycle": (lambda: mutated(setitem(["nodes", 3, "inputs", 0], [3, 0, 0])),
                   r"node 3 'add'.*cycle or forward reference"),
    "num_inputs disagrees": (lambda: mutated(setitem(["nodes", 3, "attrs", "num_inputs"], "3")),
                             r"node 3 'add' attrs.num_inputs: says 3 but the node has 2 inputs"),
    "num_outputs not a number": (lambda: mutated(setitem(["nodes", 3, "attrs", "num_outputs"], "x")),
                                 r"node 3 'add' attrs.num_outputs: 'x' is not an integer"),
    "negative storage id": (lambda: mutated(setitem(["attrs", "storage_id", 1, 2], -1)),
                            r"attrs.storage_id\[2\]: is negative"),
    "storage id across devices": (lambda: mutated(setitem(["attrs", "storage_id", 1, 4], 3)),
                                  r"storage_id 3 is shared across devices: node 3 'add'.* node 4 'copy'"),
    "device index out of range": (lambda: mutated(setitem(["attrs", "device_index", 1, 3], 2)),
                                  r"node 3 'add': device_index 2 is out of range for 2 device"),
    "negative device index": (lambda: mutated(setitem(["attrs", "device_index", 1, 3], -1)),
                              r"node 3 'add': device_index -1 is out of range"),
    "device column wrong length": (lambda: mutated(setitem(["attrs", "device_index", 1], [0, 1])),
                                   r"attrs.device_index: has 2 values, expected 6"),
    "shape column wrong length": (lambda: mutated(setitem(["attrs", "shape", 1], [[4]])),
                                  r"attrs.shape: has 1 values, expected 6"),
    "dltype column wrong length": (lambda: mutated(setitem(["attrs", "dltype", 1], ["float32"])),
                                   r"attrs.dltype: has 1 values, expected 6"),
    "unknown dtype": (lambda: mutated(setitem(["attrs", "dltype", 1, 2], "float33x")),
                      r"attrs.dltype\[2\]: unknown dtype 'float33x'"),
    "wrong column tag": (lambda: mutated(setitem(["attrs", "shape", 0], "list_int")),
                         r"attrs.shape: type tag must be 'list_shape'"),
    "negative dimension": (lambda: mutated(setitem(["attrs", "shape", 1, 0], [-4])),
                           r"attrs.shape\[0\]: has a negative dimension"),
    "bad node_row_ptr": (lambda: mutated(setitem(["node_row_ptr", 2], 5)), r"node_row_ptr'\[2\]: is 5, expected 2"),
    "arg_nodes names a kernel": (lambda: mutated(setitem(["arg_nodes", 0], 3)), r"arg_nodes\[0\]: 3 is not a null"),
    "head to missing node": (lambda: mutated(setitem(["heads", 0], [42, 0, 0])),
                             r"heads\[0\]: refers to node 42, which does not exist"),
    "copy with two inputs": (lambda: mutated(setitem(["nodes", 4, "inputs"], [[3, 0, 0], [3, 0, 0]])),
                             r"node 4 'copy'"),
    "duplicate input names": (lambda: mutated(setitem(["nodes", 1, "name"], "A")),
                              r"node 1 'A': another input has the name 'A'"),
    "bad device_index_kind": (lambda: mutated(setitem(["attrs", "device_index_kind"], ["str", "gpu"])),
                              r"attrs.device_index_kind: must be 'position' or 'device_type'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_graph_error_names_node_and_field(kernels, case):
    make, pattern = CASES[case]
    with pytest.raises(ValueError, match=pattern):
        graph_runtime.create(make(), kernels, DEVICES)


def test_no_devices_is_an_error(kernels):
    with pytest.raises(ValueError, match="at least one device"):
        graph_runtime.create(json.dumps(VALID), kernels, [])


# ---- fuzzing: mutate valid graphs; every outcome is a clean Python exception or a working runtime ----
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.sampled_from(["", "0", "1", "float32", "x"]),
                        st.just([]), st.just({}), st.just([0, 0, 0]))


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths(value, prefix + (i,))


ALL_PATHS = [p for p in paths(VALID) if p]


@st.composite
def mutated_graphs(draw):
    doc = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            if draw(st.booleans()) and isinstance(target, dict):
                target.pop(path[-1], None)
            else:
                # A copy: a drawn container reused by a later draw would nest inside itself.
                target[path[-1]] = copy.deepcopy(draw(JSON_LEAVES))
        except (KeyError, IndexError, TypeError):
            continue
    return json.dumps(doc)


FUZZ_DEADLINE = time.monotonic() + 30.0  # bounded time in the suite


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=mutated_graphs())
def test_fuzz_mutated_graphs_never_crash(kernels, text):
    if time.monotonic() > FUZZ_DEADLINE:
        return
    try:
        m = graph_runtime.create(text, kernels, DEVICES)
    except (ValueError, TypeError, KeyError, IndexError):
        return
    # Accepted graphs must also run, or fail cleanly (e.g. a kernel rejecting a device mix).
    try:
        for i in range(m.get_num_inputs()):
            m.get_input(i)
        m.run()
    except (ValueError, TypeError, RuntimeError):
        pass
