"""Importing models: an ONNX model or a PyTorch module to the Relax IRModule ``tvm_hetero.build`` takes.

TVM's frontends do the work (``tvm.relax.frontend.onnx`` and ``.torch``); these helpers fix the one
convention the compiler relies on: **weights are constants bound in the module**, so constant
folding and the backends' patterns see them as weights and ``build`` needs no ``params``. The
frontends and their packages (``onnx``, ``torch``) are imported only when a helper is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm


def from_onnx(model: Any) -> tvm.IRModule:
    """An ONNX model (a ``ModelProto``, or the path of a ``.onnx`` file) as a Relax module with its
    weights bound as constants.

    Raises FileNotFoundError or ValueError naming the file when a path is no file, is empty or is
    not an ONNX model.
    """
    from tvm.relax.frontend.onnx import from_onnx as frontend

    if isinstance(model, (str, Path)):
        model = load_onnx(model)
    return frontend(model, keep_params_in_input=False)


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
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = f"{type(err).__name__}: {lines[-1]}" if lines else type(err).__name__
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


__all__ = ["from_onnx", "from_torch", "load_onnx"]
