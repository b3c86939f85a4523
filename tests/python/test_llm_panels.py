"""Float32 matmul weights in 16-column panels (tvm_hetero/llm/panel_weights.py): the layout's
arithmetic, when a build uses it, that the oneDNN regions read it as stored, and that a graph reading
a tied token table from panels still refuses ids outside it."""

from __future__ import annotations

import numpy as np
import pytest
import transformers as hf
import tvm

from tvm_hetero import llm
from tvm_hetero.backends import dnnl
from tvm_hetero.llm import graph_io, panel_weights

CAPACITY = 32


def test_a_panel_holds_sixteen_columns_row_after_row():
    w = np.arange(48 * 32, dtype=np.float32).reshape(48, 32)
    p = panel_weights.to_panels(w)
    assert p.shape == (2, 48, 16) and p.flags["C_CONTIGUOUS"]
    for j, k, i in [(0, 0, 0), (1, 5, 3), (1, 47, 15), (0, 20, 9)]:
        assert p[j, k, i] == w[k, 16 * j + i]
    np.testing.assert_array_equal(panel_weights.from_panels(p), w)


def test_only_weights_sixteen_divides_go_in_panels():
    weights = {"a": np.ones((64, 32), np.float32), "b": np.ones((64, 300), np.float32),
               "c": np.ones((20, 32), np.float32), "norm": np.ones((64,), np.float32)}
    shapes = {name: value.shape for name, value in weights.items()}
    weights, shapes = panel_weights.store_in_panels(weights, shapes, ["a", "b", "c"])
    assert shapes == {"a": (2, 64, 16), "b": (64, 300), "c": (20, 32), "norm": (64,)}
    assert weights["a"].shape == (2, 64, 16) and panel_weights.panelled_names(shapes) == {"a"}


def test_panels_only_where_every_phase_runs_in_onednn_on_local_cpus(monkeypatch):
    cpu = [(tvm.cpu(0), "llvm")]
    assert panel_weights.wanted_for({"prefill": cpu, "decode": cpu}, None) == dnnl.info()["available"]
    assert not panel_weights.wanted_for({"prefill": cpu, "decode": cpu}, ["dnnl"])  # the user's own backends
    assert not panel_weights.wanted_for({"prefill": [(tvm.cuda(0), "cuda")], "decode": cpu}, None)
    monkeypatch.setenv(panel_weights.SWITCH, "0")
    assert not panel_weights.wanted_for({"prefill": cpu, "decode": cpu}, None)


def _panel_matmul(rows: int, k: int, n: int) -> tuple[tvm.IRModule, np.ndarray, np.ndarray, np.ndarray]:
    """x (rows, k) @ W (k, n) with W a parameter given in panels, as the decoders' graphs read it."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([rows, k], "float32"))
    p = relax.Var("w", relax.TensorType([n // 16, k, 16], "float32"))
    with bb.function("main", [x, p]):
        with bb.dataflow():
            w = relax.op.reshape(relax.op.permute_dims(p, [1, 0, 2]), [k, n])
            out = bb.emit_output(bb.emit(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    rng = np.random.default_rng(rows + k + n)
    weight = rng.standard_normal((k, n)).astype(np.float32)
    data = rng.standard_normal((rows, k)).astype(np.float32)
    return bb.get(), data, weight, data.astype(np.float64) @ weight


@pytest.mark.parametrize("rows", [1, 5])
def test_a_weight_in_panels_is_read_as_stored_by_one_row_and_by_onednn(rows):
    """One row: the panel kernel; five: oneDNN's matmul on the same bytes as its BA16a16b layout."""
    if not dnnl.info()["available"]:
        pytest.skip("this build has no oneDNN")
    import tvm_hetero

    mod, data, weight, expected = _panel_matmul(rows, 96, 80)
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], params={"w": panel_weights.to_panels(weight)})
    regions = [n for n in art.graph["nodes"] if n["op"] != "null" and n["attrs"]["func_name"].endswith("_dnnl")]
    assert len(regions) == 1 and len([n for n in art.graph["nodes"] if n["op"] != "null"]) == 1
    rt = art.create()
    rt.run(x=data)
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_panels_of_a_k_sixteen_does_not_divide_are_left_to_tvm_and_still_right():
    """oneDNN's BA16a16b equals the panels only when 16 divides K: otherwise no region takes it."""
    import tvm_hetero

    mod, data, weight, expected = _panel_matmul(3, 20, 32)
    art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm")], params={"w": panel_weights.to_panels(weight)})
    assert not [n for n in art.graph["nodes"] if n["op"] != "null" and n["attrs"]["func_name"].endswith("_dnnl")]
    rt = art.create()
    rt.run(x=data)
    np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width", [8, 32])
