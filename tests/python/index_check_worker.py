"""A child process that builds one model with an index input and runs it on the index tensors it is sent.

Run as ``python index_check_worker.py <model>`` (models: :data:`MODELS`). It reads one JSON request per
line (``{"values": [...], "dtype": "int64"}``, the index tensor in the model's index shape) and answers
one line starting with ``@@`` (TVM may print on stdout too): ``{"ok": true, "matches": bool,
"max_diff": float}`` when the run succeeded (compared with ONNX Runtime, or with numpy/torch for the
torch models), ``{"ok": false, "kind": "IndexError", "message": ..., "reference_refused": bool}``
when it raised. A crash ends the process, which the parent (``IndexWorker``) reports as a failure:
the tests of tvm_hetero's index checks run every case through here so that an out-of-range read or
write that kills the process fails a test instead of pytest.
"""

from __future__ import annotations

import atexit
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Rows of every indexed table: an index of -1001 is out of range, -1000 is the first row.
ROWS = 1000


@dataclass
class Model:
    """A built model: run(indices) -> outputs, and the reference for in-range indices."""

    run: Callable[[np.ndarray], list[np.ndarray]]
    reference: Callable[[np.ndarray], list[np.ndarray]]
    #: Largest absolute difference from the reference that still matches.
    tolerance: float = 1e-4


