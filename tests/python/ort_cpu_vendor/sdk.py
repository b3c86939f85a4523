"""The test accelerator's SDK module: the contract of tvm_hetero.ep_offload.sdk, on ONNX Runtime's CPU EP."""

from __future__ import annotations

from typing import Any

import numpy as np


def require() -> Any:
    import onnxruntime

    return onnxruntime


def available() -> bool:
    try:
        require()
    except ImportError:
        return False
    return True


def version() -> str:
    return str(require().__version__)


def _refused(options: dict) -> set[str]:
    return {op for op in str(options.get("refuse", "")).split(",") if op}


def accelerator_session(model: bytes, options: dict, log_level: int = 3) -> Any:
    ort = require()
    so = ort.SessionOptions()
    so.log_severity_level = log_level
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def unsupported_nodes(model: bytes, options: dict) -> list[tuple[str, str]]:
    import onnx

    refused = _refused(options)
    return [(n.name, n.op_type) for n in onnx.load_from_string(model).graph.node if n.op_type in refused]


def accepts(model: bytes, options: dict) -> tuple[bool, str]:
    nodes = unsupported_nodes(model, options)
    if nodes:
        return False, f"the test accelerator does not take {', '.join(sorted({t for _n, t in nodes}))}"
    accelerator_session(model, options)
    return True, ""


def finalize(model: bytes, options: dict) -> bytes:
    """The "compiled" graph: the model itself, or (``wrong``) one whose output is 1.5x too large."""
    if unsupported_nodes(model, options):
        raise RuntimeError("the test accelerator refuses a node of this graph")
    if not int(options.get("wrong", 0)):
        return model
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.load_from_string(model)
    out = proto.graph.output[0].name
    for node in proto.graph.node:
        node.output[:] = [f"{o}_exact" if o == out else o for o in node.output]
    proto.graph.initializer.append(numpy_helper.from_array(np.array(1.5, np.float32), "wrong_scale"))
    proto.graph.node.append(helper.make_node("Mul", [f"{out}_exact", "wrong_scale"], [out], name="wrong"))
    return proto.SerializeToString()


def accelerator_outputs(model: bytes, options: dict, feeds: dict, names: list[str]) -> list:
    return accelerator_session(finalize(model, options), options).run(names, feeds)


def profiled_cycles(model: bytes, options: dict, feeds: dict) -> tuple[float, float]:
    return float("nan"), float("nan")  # no profile: its latency is never modeled
