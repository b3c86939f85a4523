"""Preparing an ONNX model for TVM's ONNX frontend with ONNX's own tools: fixed input shapes, shapes
inferred, and every constant subgraph folded into initializers.

Exporters leave shape arithmetic in the graph (``Shape`` → ``Gather`` → ``Concat`` → ``Reshape``,
``ConstantOfShape`` of a computed shape, the pads of a ``Pad`` computed from its input's shape) that
ONNX Runtime folds when it loads a model; TVM's frontend converts each op as it comes and rejects
several of these (a ``ConstantOfShape`` of a 0-d shape, "dynamic pads"). Preparing the model first
gives the frontend constants instead.

The steps, repeated until nothing more folds:

1. ``onnx.shape_inference.infer_shapes`` with data propagation: every value whose shape follows from
   the (given) input shapes gets it.
2. In graph order, a node is *constant* when it is deterministic, has no subgraph, is no
   ``DequantizeLinear`` (a quantized weight stays one, for the QDQ units of the backends), belongs
   to the default domain and every input is an initializer, a ``Constant``'s value or an earlier
   constant node's output; a ``Shape`` (or ``Size``) of a value of fully known shape is constant
   too, whatever the value, and so is a ``Gather`` / ``Slice`` / ``Concat`` picking only static dims
   out of the ``Shape`` of a value whose other dims are symbolic (a padding computed from the static
   height and width of an input of symbolic batch). A constant node reading at most
   :data:`INPUT_LIMIT_BYTES` is evaluated by ``onnx.reference`` (ONNX's own implementation of the
   operators, in Python: meant for shape arithmetic and small tensors; a constant node reading more
   is left to the Relax pass ``FoldConstantOps``, which folds it compiled) and its outputs become
   initializers when each output is no larger than the inputs it reads together, or than
   ``FOLD_LIMIT_BYTES`` (so folding never makes a large tensor from a small one: a weight made by
   ``ConstantOfShape`` folds, an activation-sized broadcast of a scalar beyond the limit stays an
   op; the limit is the Relax pass's, ir/fold_constant_ops.py). A node the reference cannot
   evaluate is left as it is.
3. Nodes and initializers no longer read are dropped (initializers listed as graph inputs,
   old-style, are kept).

Guarantee: the prepared model computes what the original does for inputs of the given shapes (each
folded value is what ONNX's reference computes for that node); nothing that depends on an input's
values is folded, only on its shape once that shape is fixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .ir.fold_constant_ops import FOLD_LIMIT_BYTES

#: A constant node reading more than this is left to the Relax pass (module docstring).
INPUT_LIMIT_BYTES = 1 << 20
#: Ops whose value is not a function of their inputs: never folded.
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Multinomial", "Bernoulli", "Dropout"})
#: Ops with graph attributes (subgraphs): left to the frontend.
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
#: A quantized weight's dequantize: kept, as the backends' QDQ units read it (so nothing made from it
#: folds either).
KEPT_OPS = frozenset({"DequantizeLinear"})
NEVER_FOLDED = RANDOM_OPS | SUBGRAPH_OPS | KEPT_OPS


def input_dims(value: Any) -> list[int | str | None]:
    """The dims of a graph input: an int, a ``dim_param`` name, or None for an unnamed unknown dim."""
    dims: list[int | str | None] = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or None)
    return dims


def format_dims(dims: Sequence[int | str | None]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


def real_inputs(model: Any) -> list[Any]:
    """The graph inputs that are not initializers (old-style models list weights as inputs)."""
    weights = {t.name for t in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in weights]


def set_input_shapes(model: Any, input_shapes: Mapping[str, Sequence[int]]) -> None:
    """Give the named inputs of ``model`` (modified in place) these static shapes. Errors name the
    input: unknown, another rank, a non-positive dim, or a dim the model fixes to another value."""
    inputs = {value.name: value for value in real_inputs(model)}
    for name, shape in input_shapes.items():
        if name not in inputs:
            raise ValueError(f"input_shapes: the model has no input {name!r} (inputs: {', '.join(inputs)})")
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            raise ValueError(f"input_shapes[{name!r}]: expected a sequence of ints, got {shape!r}") from None
        have = input_dims(inputs[name])
        if inputs[name].type.tensor_type.HasField("shape") and len(dims) != len(have):
            raise ValueError(f"input_shapes[{name!r}]: {len(dims)} dims given, the input has {len(have)} "
                             f"{format_dims(have)}")
        for axis, (given, known) in enumerate(zip(dims, have)):
            if given <= 0:
                raise ValueError(f"input_shapes[{name!r}]: dim {axis} is {given}; dims must be positive")
            if isinstance(known, int) and known != given:
                raise ValueError(f"input_shapes[{name!r}]: dim {axis} is {given}, but the model fixes it to "
                                 f"{known} {format_dims(have)}")
        tensor_shape = inputs[name].type.tensor_type.shape
        del tensor_shape.dim[:]
        for given in dims:
            tensor_shape.dim.add().dim_value = given


def prepare_onnx(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Any:
    """A copy of ``model`` with ``input_shapes`` applied, shapes inferred and its constant subgraphs
    folded (module docstring). The model given is not modified."""
    import onnx

    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    if input_shapes:
        set_input_shapes(prepared, input_shapes)
    while True:
        prepared = _inferred(prepared)
        if not _fold_once(prepared):
            return prepared


def _inferred(model: Any) -> Any:
    """``model`` with inferred shapes; as it was where ONNX cannot infer them (the frontend may)."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 (an op ONNX has no inference for, a model over 2 GiB: fold what is known)
        return model


