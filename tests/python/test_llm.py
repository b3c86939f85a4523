"""tvm_hetero.llm against transformers: greedy tokens identical, logits close, whatever chunks
processed the prompt; the weights held once; the KV cache written only at its new rows; streams,
sampling, stop tokens, concurrent sessions, export and load."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
import transformers as hf
from tvm_hetero import llm
from tvm_hetero.artifact import graph_inputs
from tvm_hetero.llm import graph_io
from tvm_hetero.testing.threads import run_at_once

CAPACITY = 512
NEW_TOKENS = 64
PROMPT_LENGTHS = (1, 7, 64, 200)


def tiny_config(arch: str) -> hf.PretrainedConfig:
    """2 layers, hidden 64, large weights (initializer_range 0.5) so greedy choices are no near-ties;
    no end-of-sequence id, so every comparison runs its full length."""
    common = {"initializer_range": 0.5, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if arch == "llama":
        return hf.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, intermediate_size=128, **common)
    if arch == "qwen2":
        return hf.Qwen2Config(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, intermediate_size=96, tie_word_embeddings=True,
                              rope_theta=1e6, **common)
    return hf.GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=CAPACITY, **common)


def tiny_model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cls = {"llama": hf.LlamaForCausalLM, "qwen2": hf.Qwen2ForCausalLM, "gpt2": hf.GPT2LMHeadModel}[arch]
    return cls(tiny_config(arch)).eval()


def prompt_of(length: int, vocab: int, seed: int = 1) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed + length).integers(0, vocab, length)]


def reference_tokens(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2"])
def built(request, tmp_path_factory):
    """(transformers model, LanguageModel): Llama and GPT-2 built from a saved directory, Qwen2 from
    the module itself."""
    arch = request.param
    model = tiny_model(arch)
    if arch == "qwen2":
        return model, llm.build(model, capacity=CAPACITY)
    path = tmp_path_factory.mktemp(arch)
    model.save_pretrained(path)
    return model, llm.build(str(path), capacity=CAPACITY)


@pytest.fixture(scope="module")
def llama_model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def llama(llama_model):
    return llm.build(llama_model, capacity=CAPACITY)


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_greedy_tokens_match_transformers(built, length):
    model, lm = built
    prompt = prompt_of(length, lm.config.vocab_size)
    assert lm.generate(prompt, max_new_tokens=NEW_TOKENS) == reference_tokens(model, prompt, NEW_TOKENS)


def test_logits_close_to_transformers_after_prefill_and_each_decode_step(built):
    model, lm = built
    prompt = prompt_of(40, lm.config.vocab_size)
    session = lm.session()
    ours = [session.prefill(np.asarray(prompt, np.int32)).copy()]
    tokens = list(prompt)
    for _ in range(8):
        tokens.append(int(np.argmax(ours[-1])))
        ours.append(session.decode(tokens[-1]).copy())
    with torch.no_grad():
        ref = model(torch.tensor([tokens])).logits[0].numpy()
    expected = ref[len(prompt) - 1:]
    error = np.max(np.abs(np.stack(ours) - expected))
    scale = np.max(np.abs(expected))
    assert error <= 1e-4 * scale, f"max |logit error| {error} against max |logit| {scale}"


@pytest.mark.parametrize("chunks", [(4,), (64, 256)])
def test_same_tokens_whichever_chunks_process_the_prompt(llama, llama_model, chunks):
    other = llm.build(llama_model, capacity=CAPACITY, prefill_chunks=chunks)
    for length in (7, 200):
        prompt = prompt_of(length, 256)
        assert other.generate(prompt, max_new_tokens=16) == llama.generate(prompt, max_new_tokens=16)


def test_every_prompt_length_up_to_the_capacity_works(llama, llama_model):
    prompt = prompt_of(CAPACITY, 256)  # fills the cache exactly: one new token, no decode step
    assert llama.generate(prompt, max_new_tokens=1) == reference_tokens(llama_model, prompt, 1)
    prompt = prompt_of(CAPACITY - 3, 256)
    assert llama.generate(prompt, max_new_tokens=4) == reference_tokens(llama_model, prompt, 4)


def test_the_graphs_share_one_copy_of_the_weights(llama):
    data = {name for name, _, _ in graph_io.data_inputs(llama.config, CAPACITY, 1)}
    names = [n for n in graph_inputs(json.loads(llama.graphs[0].graph_json), "graph") if n not in data]
    assert "model.layers.1.mlp.down_proj.weight" in names
    for name in names:
        pointers = {np.from_dlpack(g.runtime.get_input(name)).ctypes.data for g in llama.graphs}
        assert len(pointers) == 1, f"{name} is held {len(pointers)} times"
    assert len(llama.graphs) == 4  # decode and the three prefill chunk sizes


def test_no_graph_keeps_a_reordered_copy_of_the_weights(llama):
    """Decode's one-row matmuls read the stored weights (one_row_matmul.h) and prefill's matmuls read
    them as stored too: running both reorders no weight, so the weights are held once."""
    import tvm

    reorders = tvm.get_global_func("tvm_hetero.dnnl.weight_reorders")
    session = llama.session()
    before = reorders()
    session.prefill(prompt_of(100, 256))  # the 64 and 16 (padded) chunk graphs
    session.decode(3)
    assert reorders() == before


def test_a_decode_step_writes_only_the_new_rows_and_padding_is_never_written(llama):
    cfg = llama.config
    session = llama.session()
    session.prefill(np.asarray(prompt_of(7, 256), np.int32))  # one 16-row chunk, 9 rows of padding
    assert session.calls[16] == 1 and session.cache.filled == 7
    keys, values = (np.from_dlpack(t) for t in session.cache.tensors[0])
    assert np.all(keys[..., 7:] == 0) and np.all(values[:, :, 7:, :] == 0)
    assert np.any(keys[..., :7] != 0)
    before = session.cache.bytes_written
    session.decode(5)
    row_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    assert session.cache.bytes_written - before == row_bytes
    assert session.cache.filled == 8 and np.all(keys[..., 8:] == 0)


def test_stream_yields_the_tokens_of_generate(llama):
    prompt = prompt_of(20, 256)
    assert list(llama.stream(prompt, max_new_tokens=10)) == llama.generate(prompt, max_new_tokens=10)


def test_generation_ends_after_a_stop_token(llama):
    prompt = prompt_of(7, 256)
    full = llama.generate(prompt, max_new_tokens=20)
    stop = full[5]
    cut = llama.generate(prompt, max_new_tokens=20, stop_tokens=[stop])
    assert cut == full[: full.index(stop) + 1]


def test_sampling_is_reproducible_by_seed_and_top_k_1_is_greedy(llama):
    prompt = prompt_of(7, 256)
    first = llama.generate(prompt, max_new_tokens=20, temperature=1.0, top_p=0.9, seed=3)
    assert llama.generate(prompt, max_new_tokens=20, temperature=1.0, top_p=0.9, seed=3) == first
    assert llama.generate(prompt, max_new_tokens=20, temperature=1.0, seed=4) != first
    greedy = llama.generate(prompt, max_new_tokens=20)
    assert llama.generate(prompt, max_new_tokens=20, temperature=0.7, top_k=1, seed=5) == greedy


def test_two_generations_on_two_threads_match_serial(llama):
    prompts = [prompt_of(30, 256, seed=7), prompt_of(90, 256, seed=8)]
    serial = [llama.generate(p, max_new_tokens=40) for p in prompts]
    results: list = [None, None]
    sessions = [llama.session(), llama.session()]  # one each, weights shared
    barrier = threading.Barrier(2)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(3):
            session = sessions[i]
            logits = session.prefill(np.asarray(prompts[i], np.int32))
            tokens = []
            for _ in range(40):
                tokens.append(int(np.argmax(logits)))
                logits = session.decode(tokens[-1])
            results[i] = tokens

    run_at_once(worker, [(0,), (1,)])
    assert results == serial


def test_export_and_load_give_the_same_tokens(llama, tmp_path):
    out = llama.export(tmp_path / "lm")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "tvm-hetero-llm/1" and [g["size"] for g in manifest["graphs"]] == [1, 16, 64, 256]
    assert sorted(p.name for p in out.glob("params*")) == ["params.bin"]
    loaded = llm.load(out)
    prompt = prompt_of(70, 256)
    assert loaded.generate(prompt, max_new_tokens=12) == llama.generate(prompt, max_new_tokens=12)
    assert "capacity 512" in loaded.report()


def test_a_damaged_export_is_refused_naming_the_file(llama, tmp_path):
    out = llama.export(tmp_path / "lm")
    data = bytearray((out / "params.bin").read_bytes())
    data[len(data) // 2] ^= 1
    (out / "params.bin").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="params.bin: checksum mismatch"):
        llm.load(out)


def test_report_states_chunks_phases_and_bytes(llama):
    text = llama.report()
    cfg = llama.config
    kv_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * CAPACITY * 4
    assert "prefill chunks [16, 64, 256]" in text and "decode 1" in text
    assert f"KV cache: {kv_bytes // 1024}.00 KiB per generation session" in text
    assert "weights:" in text and text.count("on cpu:0") == 4 and "dnnl" in text


def test_text_in_text_out_with_the_checkpoint_tokenizer(llama_model, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(256)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    llama_model.save_pretrained(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    lm = llm.build(str(tmp_path), capacity=64, prefill_chunks=(8,))
    text = lm.generate_text("w3 w17 w42", max_new_tokens=6)
    ids = lm.generate([3, 17, 42], max_new_tokens=6)
    assert text == " ".join(f"w{i}" for i in ids)


def test_prefill_and_decode_on_different_devices_give_the_same_tokens(llama, llama_model):
    import tvm

    split = llm.build(llama_model, capacity=CAPACITY, prefill_chunks=(16,),
                      targets={"prefill": [(tvm.cpu(0), "llvm")], "decode": [(tvm.cpu(1), "llvm")]})
    text = split.report()
    assert "decode     1 rows  on cpu:1" in text and "prefill   16 rows  on cpu:0" in text
    assert "(cpu:1, cpu:0)" in text  # a copy of the weights on each device
    prompt = prompt_of(40, 256)
    assert split.generate(prompt, max_new_tokens=20) == llama.generate(prompt, max_new_tokens=20)


def test_one_pinned_thread_per_phase_gives_the_same_tokens(llama, llama_model, tmp_path):
    pinned = llm.build(llama_model, capacity=CAPACITY, prefill_chunks=(16,),
                       device_options=[{"cores": [0], "num_threads": 1}])
    prompt = prompt_of(40, 256)
    expected = llama.generate(prompt, max_new_tokens=20)
    assert pinned.generate(prompt, max_new_tokens=20) == expected
    loaded = llm.load(pinned.export(tmp_path / "lm"), device_options={"prefill": None, "decode": [{"num_threads": 1}]})
    assert loaded.generate(prompt, max_new_tokens=20) == expected
