"""The C++ generation loop (src/llm/, wrapped by tvm_hetero.llm.native) on exported tiny Llama, Qwen2
and GPT-2 models: greedy tokens equal the Python loop's and transformers'; the chunk plan equals
buckets.py's; streaming, seeds and stop tokens; bad input and damaged files refused naming them; a CPU
lacking the export's recorded features refused as the Python loader refuses it."""

from __future__ import annotations

import platform
import re
import shutil

import pytest
import tvm
import tvm_ffi
from test_llm import prompt_of, reference_tokens, tiny_model
from tvm_hetero import llm
from tvm_hetero.llm.buckets import plan_chunks
from tvm_hetero.llm.native import NativeGenerator
from tvm_hetero.llm.native import plan_chunks as native_plan_chunks
from tvm_hetero.testing.threads import run_at_once

CAPACITY = 128
NEW_TOKENS = 32


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2"])
def exported(request, tmp_path_factory):
    """(transformers model, Python LanguageModel, NativeGenerator on its export, export directory)."""
    model = tiny_model(request.param)
    lm = llm.build(model, capacity=CAPACITY, prefill_chunks=(16, 64))
    out = lm.export(tmp_path_factory.mktemp(f"{request.param}_export"))
    return model, lm, NativeGenerator(out), out


@pytest.fixture(scope="module")
def llama_export(tmp_path_factory):
    model = tiny_model("llama")
    lm = llm.build(model, capacity=32, prefill_chunks=(8,))
    out = lm.export(tmp_path_factory.mktemp("llama_small"))
    return lm, NativeGenerator(out), out


@pytest.mark.parametrize("length", [1, 7, 64])
def test_native_greedy_tokens_equal_the_python_loops_and_transformers(exported, length):
    model, lm, native, _ = exported
    prompt = prompt_of(length, lm.config.vocab_size)
    tokens = native.generate(prompt, NEW_TOKENS)
    assert tokens == lm.generate(prompt, NEW_TOKENS)
    assert tokens == reference_tokens(model, prompt, NEW_TOKENS)
    assert native.last_times.prompt_tokens == length
    assert native.last_times.decode_steps == NEW_TOKENS - 1


@pytest.mark.parametrize("sizes", [(1, 16, 64, 256), (1, 8), (1,), (1, 3, 5, 32)])
def test_the_cpp_chunk_plan_equals_buckets_plan(sizes):
    for length in range(1, 301):
        assert native_plan_chunks(length, sizes) == plan_chunks(length, sizes), length


def test_stream_yields_the_tokens_of_generate_and_stops_after_a_stop_token(llama_export):
    _, native, _ = llama_export
    prompt = [5, 9, 2, 77]
    tokens = native.generate(prompt, 10)
    assert list(native.stream(prompt, 10)) == tokens
    assert native.generate(prompt, 10, stop_tokens=[tokens[3]]) == tokens[:tokens.index(tokens[3]) + 1]


def test_sampling_is_reproducible_by_seed_and_top_k_1_is_greedy(llama_export):
    _, native, _ = llama_export
    prompt = [5, 9, 2, 77]
    sampled = native.generate(prompt, 12, temperature=1.5, top_p=0.95, seed=3)
    assert native.generate(prompt, 12, temperature=1.5, top_p=0.95, seed=3) == sampled
    assert native.generate(prompt, 12, temperature=1.5, top_k=1, seed=4) == native.generate(prompt, 12)
    draws = {tuple(native.generate(prompt, 12, temperature=5.0, seed=seed)) for seed in range(4)}
    assert len(draws) > 1, "different seeds should draw different tokens at temperature 5"


def test_two_generations_on_two_threads_match_serial(llama_export):
    _, native, _ = llama_export
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [50, 40, 30]]
    serial = [native.generate(p, 16) for p in prompts]
    results = [None, None]

    def run(i):
        results[i] = native.generate(prompts[i], 16)

    run_at_once(run, [(0,), (1,)])
    assert results == serial


@pytest.mark.parametrize(("prompt", "max_new", "message"), [
    ([5, 100000, 7], 4, r"token id 100000 at position 1 is outside the vocabulary \[0, 256\)"),
    ([-1], 4, r"token id -1 at position 0 is outside the vocabulary"),
    ([], 4, "the prompt is empty"),
    ([1] * 33, 1, "a prompt of 33 tokens exceeds the cache capacity of 32 tokens"),
    ([1] * 30, 5, "a prompt of 30 tokens and 5 new tokens need 34 cache rows; the cache capacity is 32"),
    ([1], 0, "max_new_tokens must be a positive integer"),
])
def test_bad_input_is_refused_naming_it(llama_export, prompt, max_new, message):
    _, native, _ = llama_export
    with pytest.raises(ValueError, match=message):
        native.generate(prompt, max_new)
    assert native.generate([1, 2], 3) == llama_export[0].generate([1, 2], 3)  # still usable