def _known_dims(graph: Any) -> dict[str, list[int | None]]:
    """Names of the graph's values of known rank, with their dims (None where a dim is symbolic)."""
    out = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            out[value.name] = [int(d.dim_value) if d.HasField("dim_value") else None
                               for d in tensor.shape.dim]
    return out


def _fold_once(model: Any) -> bool:
    """Fold every constant node of ``model`` (in place) in one pass over its nodes; whether any folded."""
    from onnx import numpy_helper

    graph = model.graph
    known: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    dims = _known_dims(graph)
    shapes = {name: tuple(d) for name, d in dims.items() if None not in d}
    opsets = {o.domain or "": o.version for o in model.opset_import}
    partial: dict[str, list[int | None]] = {}  # shape vectors with some elements known
    kept, folded_any = [], False
    for node in graph.node:
        vector = _shape_vector(node, known, dims, partial)
        if vector is not None and None in vector:
            partial[node.output[0]] = vector
        values = [np.array(vector, np.int64)] if vector is not None and None not in vector else (
            _evaluate(node, known, shapes, opsets))
        if values is None:
            kept.append(node)
            continue
        read = sum(known[name].nbytes for name in node.input if name in known)
        if node.op_type != "Constant" and any(v.nbytes > max(read, FOLD_LIMIT_BYTES) for v in values):
            kept.append(node)
            continue
        known.update((name, value) for name, value in zip(node.output, values) if name)
        folded_any = True
    live = _live(kept, {value.name for value in graph.output})
    if not folded_any and len(live) == len(kept):
        return False
    kept = live
    read = _names_read(kept) | {value.name for value in graph.output}
    listed = {value.name for value in graph.input}
    original = {t.name for t in graph.initializer}
    initializers = [numpy_helper.from_array(np.asarray(value), name) for name, value in known.items()
                    if name in read or (name in original and name in listed)]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    # Folded values are initializers that are no graph inputs, which IR version 4 on allows.
    model.ir_version = max(model.ir_version, 4)
    return True


