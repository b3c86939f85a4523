"""Real models for demos, tests and benchmarks: the ONNX wheel's light models, made numerically useful.

The light models in ``onnx/backend/test/data/light/`` are real architectures whose weights are all
built with ConstantOfShape, so their outputs are constant (a uniform softmax). :func:`light_model`
replaces every such weight with a seeded random initializer and cuts the final Softmax, so the
output is the logits, which differ per input and are worth comparing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..sample_inputs import onnx_inputs, sample_values

LIGHT_MODELS = ("resnet50", "shufflenet", "squeezenet", "inception_v1", "inception_v2", "densenet121",
                "vgg19", "bvlc_alexnet", "zfnet512")


def mlp(seed: int = 0):
    """A two-layer MLP in TVMScript, ``y = relu(x @ w1 + b1) @ w2`` with x: float32[4, 16], and
    seeded weights: ``(IRModule, params)``. Small enough for tests and examples."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class MLP:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), w1: R.Tensor((16, 32), "float32"),
                 b1: R.Tensor((32,), "float32"), w2: R.Tensor((32, 8), "float32")):
            with R.dataflow():
                h = R.nn.relu(R.add(R.matmul(x, w1), b1))
                y = R.matmul(h, w2)
                R.output(y)
            return y

    rng = np.random.default_rng(seed)
    params = {"w1": rng.standard_normal((16, 32)).astype("float32"),
              "b1": rng.standard_normal(32).astype("float32"),
              "w2": rng.standard_normal((32, 8)).astype("float32")}
    return MLP, params


