"""A tiny reference executor for a compiler Graph: the test oracle, not product code.

Every entry gets its own tensor on one device (``tvm.cpu(0)`` by default, whatever the node's
device says), kernels run one by one in node order, and the heads come back as numpy arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tvm
from tvm_hetero.graph import COPY_FUNC, NOP_FUNC, Graph


def find_kernel(lib: tvm.runtime.Module, name: str) -> Any:
    """``lib[name]``, else the first module in the import tree that has it."""
    pending = [lib]
    while pending:
        module = pending.pop(0)
        try:
            return module.get_function(name)
        except AttributeError:
            pending.extend(module.imports)
    raise KeyError(f"kernel '{name}' is in no module of the library")


def run_graph(
    graph: Graph,
    lib: tvm.runtime.Module,
    inputs: Mapping[str, np.ndarray],
    params: Mapping[str, np.ndarray] | None = None,
    dev: Any = None,
) -> list[np.ndarray]:
    """Run ``graph`` with kernels from ``lib``; null nodes are fed from ``inputs`` or ``params``."""
    dev = tvm.cpu(0) if dev is None else dev
    feeds = {**(params or {}), **inputs}
    values: list[list[tvm.runtime.Tensor]] = []
    for nid, node in enumerate(graph.nodes):
        if node.is_input:
            if node.name not in feeds:
                raise KeyError(f"node {nid} '{node.name}': no input or param value given")
            array = np.ascontiguousarray(feeds[node.name], dtype=node.dtypes[0])
            if tuple(array.shape) != tuple(node.shapes[0]):
                raise ValueError(f"node {nid} '{node.name}': value shape {array.shape} != {node.shapes[0]}")
            values.append([tvm.runtime.tensor(array, dev)])
            continue
        outs = [tvm.runtime.empty(shape, dtype, dev) for shape, dtype in zip(node.shapes, node.dtypes)]
        args = [values[e.node][e.index] for e in node.inputs]
        if node.func_name == COPY_FUNC:
            args[0].copyto(outs[0])
        elif node.func_name != NOP_FUNC:
            find_kernel(lib, node.func_name)(*args, *outs)
        values.append(outs)
    return [values[e.node][e.index].numpy() for e in graph.heads]