def _live(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """``nodes`` without those whose outputs nobody reads (a ``Shape`` whose readers were folded)."""
    while True:
        read = _names_read(nodes) | outputs
        live = [node for node in nodes if any(name in read for name in node.output)]
        if len(live) == len(nodes):
            return nodes
        nodes = live


def _shape_vector(node: Any, known: dict[str, np.ndarray], dims: dict[str, list[int | None]],
                  partial: dict[str, list[int | None]]) -> list[int | None] | None:
    """The elements of a 1-D shape vector ``node`` computes (None where one is symbolic): ``Shape`` of
    a value of known rank, and ``Gather`` / ``Slice`` / ``Concat`` of such vectors, so that the static
    dims a graph picks out of a partly symbolic shape fold. None for any other node."""
    def vector(name: str) -> list[int | None] | None:
        if name in partial:
            return partial[name]
        value = known.get(name)
        return [int(v) for v in value] if value is not None and value.ndim == 1 else None

    inputs = list(node.input)
    attrs = {a.name: a.i for a in node.attribute}
    if node.op_type == "Shape" and inputs[0] not in known and inputs[0] in dims:
        rank_dims = dims[inputs[0]]
        return rank_dims[attrs.get("start", 0):attrs.get("end", len(rank_dims))]
    if node.op_type == "Gather" and inputs[0] in partial and attrs.get("axis", 0) == 0 and inputs[1] in known:
        index, source = known[inputs[1]], partial[inputs[0]]
        if index.ndim != 1 or not all(-len(source) <= int(i) < len(source) for i in index):
            return None  # a 0-d pick, or an index out of range: left to the frontend (which names it)
        return [source[int(i)] for i in index]
    if node.op_type == "Slice" and inputs[0] in partial and all(n in known for n in inputs[1:] if n):
        starts, ends = (int(known[n][0]) for n in inputs[1:3])
        axes = int(known[inputs[3]][0]) if len(inputs) > 3 and inputs[3] else 0
        step = int(known[inputs[4]][0]) if len(inputs) > 4 and inputs[4] else 1
        if axes not in (0, -1) or len(known[inputs[1]]) != 1 or step == 0:
            return None
        return partial[inputs[0]][slice(starts, ends, step)]
    if node.op_type == "Concat" and any(n in partial for n in inputs):
        parts = [vector(n) for n in inputs]
        return None if any(p is None for p in parts) else [d for p in parts for d in p]
    return None


def _names_read(nodes: Any) -> set[str]:
    """The value names ``nodes`` read, those read inside their subgraphs (an ``If``'s branches read
    the outer graph's values by name) included."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for attribute in node.attribute:
            for subgraph in [*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs]:
                names |= _names_read(subgraph.node)
    return names


def _evaluate(node: Any, known: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
              opsets: dict[str, int]) -> list[np.ndarray] | None:
    """The outputs of ``node`` when it is constant (module rule), else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in NEVER_FOLDED or not node.output:
        return None
    if node.op_type in ("Shape", "Size") and node.input[0] not in known:
        if node.input[0] not in shapes:
            return None
        shape = np.array(shapes[node.input[0]], dtype=np.int64)
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape)), dtype=np.int64)]
        return [_shape_slice(node, shape)]
    if not all(name in known for name in node.input if name):
        return None
    if sum(known[name].nbytes for name in node.input if name) > INPUT_LIMIT_BYTES:
        return None
    return _run_reference(node, known, opsets)


def _shape_slice(node: Any, shape: np.ndarray) -> np.ndarray:
    """``Shape``'s optional ``start``/``end`` attributes (opset 15), as ONNX defines them."""
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return shape[start:end]


def _run_reference(node: Any, known: dict[str, np.ndarray],
                   opsets: dict[str, int]) -> list[np.ndarray] | None:
    """``node`` run by ONNX's reference implementation on known inputs; None where it cannot."""
    from onnx.reference import ReferenceEvaluator

    feeds = {name: known[name] for name in node.input if name}
    try:
        outputs = ReferenceEvaluator(node, opsets=opsets).run(None, feeds)
    except Exception:  # noqa: BLE001 (an op the reference lacks, or rejects: the frontend gets the node as it is)
        return None
    arrays = all(isinstance(v, np.ndarray) or np.isscalar(v) for v in outputs)
    if len(outputs) != len(node.output) or not arrays:
        return None  # sequences, optionals: left to the frontend
    return [np.asarray(v) for v in outputs]


__all__ = ["format_dims", "input_dims", "prepare_onnx", "real_inputs", "set_input_shapes"]
