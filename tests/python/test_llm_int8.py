"""8-bit matmul weights (``llm.build(..., weights="int8")``): the kernel, the models of the three
families, export and load (Python and C++ loops), the weights held once, and bad input.

The bounds: a model with 8-bit weights is the float model with each matmul weight replaced by its
dequantized value (``int8_weights.dequantize_rows``), computed with each matmul's input row rounded
to 8 bits (the kernel). So (1) the kernel must equal float math on the rounded rows (float32
rounding only: 1e-5 of the output); (2) the model must follow transformers run on the dequantized
weights up to the row rounding. Rows and weights are rounded to the same 8 bits (half a step of
their row's largest value), so rounding the rows may move the logits about as much as rounding the
weights did (float32 against the dequantized model); the bound is twice that (measured: 0.5-1.35
times, 2-11% of the largest logit in these chaotic tiny models, initializer_range 0.5), while a
wrong scale, zero point or tail moves them by about their own size; (3) the greedy tokens against
float32 are reported, never assumed equal (random models this small have near-ties).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import tvm
import tvm_hetero
from test_llm import prompt_of, tiny_model
from tvm import relax
from tvm_hetero import llm
from tvm_hetero.artifact import graph_inputs
from tvm_hetero.llm import graph_io
from tvm_hetero.llm.int8_weights import ZERO_POINT_WEIGHT, dequantize_rows, quantize_rows
from tvm_hetero.llm.native import NativeGenerator

CAPACITY = 128
CHUNKS = (16, 64)


def dequantized_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every matmul weight (Linear (out, in); GPT-2's Conv1D (in, out); the tied
    token table, rows = outputs; not an untied one nor GPT-2's positions) replaced by its 8-bit
    round trip."""
    import copy

    model = copy.deepcopy(model)
    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim != 2 or "wpe" in name or ("embed_tokens" in name and not tied):
                continue
            w = param.numpy()
            conv1d = type(model).__name__.startswith("GPT2") and "wte" not in name  # (in, out)
            rows = w.T if conv1d else w
            back = dequantize_rows(*quantize_rows(rows))
            param.copy_(torch.from_numpy(np.ascontiguousarray(back.T if conv1d else back)))
    return model


def last_logits(model: torch.nn.Module, prompt: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0, -1].numpy()


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2"])
def built(request):
    model = tiny_model(request.param)
    return model, llm.build(model, capacity=CAPACITY, prefill_chunks=CHUNKS, weights="int8")


# ---- the kernel ------------------------------------------------------------------------------
def weight_matmul(rows: int, k: int, n: int, bias: bool) -> tvm.IRModule:
    op = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, rows, k], "float32"))
    w = relax.Var("w", relax.TensorType([n, k], "uint8"))
    s = relax.Var("s", relax.TensorType([n], "float32"))
    z = relax.Var("z", relax.TensorType([], "uint8"))
    b = relax.Var("b", relax.TensorType([n], "float32"))
    with bb.function("main", [x, w, s, z, b]):
        with bb.dataflow():
            y = bb.emit(op.matmul(x, op.permute_dims(op.dequantize(w, s, z, axis=0))))
            if bias:
                y = bb.emit(op.add(y, b))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("rows,k,n,bias", [(1, 64, 32, False), (5, 100, 37, True), (16, 576, 96, False),
                                           (7, 1536, 40, True)])
