"""Shared fixtures: small compiled kernels, graph builders, a local RPC server."""

from __future__ import annotations

import pytest
import tvm
from tvm import te
from tvm_hetero.graph import COPY_FUNC, Entry, Graph, Node

SHAPE = (4,)


def elementwise_kernel(name: str, fn, shape=SHAPE, dtype="float32") -> tvm.tirx.PrimFunc:
    a = te.placeholder(shape, dtype, name="a")
    b = te.placeholder(shape, dtype, name="b")
    c = te.compute(shape, lambda *i: fn(a(*i), b(*i)), name="c")
    return te.create_prim_func([a, b, c]).with_attr("global_symbol", name)


@pytest.fixture(scope="session")
def kernels() -> tvm.runtime.Module:
    """add, sub and mul over float32[4], compiled for the CPU."""
    mod = tvm.IRModule(
        {
            "add": elementwise_kernel("add", lambda x, y: x + y),
            "sub": elementwise_kernel("sub", lambda x, y: x - y),
            "mul": elementwise_kernel("mul", lambda x, y: x * y),
        }
    )
    return tvm.compile(mod, "llvm").mod


def inp(name: str, device: int = 0, shape=SHAPE, dtype="float32") -> Node:
    return Node(name, op="null", device=device, shapes=[tuple(shape)], dtypes=[dtype])


def op(name: str, func: str, inputs: list[int], device: int, shape=SHAPE, dtype="float32") -> Node:
    return Node(name, inputs=[Entry(i) for i in inputs], func_name=func, device=device,
                shapes=[tuple(shape)], dtypes=[dtype])


def copy(name: str, src: int, device: int) -> Node:
    return op(name, COPY_FUNC, [src], device)


def simplex_graph() -> Graph:
    """add on device 1 -> copy -> sub on device 0."""
    return Graph(
        [inp("A", 1), inp("B", 1), inp("C", 0), op("add", "add", [0, 1], 1), copy("copy", 3, 0),
         op("sub", "sub", [4, 2], 0)],
        [Entry(5)],
    )


def duplex_graph() -> Graph:
    """add on 1 -> copy -> sub on 0 -> copy -> add on 1."""
    return Graph(
        [inp("A", 1), inp("B", 1), inp("C", 0), inp("D", 1), op("add1", "add", [0, 1], 1),
         copy("copy1", 4, 0), op("sub", "sub", [5, 2], 0), copy("copy2", 6, 1),
         op("add2", "add", [7, 3], 1)],
        [Entry(8)],
    )


@pytest.fixture(scope="session")
def rpc_server():
    """A real second process: tvm.exec.rpc_server with libtvm_hetero loaded."""
    from tvm_hetero.runtime.rpc import start_local_server

    with start_local_server() as server:
        yield server
