"""Reading a decoder checkpoint: a Hugging Face directory (config.json + *.safetensors, optionally
tokenizer.json) or a ``transformers`` module already in memory.

Only the tensors the graph reads are loaded, each checked against the shape the configuration
implies before anything is built: a missing tensor or one of another shape is a ValueError naming
it (expected against found shape). Every weight is returned as contiguous float32.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import DecoderConfig, decoder_config

CONFIG_FILE, TOKENIZER_FILE = "config.json", "tokenizer.json"


@dataclass
class Checkpoint:
    """A decoder's configuration and a way to fetch its tensors by Hugging Face name."""

    config: DecoderConfig
    #: Where it came from, for error messages ("<dir>" or "<ClassName> module").
    source: str
    #: name -> a function loading the tensor (loaded only when the graph reads it).
    tensors: dict[str, Callable[[], np.ndarray]]
    #: The shape of each tensor, known without loading it.
    shapes: dict[str, tuple[int, ...]]
    #: tokenizer.json of the checkpoint directory, when present.
    tokenizer_file: Path | None = None


def read_checkpoint(model: Any) -> Checkpoint:
    """A checkpoint from a directory path or a ``transformers`` ``PreTrainedModel``."""
    if isinstance(model, (str, os.PathLike)):
        return _from_directory(Path(model))
    if hasattr(model, "state_dict") and hasattr(model, "config"):
        return _from_module(model)
    raise TypeError(f"tvm_hetero.llm: expected a checkpoint directory or a transformers model, got "
                    f"{type(model).__name__}")


def load_weights(checkpoint: Checkpoint, expected: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The tensors named in ``expected``, checked (module docstring). A name may also be found
    without its first component (``model.`` / ``transformer.``), as a base model saves it."""
    found: dict[str, str] = {}
    for name, shape in expected.items():
        stored = name if name in checkpoint.shapes else name.split(".", 1)[1]
        if stored not in checkpoint.shapes:
            raise ValueError(f"{checkpoint.source}: tensor {name!r} is missing (expected shape {list(shape)})")
        if tuple(checkpoint.shapes[stored]) != tuple(shape):
            raise ValueError(f"{checkpoint.source}: tensor {name!r} has shape {list(checkpoint.shapes[stored])}, "
                             f"expected {list(shape)}")
        found[name] = stored
    return {name: np.ascontiguousarray(checkpoint.tensors[stored](), dtype=np.float32)
            for name, stored in found.items()}


def _from_directory(path: Path) -> Checkpoint:
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a checkpoint directory")
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG_FILE} (a Hugging Face checkpoint directory has one)")
    try:
        config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config_path}: not valid JSON ({err})") from None
    decoder = decoder_config(config)  # an unsupported architecture is named before weights are looked for
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors file (weights in other formats are not read)")
    tensors: dict[str, Callable[[], np.ndarray]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        for name, shape in _safetensors_shapes(file).items():
            tensors[name] = lambda file=file, name=name: _read_tensor(file, name)
            shapes[name] = shape
    tokenizer = path / TOKENIZER_FILE
    return Checkpoint(decoder, str(path), tensors, shapes, tokenizer if tokenizer.is_file() else None)


def _safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from the file's header (nothing else is read)."""
    file_size = file.stat().st_size
    with open(file, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        if file_size < 8 or size > file_size - 8:
            raise ValueError(f"{file}: not a safetensors file (its header length does not fit the file)")
        try:
            header = json.loads(handle.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{file}: damaged safetensors header ({err})") from None
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def _read_tensor(file: Path, name: str) -> np.ndarray:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="np") as handle:
            return handle.get_tensor(name)
    except (TypeError, ValueError):  # bfloat16 has no numpy type: read it through torch
        with safe_open(str(file), framework="pt") as handle:
            return handle.get_tensor(name).float().numpy()


def _from_module(model: Any) -> Checkpoint:
    state = model.state_dict()
    tensors = {name: (lambda t=t: t.detach().float().cpu().numpy()) for name, t in state.items()}
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    return Checkpoint(decoder_config(model.config), f"{type(model).__name__} module", tensors, shapes)