def _onnx_model(node: Any, index_shape: tuple[int, ...], index_dtype: str, out_shape: tuple[int, ...],
                initializers: dict[str, np.ndarray], more_nodes: tuple = (), targets: tuple = ("cpu",),
                tolerance: float = 1e-4, placement: Any = None, create_args: tuple = ()) -> Model:
    import onnx
    import onnxruntime
    import tvm_hetero
    from onnx import TensorProto, helper
    from tvm_hetero import importers

    elem = TensorProto.INT64 if index_dtype == "int64" else TensorProto.INT32
    graph = helper.make_graph(
        [node, *more_nodes], "index_model", [helper.make_tensor_value_info("ids", elem, list(index_shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, list(out_shape))],
        [onnx.numpy_helper.from_array(v, k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    artifact = tvm_hetero.build(importers.from_onnx(model), list(targets), placement=placement)
    runtime = artifact.create(*create_args)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def run(ids: np.ndarray) -> list[np.ndarray]:
        runtime.set_input("ids", ids)
        runtime.run()
        return [runtime.get_output(0).numpy()]

    return Model(run, lambda ids: session.run(None, {"ids": ids}), tolerance)


def gather(index_dtype: str = "int64") -> Model:
    """ONNX Gather over a 1000-row table (a token embedding), indices (2, 3)."""
    from onnx import helper

    table = np.random.default_rng(0).random((ROWS, 8), dtype=np.float32)
    node = helper.make_node("Gather", ["table", "ids"], ["out"], name="embed_tokens", axis=0)
    return _onnx_model(node, (2, 3), index_dtype, (2, 3, 8), {"table": table})


def gather_two_devices() -> Model:
    """The Gather on the second of two CPU devices (its own executor thread), a Relu on the first."""
    import tvm
    from onnx import helper

    table = np.random.default_rng(6).random((ROWS, 8), dtype=np.float32)
    node = helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed_tokens", axis=0)
    relu = helper.make_node("Relu", ["rows"], ["out"], name="relu")
    targets = ((tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm"))
    return _onnx_model(node, (2, 3), "int64", (2, 3, 8), {"table": table}, (relu,), targets,
                       placement=lambda info: int(info.op == "relax.take"))


def gather_remote() -> Model:
    """The Gather on a remote CPU (an RPC server in another process), its segment offloaded whole."""
    import tvm
    from onnx import helper
    from tvm_hetero.runtime.rpc import LocalServer

    server = LocalServer()
    atexit.register(server.stop)  # the server lives as long as this worker
    table = np.random.default_rng(7).random((ROWS, 8), dtype=np.float32)
    node = helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed_tokens", axis=0)
    relu = helper.make_node("Relu", ["rows"], ["out"], name="relu")
    targets = ((tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm"))
    devices = [tvm.cpu(0), server.connect().cpu(0)]
    return _onnx_model(node, (2, 3), "int64", (2, 3, 8), {"table": table}, (relu,), targets,
                       placement=lambda info: int(info.op == "relax.take"), create_args=(devices,))


def gather_htp() -> Model:
    """Gather then MatMul, built for the CPU and the HTP: QNN takes both into one region, so the
    indices are checked on the CPU before it (QNN's emulator computes in fp16: a looser match)."""
    from onnx import helper

    rng = np.random.default_rng(5)
    table, weight = rng.random((ROWS, 16), dtype=np.float32), rng.random((16, 16), dtype=np.float32)
    node = helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed_tokens", axis=0)
    project = helper.make_node("MatMul", ["rows", "weight"], ["out"], name="project")
    return _onnx_model(node, (2, 3), "int64", (2, 3, 16), {"table": table, "weight": weight}, (project,),
                       ("cpu", "qnn-htp"), tolerance=0.05)


def gather_elements() -> Model:
    from onnx import helper

    data = np.random.default_rng(1).random((ROWS, 4), dtype=np.float32)
    node = helper.make_node("GatherElements", ["data", "ids"], ["out"], name="pick_rows", axis=0)
    return _onnx_model(node, (3, 4), "int64", (3, 4), {"data": data})


def gather_nd() -> Model:
    """Coordinates (row, column) into a (1000, 4) table: extents 1000 and 4."""
    from onnx import helper

    data = np.random.default_rng(2).random((ROWS, 4), dtype=np.float32)
    node = helper.make_node("GatherND", ["data", "ids"], ["out"], name="lookup_cells")
    return _onnx_model(node, (3, 2), "int64", (3,), {"data": data})


def scatter_elements() -> Model:
    """Reduction add: duplicate indices give one answer in any order (small integer updates)."""
    from onnx import helper

    data = np.random.default_rng(3).integers(0, 9, (ROWS, 4)).astype(np.float32)
    updates = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = helper.make_node("ScatterElements", ["data", "ids", "updates"], ["out"], name="scatter_rows",
                            axis=0, reduction="add")
    return _onnx_model(node, (3, 4), "int64", (ROWS, 4), {"data": data, "updates": updates})


def scatter_nd() -> Model:
    from onnx import helper

    data = np.random.default_rng(4).integers(0, 9, (ROWS, 4)).astype(np.float32)
    updates = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = helper.make_node("ScatterND", ["data", "ids", "updates"], ["out"], name="scatter_nd_rows",
                            reduction="add")
    return _onnx_model(node, (3, 1), "int64", (ROWS, 4), {"data": data, "updates": updates})


def _torch_model(module: Any, example: Any, reference: Callable[[np.ndarray], list[np.ndarray]],
                 targets: tuple = ("cpu",), tolerance: float = 1e-4) -> Model:
    import tvm_hetero
    from tvm_hetero import importers

    artifact = tvm_hetero.build(importers.from_torch(module, [example]), list(targets))
    runtime = artifact.create()
    name = artifact.input_names[0]

    def run(ids: np.ndarray) -> list[np.ndarray]:
        runtime.set_input(name, ids)
        runtime.run()
        return [runtime.get_output(i).numpy() for i in range(runtime.get_num_outputs())]

    return Model(run, reference, tolerance)


def torch_embedding() -> Model:
    """``nn.Embedding(1000, 8)`` through from_torch; the reference is numpy's take (negative ids
    in range count from the end, as in ONNX; torch itself refuses them)."""
    import torch

    torch.manual_seed(0)
    module = torch.nn.Embedding(ROWS, 8).eval()
    weight = module.weight.detach().numpy()
    return _torch_model(module, torch.zeros(2, 3, dtype=torch.int64), lambda ids: [np.take(weight, ids, axis=0)])


def torch_embedding_htp() -> Model:
    """``nn.Embedding(1000, 16)`` then a ``Linear`` through from_torch, built for the CPU and the HTP:
    QNN takes torch's int64 -> int32 cast of the ids, the lookup and the projection into one region,
    whose int64 ids are checked on the CPU before it (the emulator computes in fp16: a looser match)."""
    import torch

    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Embedding(ROWS, 16), torch.nn.Linear(16, 16)).eval()
    weight = module[0].weight.detach().numpy()
    project = module[1].weight.detach().numpy(), module[1].bias.detach().numpy()
    return _torch_model(module, torch.zeros(2, 3, dtype=torch.int64),
                        lambda ids: [np.take(weight, ids, axis=0) @ project[0].T + project[1]],
                        ("cpu", "qnn-htp"), tolerance=0.05)


def torch_indexing() -> Model:
    """torch advanced indexing ``table[rows, cols]`` (Relax ``index_tensor``): rows select within 1000,
    columns within 8; the ids hold both as (2, 3): row ids then column ids."""
    import torch

    table = torch.arange(ROWS * 8, dtype=torch.float32).reshape(ROWS, 8)

    class Pick(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return table[ids[0], ids[1]]

    values = table.numpy()
    return _torch_model(Pick().eval(), torch.zeros(2, 3, dtype=torch.int64),
                        lambda ids: [values[ids[0], ids[1]]])


def tiny_decoder() -> Model:
    """A one-layer causal decoder through from_torch: token and position embeddings, masked
    self-attention, a vocabulary head (1000 tokens); token ids (1, 8). (transformers' GPT-2 does not
    build with TVM 0.27 here: its causal mask takes a cumsum over bools, which TVM's LLVM codegen
    refuses, index checks or not.)"""
    import torch

    torch.manual_seed(0)
    width, length = 16, 8

    class TinyDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = torch.nn.Embedding(ROWS, width)
            self.positions = torch.nn.Embedding(length, width)
            self.qkv = torch.nn.Linear(width, 3 * width)
            self.norm = torch.nn.LayerNorm(width)
            self.head = torch.nn.Linear(width, ROWS)
            self.register_buffer("mask", torch.triu(torch.full((length, length), -1e9), diagonal=1))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.tokens(ids) + self.positions(torch.arange(length))
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            attention = torch.softmax(q @ k.transpose(-1, -2) / width**0.5 + self.mask, dim=-1)
            return self.head(self.norm(x + attention @ v))

    module = TinyDecoder().eval()

    def reference(ids: np.ndarray) -> list[np.ndarray]:
        wrapped = np.where(ids < 0, ids + ROWS, ids)  # torch refuses negative ids: compare with their row
        with torch.no_grad():
            return [module(torch.from_numpy(wrapped.astype(np.int64))).numpy()]

    return _torch_model(module, torch.zeros(1, length, dtype=torch.int64), reference)


MODELS: dict[str, Callable[[], Model]] = {
    "gather": gather,
    "gather_int32": lambda: gather("int32"),
    "gather_htp": gather_htp,
    "gather_two_devices": gather_two_devices,
    "gather_remote": gather_remote,
    "gather_elements": gather_elements,
    "gather_nd": gather_nd,
    "scatter_elements": scatter_elements,
    "scatter_nd": scatter_nd,
    "torch_embedding": torch_embedding,
    "torch_embedding_htp": torch_embedding_htp,
    "torch_indexing": torch_indexing,
    "tiny_decoder": tiny_decoder,
}


def _answer(model: Model, ids: np.ndarray) -> dict:
    try:
        got = model.run(ids)
    except Exception as err:  # noqa: BLE001 (the parent checks the kind and the message)
        try:
            model.reference(ids)
            refused = False
        except Exception:  # noqa: BLE001 (ONNX Runtime's and numpy's refusals differ in kind)
            refused = True
        return {"ok": False, "kind": type(err).__name__, "message": str(err), "reference_refused": refused}
    try:
        want = model.reference(ids)
    except Exception as err:  # noqa: BLE001 (ours ran where the reference refuses: a wrong answer)
        return {"ok": True, "matches": False, "max_diff": float("nan"), "reference_error": str(err)}
    diffs = [float(np.max(np.abs(g - w))) if g.size else 0.0 for g, w in zip(got, want)]
    shapes = all(g.shape == w.shape for g, w in zip(got, want))
    return {"ok": True, "matches": shapes and max(diffs) <= model.tolerance, "max_diff": max(diffs)}


def main(name: str) -> None:
    model = MODELS[name]()
    print("@@" + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        ids = np.array(request["values"], dtype=request["dtype"])
        print("@@" + json.dumps(_answer(model, ids)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