def test_a_region_document_with_another_panel_width_is_refused_naming_it(width):
    doc = ('{"format": "tvm-hetero-dnnl/1", "regions": [{"name": "r0", "op": "matmul", "num_inputs": 2, '
           f'"data": 0, "weight": 1, "weight_panels": {width}}}]}}')
    with pytest.raises(Exception, match=f"r0.*weight_panels: {width} \\(only 16"):
        tvm.get_global_func("tvm_hetero.dnnl.create_module")(doc)


def _tiny_llama() -> hf.PreTrainedModel:
    import torch

    torch.manual_seed(0)
    config = hf.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=128, initializer_range=0.5,
                            max_position_embeddings=CAPACITY, tie_word_embeddings=True)
    return hf.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def built():
    """The tiny tied Llama built with panels (its matmul specs recorded) and without."""
    if not dnnl.info()["available"]:
        pytest.skip("this build has no oneDNN: the weights stay in rows")
    specs = []
    original = dnnl.DnnlBackend.codegen

    def recording(self, regions):
        specs.extend(r.spec for r in regions)
        return original(self, regions)

    model = _tiny_llama()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dnnl.DnnlBackend, "codegen", recording)
        panelled = llm.build(model, capacity=CAPACITY, prefill_chunks=(8,))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(panel_weights.SWITCH, "0")
        rows = llm.build(model, capacity=CAPACITY, prefill_chunks=(8,))
    return panelled, rows, specs


def test_every_matmul_region_reads_its_weight_in_panels_and_the_logits_follow_rows(built):
    panelled, rows, specs = built
    matmuls = [s for s in specs if s.get("op") == "matmul"]
    assert matmuls and all(s.get("weight_panels") == dnnl.PANEL_WIDTH for s in matmuls)
    assert "in 16-column panels" in panelled.report()
    prompt = [3, 17, 250, 9, 0, 255, 42, 7, 1, 2, 3]  # one full chunk of 8 and a padded one
    assert panelled.generate(prompt, max_new_tokens=12) == rows.generate(prompt, max_new_tokens=12)
    for graph_a, graph_b in zip(panelled.graphs, rows.graphs):
        inputs = graph_io.sample_inputs(panelled.config, CAPACITY, graph_a.size)
        outputs = []
        for graph in (graph_a, graph_b):
            for name, value in inputs.items():
                graph.runtime.set_input(name, value)
            graph.runtime.run()
            outputs.append(graph.runtime.get_output(0).numpy())
        np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-4 * np.abs(outputs[1]).max())


def _decode_logits(lm, token: int) -> np.ndarray:
    decode = next(g for g in lm.graphs if g.size == 1)
    inputs = graph_io.sample_inputs(lm.config, CAPACITY, 1)
    inputs["tokens"][:] = token
    for name, value in inputs.items():
        decode.runtime.set_input(name, value)
    decode.runtime.run()
    return decode.runtime.get_output(0).numpy()


@pytest.mark.parametrize("token", [256, 2**31 - 1, -257, -(2**31)])
def test_an_id_outside_a_token_table_in_panels_is_refused_by_the_graph(built, token):
    """The tied table is gathered by panel (id // 16), then by column: an id outside the vocabulary
    gives a panel outside the table, which the gather's index check refuses, never reading it."""
    panelled, _rows, _specs = built
    with pytest.raises(IndexError, match="is outside"):
        _decode_logits(panelled, token)
    assert np.isfinite(_decode_logits(panelled, 255)).all()  # and the graph runs on afterwards


@pytest.mark.parametrize("token", [-1, -17, -256])
def test_a_negative_id_counts_from_the_end_as_in_the_rows_layout(built, token):
    """A graph's gathers take negative indices from the end (ONNX Gather's rule; generate() refuses
    them before any graph runs): panels give the same row as the table in rows."""
    panelled, rows, _specs = built
    expected = _decode_logits(rows, 256 + token)
    np.testing.assert_allclose(_decode_logits(panelled, token), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    np.testing.assert_allclose(_decode_logits(rows, token), expected, rtol=0, atol=0)