def small_cnn(seed: int = 0):
    """A small CNN, ``conv3x3-relu-maxpool-conv3x3-relu-avgpool-flatten-dense`` on float32[1, 3, 32, 32]
    with seeded weights: ``(IRModule, params)``. Quick enough to run under emulation (the ARM board)."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class SmallCNN:
        @R.function
        def main(x: R.Tensor((1, 3, 32, 32), "float32"), w1: R.Tensor((8, 3, 3, 3), "float32"),
                 b1: R.Tensor((1, 8, 1, 1), "float32"), w2: R.Tensor((16, 8, 3, 3), "float32"),
                 b2: R.Tensor((1, 16, 1, 1), "float32"), w3: R.Tensor((256, 10), "float32")):
            with R.dataflow():
                c1 = R.nn.relu(R.add(R.nn.conv2d(x, w1, padding=1), b1))
                p1 = R.nn.max_pool2d(c1, pool_size=(2, 2), strides=(2, 2))
                c2 = R.nn.relu(R.add(R.nn.conv2d(p1, w2, padding=1), b2))
                p2 = R.nn.avg_pool2d(c2, pool_size=(4, 4), strides=(4, 4))
                y = R.matmul(R.reshape(p2, (1, 256)), w3)
                R.output(y)
            return y

    rng = np.random.default_rng(seed)
    params = {"w1": (rng.standard_normal((8, 3, 3, 3)) / 5).astype("float32"),
              "b1": rng.standard_normal((1, 8, 1, 1)).astype("float32"),
              "w2": (rng.standard_normal((16, 8, 3, 3)) / 8).astype("float32"),
              "b2": rng.standard_normal((1, 16, 1, 1)).astype("float32"),
              "w3": (rng.standard_normal((256, 10)) / 16).astype("float32")}
    return SmallCNN, params


def conv_relu_conv(scale: float = 0.2, seed: int = 0):
    """ONNX ``Conv -> Relu -> Conv`` on float32[1, 4, 8, 8] (3x3, 4 channels, seeded weights times
    ``scale``): the smallest model that makes one accelerator graph. A tiny ``scale`` drives fp16 underflow."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * scale).astype("float32"), name)
               for name in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def two_towers(batch: int = 8, width: int = 32, depth: int = 3, weight_scale: float = 8.0, seed: int = 0):
    """Two independent chains of equal cost (``depth`` x matmul ``width`` + relu each) joined by an
    add, with seeded weights ``w0..w{2*depth-1}`` (the first ``depth`` are tower a's):
    ``(IRModule, params)``. The smallest model where two devices can work at the same time."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, width), "float32"))
    weights = [relax.Var(f"w{i}", relax.TensorType((width, width), "float32")) for i in range(2 * depth)]
    with bb.function("main", [x, *weights]):
        with bb.dataflow():
            a = b = x
            for i in range(depth):
                a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(a, weights[i]))))
                b = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(b, weights[depth + i]))))
            y = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(y)
    rng = np.random.default_rng(seed)
    params = {f"w{i}": (rng.standard_normal((width, width)) / weight_scale).astype("float32")
              for i in range(2 * depth)}
    return bb.get(), params


def light_model_dir() -> Path:
    import onnx

    return Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def light_model(name: str, seed: int = 0):
    """The light model ``name`` (see LIGHT_MODELS) with seeded random weights, ending in logits."""
    import onnx
    from onnx import numpy_helper

    path = light_model_dir() / f"light_{name}.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"no light model {name!r}; choose one of {', '.join(LIGHT_MODELS)}")
    model = onnx.load(str(path))
    graph = model.graph
    rng = np.random.default_rng(seed)
    initial = {t.name: numpy_helper.to_array(t) for t in graph.initializer}

    weights = []
    kept_nodes = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in initial:
            shape = tuple(int(d) for d in initial[node.input[0]])
            weights.append(numpy_helper.from_array(_random_weight(rng, shape), node.output[0]))
        else:
            kept_nodes.append(node)
    # Batch-norm variances and scales arrive as initializers of constant value; randomise them too.
    produced_by_weights = {w.name for w in weights}
    for t in graph.initializer:
        if t.name.endswith("__SHAPE") or t.name in produced_by_weights:
            continue
        array = initial[t.name]
        if array.dtype == np.float32 and array.size > 1:
            weights.append(numpy_helper.from_array(_random_weight(rng, array.shape), t.name))
        else:
            weights.append(t)

    # Cut the trailing Softmax: the logits are the output.
    if kept_nodes and kept_nodes[-1].op_type == "Softmax":
        softmax = kept_nodes.pop()
        # The logits have the softmax's shape.
        shape = [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim]
        del graph.output[:]
        graph.output.append(onnx.helper.make_tensor_value_info(softmax.input[0], onnx.TensorProto.FLOAT, shape))

    del graph.node[:]
    graph.node.extend(kept_nodes)
    del graph.initializer[:]
    graph.initializer.extend(weights)
    # Old-style models list weights as graph inputs too; only real inputs remain.
    weight_names = {w.name for w in weights} | set(initial)
    real_inputs = [i for i in graph.input if i.name not in weight_names]
    del graph.input[:]
    graph.input.extend(real_inputs)
    model.ir_version = max(model.ir_version, 7)  # IR >= 4 lets initializers stay out of the inputs
    onnx.checker.check_model(model)
    return model


def _random_weight(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """He-style scale for kernels (so activations stay O(1)); values in [0.5, 1.5] for vectors."""
    if len(shape) <= 1:
        return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))).astype(np.float32)


def model_inputs(model, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded random float32 values (standard normal) for each graph input of an ONNX model."""
    return sample_values([(name, shape, "float32") for name, shape, _dtype in onnx_inputs(model)], seed)


def onnxruntime_session(model, threads: int = 1):
    """An ONNX Runtime CPU session with ``threads`` intra-op threads (the reference and the peer)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def onnxruntime_outputs(model, inputs: dict[str, np.ndarray], threads: int = 1) -> list[np.ndarray]:
    """The reference: ONNX Runtime's CPU provider."""
    return onnxruntime_session(model, threads).run(None, inputs)


def build_and_run(model, inputs: dict[str, np.ndarray], targets=None):
    """The ONNX model built by the product (one CPU unless ``targets``), run once on ``inputs``:
    ``(artifact, its first output)``."""
    import tvm

    from ..build_driver import build

    art = build(relax_module(model), targets or [(tvm.cpu(0), "llvm")])
    runtime = art.create()
    runtime.run(**inputs)
    return art, runtime.get_output(0).numpy()


def relax_module(model):
    """The ONNX model as a Relax IRModule with weights bound as constants (the product's importer)."""
    from ..importers import from_onnx

    return from_onnx(model)