def test_text_and_non_integer_ids_are_refused(llama_export):
    _, native, _ = llama_export
    with pytest.raises(TypeError, match="expected token ids"):
        native.generate("hello", 4)
    with pytest.raises(TypeError, match=r"got 1.5 at position 1"):
        native.generate([1, 1.5], 4)
    with pytest.raises(ValueError, match="temperature"):
        native.generate([1], 4, temperature=-1.0)


@pytest.mark.parametrize(("damage", "message"), [
    ("flip params.bin", r"params\.bin: checksum mismatch"),
    ("remove lib_1.so", r"lib_1\.so: missing"),
    ("edit manifest.json", r"manifest\.json: checksum mismatch"),
    ("remove manifest.json", r"not an exported language model \(no manifest\.json\)"),
])
def test_a_missing_or_damaged_file_is_refused_naming_it(llama_export, tmp_path, damage, message):
    copy = tmp_path / "copy"
    shutil.copytree(llama_export[2], copy)
    action, name = damage.split()
    path = copy / name
    if action == "remove":
        path.unlink()
    elif action == "flip":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.write_text(path.read_text().replace('"capacity": 32', '"capacity": 64'))
    with pytest.raises(ValueError, match=message):
        NativeGenerator(copy)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_thread_count_gives_the_same_tokens(llama_export, threads):
    lm, native, out = llama_export
    prompt = [5, 9, 2, 77, 3, 1, 60, 61, 62, 8]  # two chunks of 8: prefill and decode graphs both run
    assert NativeGenerator(out, num_threads=threads).generate(prompt, 12) == native.generate(prompt, 12)


@pytest.mark.parametrize("threads", [0, -1, 1.5])
def test_a_bad_thread_count_is_refused(llama_export, threads):
    with pytest.raises(ValueError, match="num_threads must be a positive integer"):
        NativeGenerator(llama_export[2], num_threads=threads)


# Extensions whose instructions compiled kernels may use (LLVM's names): a loader must never ignore them.
INSTRUCTION_EXTENSIONS = {
    "sse3", "ssse3", "sse4.1", "sse4.2", "sse4a", "crc32", "popcnt", "lzcnt", "bmi", "bmi2", "adx", "movbe",
    "cx16", "sahf", "prfchw", "aes", "pclmul", "sha", "gfni", "vaes", "vpclmulqdq", "avx", "avx2", "fma",
    "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi",
    "avx512vbmi2", "avx512vnni", "avx512bitalg", "avx512vpopcntdq", "avx512bf16", "avx512fp16", "avxvnni",
}


def _lacking(error: pytest.ExceptionInfo) -> set[str]:
    return set(re.search(r" lacks (.*?); build it again", str(error.value)).group(1).split(", "))


def _with_a_broken_library(out, copy):
    """A copy of the export whose first graph's library is not a library, its checksums made to match:
    a loader reaching that library fails there."""
    import json

    from tvm_hetero.artifact import MANIFEST_DIGEST_KEY, manifest_digest, sha256

    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    lib = manifest["graphs"][0]["lib"]
    (copy / lib).write_bytes(b"not a library")
    manifest["files"][lib] = sha256(b"not a library")
    manifest[MANIFEST_DIGEST_KEY] = manifest_digest(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy, lib


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="states an x86-64 baseline CPU")
def test_the_cpp_loader_refuses_a_cpu_lacking_the_records_features_as_the_python_loader_does(
        llama_export, tmp_path, monkeypatch):
    """The same record, checked by both loaders against a baseline x86-64 CPU (stated to C++, pretended
    to Python): both refuse before loading any library (one here is broken) and name the same
    instruction extensions; the names Python alone counts are LLVM's tuning and system names, whose
    absence faults nothing."""
    from tvm.target import codegen

    from tvm_hetero.llm import this_cpu

    lm, native, out = llama_export  # NativeGenerator loaded it: both loaders accept this CPU
    if lm.compiled_for is None:
        pytest.skip("the export targets the architecture's baseline: nothing to check")
    load = tvm_ffi.get_global_func("tvm_hetero.llm.load")
    assert tuple(load(str(out), 0, lm.compiled_for["features"])["chunk_sizes"]()) == native.chunk_sizes
    broken, lib = _with_a_broken_library(out, tmp_path / "broken")
    with pytest.raises(Exception, match=re.escape(lib)):
        load(str(broken), 0, None)  # this CPU passes the check, so the broken library is reached
    baseline = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64"})
    with pytest.raises(RuntimeError, match="and the stated CPU lacks") as cpp:
        load(str(broken), 0, sorted(codegen.llvm_get_cpu_features(baseline)))
    monkeypatch.setattr(this_cpu, "this_cpu", lambda: baseline)
    with pytest.raises(RuntimeError) as python:
        llm.load(broken)
    for error in (cpp, python):
        assert f"{broken}: its kernels were compiled for CPU '{lm.compiled_for['cpu']}'" in str(error.value)
    in_cpp, in_python = _lacking(cpp), _lacking(python)
    assert in_cpp <= in_python
    assert in_cpp & INSTRUCTION_EXTENSIONS == in_python & INSTRUCTION_EXTENSIONS != set()