def test_the_int8_kernel_is_float_math_on_rows_rounded_to_8_bits(rows, k, n, bias):
    rng = np.random.default_rng(rows + k)
    w, s = quantize_rows(rng.standard_normal((n, k)).astype(np.float32))
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((1, rows, k)).astype(np.float32)
    params = {"w": w, "s": s, "z": np.array(128, np.uint8), "b": b}
    art = tvm_hetero.build(weight_matmul(rows, k, n, bias), [(tvm.cpu(0), "llvm")], params=params, backends=["dnnl"])
    assert next(n["attrs"]["func_name"] for n in art.graph["nodes"] if n["op"] != "null").endswith("_dnnl")
    rt = art.create()
    rt.set_input("x", x)
    rt.run()
    got = rt.get_output(0).numpy()
    row_scale = np.abs(x).max(axis=2, keepdims=True) / np.float32(127)
    rounded = np.clip(np.rint(x * (np.float32(1) / row_scale)), -127, 127) * row_scale
    want = rounded.astype(np.float64) @ dequantize_rows(w, s).T.astype(np.float64) + (b if bias else 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# ---- the models --------------------------------------------------------------------------------
def test_int8_logits_follow_the_dequantized_model_within_row_rounding(built):
    model, lm = built
    reference = dequantized_copy(model)
    for length in (7, 40):
        prompt = prompt_of(length, lm.config.vocab_size)
        want, float32 = last_logits(reference, prompt), last_logits(model, prompt)
        got = np.asarray(lm.session().prefill(prompt)).reshape(-1)
        weight_rounding = np.abs(want - float32).max()
        assert np.abs(got - want).max() <= 2 * weight_rounding + 1e-3 * np.abs(want).max()


def test_token_agreement_with_float32_is_measured_and_reported(built):
    _, lm = built
    a = lm.agreement
    assert a is not None and a.tokens == 64 and 0 <= a.identical_prefix <= a.tokens
    assert a.agree >= 0.75 * a.tokens  # these tiny models: 51-60 of 64 (near-ties are common)
    text = lm.report()
    assert "8-bit" in text and f"{a.agree}/{a.tokens} agree" in text and "largest logit error" in text


def test_int8_weights_are_a_quarter_of_float32_and_held_once(built):
    model, lm = built
    float_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert lm.weight_bytes < 0.5 * float_bytes  # matmul weights at 1 byte; norms, biases, tables stay float
    data = {name for name, _, _ in graph_io.data_inputs(lm.config, CAPACITY, 1)}
    names = [n for n in graph_inputs(json.loads(lm.graphs[0].graph_json), "graph") if n not in data]
    assert ZERO_POINT_WEIGHT in names
    held = 0
    for name in names:
        tensors = [g.runtime.get_input(name) for g in lm.graphs]
        assert len({np.from_dlpack(t).ctypes.data for t in tensors}) == 1, f"{name} is held more than once"
        held += np.from_dlpack(tensors[0]).nbytes
    assert held == lm.weight_bytes
    uint8 = [n for n in names if str(lm.graphs[0].runtime.get_input(n).dtype) == "uint8"]
    assert len(uint8) == 1 + 4 * lm.config.num_layers + 1  # the zero point, 4 matmuls a layer, the LM head


def test_an_int8_export_loads_with_the_same_tokens_in_python_and_cpp(tmp_path):
    lm = llm.build(tiny_model("llama"), capacity=CAPACITY, prefill_chunks=CHUNKS, weights="int8",
                   agreement_tokens=16)
    out = lm.export(tmp_path / "int8")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["weights"] == "int8" and manifest["int8_agreement"]["tokens"] == 16
    loaded = llm.load(out)
    prompt = prompt_of(20, lm.config.vocab_size)
    tokens = lm.generate(prompt, max_new_tokens=12)
    assert loaded.generate(prompt, max_new_tokens=12) == tokens
    assert NativeGenerator(out).generate(prompt, 12) == tokens
    assert loaded.weights == "int8" and loaded.agreement == lm.agreement and "8-bit" in loaded.report()


@pytest.mark.parametrize("bad", ["int4", "INT8", 8, None])
def test_an_unknown_weights_value_is_refused_naming_the_choices(bad):
    with pytest.raises(ValueError, match=r"weights must be one of \['float32', 'int8'\]"):
        llm.build(tiny_model("llama"), capacity=CAPACITY, weights=bad)



def test_a_token_id_outside_the_vocabulary_is_refused_by_an_int8_model(built):
    """The 8-bit token table is read with the ids as indices: an id outside it is an error naming
    it, never a read outside the table, and the model generates as before afterwards."""
    _model, lm = built
    before = lm.generate([1, 2], max_new_tokens=3)
    vocab = lm.config.vocab_size
    for bad in (vocab, -1, vocab + 2**32):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            lm.generate([1, bad], max_new_tokens=2)
    assert lm.generate([1, 2], max_new_tokens=3) == before
