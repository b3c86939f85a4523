"""Importing models: an ONNX model or a PyTorch module to the Relax IRModule ``tvm_hetero.build`` takes.

TVM's frontends do the work (``tvm.relax.frontend.onnx`` and ``.torch``); these helpers fix the one
convention the compiler relies on: **weights are constants bound in the module**, so constant
folding and the backends' patterns see them as weights and ``build`` needs no ``params``. An ONNX
model is prepared first with ONNX's own tools (``onnx_prepare.py``: input shapes fixed, shapes
inferred, constant subgraphs folded), and what the frontend still cannot convert is one error line
naming the node. The frontends and their packages (``onnx``, ``torch``) are imported only when a
helper is called.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import tvm

from .errors import last_line, with_type


class OnnxImportError(ValueError):
    """An ONNX node TVM's frontend cannot convert, even after :func:`~tvm_hetero.onnx_prepare.prepare_onnx`.
    The message is one line naming the node (name and op type) and the frontend's reason."""


def from_onnx(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
              prepare: bool = True) -> tvm.IRModule:
    """An ONNX model (a ``ModelProto``, or the path of a ``.onnx`` file) as a Relax module with its
    weights bound as constants.

    ``input_shapes`` fixes inputs' shapes by name, e.g. ``{"input_ids": (1, 128)}`` (the CLI's
    ``--input-shape input_ids=1,128``); the model's own static dims must agree. An input dim left
    symbolic (a ``dim_param`` such as ``"batch"``) stays a symbolic dim of the Relax function: such a
    module can be specialised later (``relax.transform.BindSymbolicVars``), and ``build`` names the
    input and asks for its shape if it is still symbolic then. With ``prepare`` (the default) the
    model first goes through :func:`~tvm_hetero.onnx_prepare.prepare_onnx`: shapes inferred and
    constant subgraphs (shape arithmetic, ``ConstantOfShape`` weights...) folded with ONNX's reference
    implementation, which is what lets exported transformers (GPT-2, BERT) and MobileNetV2 import.

    Raises FileNotFoundError or ValueError naming the file when a path is no file, is empty or is
    not an ONNX model; ValueError naming the input for a bad ``input_shapes`` entry; and
    :class:`OnnxImportError` naming the node the frontend could not convert, and why.
    """
    from tvm.relax.frontend.onnx import from_onnx as frontend

    if isinstance(model, (str, Path)):
        model = load_onnx(model)
    if prepare:
        from .onnx_prepare import prepare_onnx

        model = prepare_onnx(model, input_shapes)
    elif input_shapes:
        from .onnx_prepare import set_input_shapes

        model = _copy(model)
        set_input_shapes(model, input_shapes)
    try:
        # The frontend prints each failing op's Relax inputs before raising: the error says enough.
        with contextlib.redirect_stdout(io.StringIO()), _node_names_as_spans():
            return frontend(model, keep_params_in_input=False)
    except Exception as err:  # any converter's error becomes one line naming its node
        raise OnnxImportError(_describe_failure(model, err)) from err


_frontend_lock = threading.Lock()


@contextlib.contextmanager
def _node_names_as_spans() -> Iterator[None]:
    """While TVM's ONNX frontend converts, each op call it returns carries its ONNX node's name as its
    span, so that errors found later (an index out of range at run time) name the node. The frontend
    keeps no names itself; its importer class is swapped for the naming one for this conversion."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    base = onnx_frontend.ONNXGraphImporter

    class NamingImporter(base):
        def _convert_operator(self, op_name: str, inputs: Any, attrs: dict, opset: int) -> Any:
            out = super()._convert_operator(op_name, inputs, attrs, opset)
            name = attrs.get("tvm_custom", {}).get("name") or ""
            if name and isinstance(out, relax.Call) and out.span is None:
                span = tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)
                out = self.bb.normalize(relax.Call(out.op, out.args, out.attrs, out.ty_args, span))
            return out

    with _frontend_lock:
        onnx_frontend.ONNXGraphImporter = NamingImporter
        try:
            yield
        finally:
            onnx_frontend.ONNXGraphImporter = base


def _copy(model: Any) -> Any:
    copy = type(model)()
    copy.CopyFrom(model)
    return copy


def _describe_failure(model: Any, err: Exception) -> str:
    """``ONNX node 'name' (OpType): reason`` for the node the frontend failed on. The node is the one
    the frontend's conversion loop was at (found in the traceback's frames), or, for an op the
    frontend has no converter for, the first node of that op type."""
    reason = last_line(err)
    node = None
    trace = err.__traceback__
    while trace is not None:
        candidate = trace.tb_frame.f_locals.get("node")
        if hasattr(candidate, "op_type") and hasattr(candidate, "output"):
            node = candidate  # the innermost frame holding a node (a subgraph's, inside an If)
        trace = trace.tb_next
    if node is None and ":" in reason:
        missing = {name.strip() for name in reason.split(":", 1)[1].split(",")}
        node = next((n for n in model.graph.node if n.op_type in missing), None)
    hint = _symbolic_inputs_hint(model)
    if node is None:
        return f"ONNX import failed: {type(err).__name__}: {reason}{hint}"
    name = node.name or (node.output[0] if node.output else "?")
    return f"ONNX node {name!r} ({node.op_type}): {reason}{hint}"


def _symbolic_inputs_hint(model: Any) -> str:
    """For a model with inputs of symbolic dims (a frequent cause of a failed conversion): which, and
    how to give their shapes; empty otherwise."""
    from .onnx_prepare import format_dims, input_dims, real_inputs

    symbolic = [(v.name, input_dims(v)) for v in real_inputs(model)
                if not all(isinstance(d, int) for d in input_dims(v))]
    if not symbolic:
        return ""
    listed = ", ".join(f"{name} {format_dims(dims)}" for name, dims in symbolic)
    first = symbolic[0][0]
    return (f" (inputs with symbolic dims: {listed}; give their shapes with "
            f"input_shapes={{'{first}': (...)}} or --input-shape {first}=D0,D1,...)")


def load_onnx(path: str | Path) -> Any:
    """The ``ModelProto`` in ``path``; errors name the file (no such file, empty, not ONNX)."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model {path}: no such file")
    if path.stat().st_size == 0:
        raise ValueError(f"model {path}: the file is empty")
    try:
        return onnx.load(str(path))
    except Exception as err:  # noqa: BLE001 (protobuf raises several kinds for a file that is not ONNX)
        reason = with_type(err) if last_line(err, "") else type(err).__name__
        raise ValueError(f"model {path}: not an ONNX model ({reason})") from None


def from_torch(module: Any, example_args: Sequence[Any]) -> tvm.IRModule:
    """A ``torch.nn.Module`` (in eval mode for inference) as a Relax module, through
    ``torch.export.export`` with ``example_args`` (their shapes are the module's); the parameters
    become bound constants (``from_exported_program``'s default)."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        exported = torch.export.export(module, tuple(example_args))
    return from_exported_program(exported)


__all__ = ["OnnxImportError", "from_onnx", "from_torch", "load_onnx"]
