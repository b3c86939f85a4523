"""tvm_hetero.llm refuses bad input with an error naming it, before any kernel runs: token ids,
prompt lengths against the capacity, generation options, architectures, checkpoints, targets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import tvm
import transformers as hf
from safetensors.torch import save_file
from tvm_hetero import llm
from tvm_hetero.llm.buckets import plan_chunks

CAPACITY = 32


def tiny_llama() -> hf.LlamaForCausalLM:
    torch.manual_seed(0)
    config = hf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, intermediate_size=64, initializer_range=0.5)
    return hf.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def lm():
    return llm.build(tiny_llama(), capacity=CAPACITY, prefill_chunks=(8,))


@pytest.fixture
def checkpoint(tmp_path):
    """A saved checkpoint directory and its state dict (to save again altered)."""
    model = tiny_llama()
    model.save_pretrained(tmp_path)
    return tmp_path, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("prompt", "message"), [
    ([5, 100, 7], r"token id 100 at position 1 is outside the vocabulary \[0, 100\)"),
    ([-1], r"token id -1 at position 0 is outside the vocabulary"),
    ([], "the prompt is empty"),
    ([[1, 2]], "expected a flat sequence"),
])
def test_bad_token_ids_are_refused_before_any_kernel_runs(lm, prompt, message):
    with pytest.raises(ValueError, match=message):
        lm.generate(prompt, max_new_tokens=2)


def test_non_integer_ids_and_text_are_refused(lm):
    with pytest.raises(TypeError, match="token ids must be integers"):
        lm.generate([1.5, 2.0])
    with pytest.raises(TypeError, match="use generate_text"):
        lm.generate("hello")


def test_a_prompt_beyond_the_capacity_names_both_lengths(lm):
    with pytest.raises(ValueError, match=f"a prompt of 33 tokens exceeds the cache capacity of {CAPACITY} tokens"):
        lm.generate(list(range(33)), max_new_tokens=1)
    with pytest.raises(ValueError, match=f"need 34 cache rows; the cache capacity is {CAPACITY} tokens"):
        lm.generate(list(range(30)), max_new_tokens=5)
    assert len(lm.generate(list(range(30)), max_new_tokens=3, stop_tokens=())) == 3  # exactly full is fine


def test_stream_checks_its_arguments_when_called_not_when_iterated(lm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lm.stream([1000])
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        lm.stream([1], max_new_tokens=0)


@pytest.mark.parametrize(("options", "message"), [
    ({"temperature": -1.0}, "temperature must be"),
    ({"temperature": 1.0, "top_k": 0}, "top_k must be a positive integer"),
    ({"temperature": 1.0, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": 5}, "give a temperature > 0"),
])
def test_bad_sampling_options_are_refused(lm, options, message):
    with pytest.raises(ValueError, match=message):
        lm.generate([1, 2], max_new_tokens=2, **options)


def test_text_without_a_tokenizer_says_so(lm):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        lm.generate_text("hello")


def test_an_unknown_architecture_is_named_with_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    with pytest.raises(ValueError, match=r"model_type 'mamba' \(MambaForCausalLM\); supported: gpt2, llama, qwen2"):
        llm.build(str(tmp_path))


def test_an_unsupported_rope_type_is_refused():
    config = tiny_llama().config.to_dict()
    config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="RoPE type 'llama3' is not supported"):
        llm.config.decoder_config(config)


def test_a_missing_tensor_is_named(checkpoint):
    path, state = checkpoint
    del state["model.layers.0.mlp.up_proj.weight"]
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.mlp.up_proj.weight' is missing \(expected shape "
                                         r"\[64, 32\]\)"):
        llm.build(str(path), capacity=CAPACITY, prefill_chunks=(8,))


def test_a_mis_shaped_tensor_is_named_with_both_shapes(checkpoint):
    path, state = checkpoint
    state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 32)
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.self_attn.k_proj.weight' has shape \[32, 32\], "
                                         r"expected \[16, 32\]"):
        llm.build(str(path), capacity=CAPACITY, prefill_chunks=(8,))


def test_a_directory_without_config_or_weights_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        llm.build(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama().config.to_dict()))
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors file"):
        llm.build(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="model.safetensors: not a safetensors file"):
        llm.build(str(tmp_path))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prefill_chunks": (64,)}, "a chunk of 64 rows exceeds the cache capacity of 32 tokens"),
    ({"prefill_chunks": ()}, "at least one chunk size"),
    ({"capacity": 0}, "capacity must be a positive integer"),
    ({"targets": {"prefill": []}}, r"missing \['decode'\]"),
])
def test_bad_build_options_are_refused(kwargs, message):
    options = {"capacity": CAPACITY, **kwargs}
    with pytest.raises(ValueError, match=message):
        llm.build(tiny_llama(), **options)


def test_gpt2_capacity_beyond_its_learned_positions_is_refused():
    model = hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=16))
    with pytest.raises(ValueError, match="capacity of 32 tokens exceeds the model's 16 learned positions"):
        llm.build(model, capacity=32, prefill_chunks=(8,))


@pytest.mark.parametrize("length", [1, 2, 7, 8, 9, 31, 100, 333])
def test_chunk_plans_cover_the_prompt_with_only_the_last_chunk_padded(length):
    sizes = (1, 4, 16, 64)
    plan = plan_chunks(length, sizes)
    assert sum(rows for _, rows in plan) == length
    assert all(rows == size for size, rows in plan[:-1]) and 1 <= plan[-1][1] <= plan[-1][0]
    # the least cost among all plans (brute force over first chunks, small lengths)
    cost = sum(size + 8 for size, _ in plan)

    def best(n: int) -> int:
        return 0 if n == 0 else min(s + 8 + (best(n - s) if s < n else 0) for s in sizes)

    if length <= 40:
        assert cost == best(length)


def test_sessions_never_allocate_per_token(lm):
    """After set-up a decode step reuses the bound tensors: the logits view stays the same memory."""
    session = lm.session()
    first = session.prefill(np.array([1, 2, 3], np.int32))
    address = first.ctypes.data
    for token in range(5):
        assert session.decode(token).ctypes.data == address
    assert session.cache.filled == 8


def test_a_session_checks_its_own_input(lm):
    session = lm.session()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        session.prefill([3, 100])
    session.prefill(list(range(CAPACITY - 1)))
    with pytest.raises(ValueError, match=r"decode: token id -2 is outside the vocabulary \[0, 100\)"):
        session.decode(-2)
    session.decode(4)  # the last free row
    with pytest.raises(ValueError, match=f"the cache is full \\({CAPACITY} tokens"):
        session.decode(4)


def test_host_kernels_compile_for_this_cpu_and_an_export_refuses_a_cpu_lacking_their_features(lm, tmp_path,
                                                                                                monkeypatch):
    from tvm.target import codegen

    from tvm_hetero.llm import this_cpu

    here = this_cpu.this_cpu()
    assert lm.compiled_for == {"cpu": str(here.attrs["mcpu"]),
                               "features": sorted(codegen.llvm_get_cpu_features(here))}
    assert f"host kernels compiled for: CPU {here.attrs['mcpu']}" in lm.report()
    lm.export(tmp_path / "out")
    assert llm.load(tmp_path / "out").compiled_for == lm.compiled_for  # loads here
    needed = set(lm.compiled_for["features"])
    baseline = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64"})
    missing = needed - codegen.llvm_get_cpu_features(baseline)
    if not missing:
        pytest.skip(f"this CPU ({here.attrs['mcpu']}) has no feature beyond the x86-64 baseline")
    monkeypatch.setattr(this_cpu, "this_cpu", lambda: baseline)  # as if loaded on a baseline CPU
    with pytest.raises(RuntimeError, match=f"compiled for CPU '{here.attrs['mcpu']}'.*lacks .*{sorted(missing)[0]}"):
        llm.load(tmp_path / "out")


def test_a_target_object_keeps_the_architectures_baseline():
    model = llm.build(tiny_llama(), [(tvm.cpu(0), tvm.target.Target("llvm"))], capacity=CAPACITY,
                      prefill_chunks=(8,))
    assert model.compiled_for is None
    assert "compiled for: the architecture's baseline" in model.report()


def test_a_sessions_graphs_hold_their_intermediate_values_in_one_scratch(lm):
    session = lm.session()
    needs = [g.runtime.scratch_bytes() for g in lm.graphs]
    assert session.scratch_bytes == max(needs) > 0
    with_scratch = session.scratch_bytes + sum(r.frame.allocated_bytes for r in session.runners.values())
    own = sum(g.runtime.frame().allocated_bytes for g in lm.graphs)
    assert with_scratch <= own - min(needs)  # the smaller graph's values no longer have memory of their own


@pytest.mark.parametrize("position", [5, 0, CAPACITY - 1, CAPACITY, 10**9, -7])
def test_the_decode_attention_reads_only_the_filled_rows_and_clamps_the_position(lm, position):
    """Rows at and beyond the position hold NaN: a kernel reading any of them would return NaN. A
    position beyond the cache is refused by the gathers' index checks before the attention runs."""
    from tvm_hetero.llm import graph_io

    decode = next(g for g in lm.graphs if g.size == 1)
    inputs = graph_io.sample_inputs(lm.config, CAPACITY, 1)
    filled = min(max(position, 0), CAPACITY)
    inputs["positions"][:] = position
    inputs["cache_mask"][...] = graph_io.MASKED
    inputs["cache_mask"][..., :filled] = 0.0
    for name, value in inputs.items():
        if name.endswith(".k"):
            value[..., filled:] = np.nan  # keys [1, KV, D, C]
        elif name.endswith(".v"):
            value[:, :, filled:] = np.nan  # values [1, KV, C, D]
        decode.runtime.set_input(name, value)
    if position >= CAPACITY:
        with pytest.raises(IndexError, match=f"index {position} at positions\\[0\\] is outside"):
            decode.runtime.run()
        return
    decode.runtime.run()
    assert np.isfinite(decode.runtime.get_output(0).numpy()).all()
