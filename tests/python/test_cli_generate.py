"""``tvm-hetero generate`` on a tiny checkpoint (compiled by the command) and on its export (the C++
loop): the same greedy tokens as transformers, text through the tokenizer, prefill and decode speeds;
bad arguments end in one line naming the problem."""

from __future__ import annotations

import re

import pytest
import torch
import transformers as hf
from tokenizers import Tokenizer, models, pre_tokenizers
from tvm_hetero import llm
from tvm_hetero.cli import main

VOCAB = 96
PROMPT = [3, 17, 42, 8, 60]
NEW_TOKENS = 8


def tiny_llama() -> hf.LlamaForCausalLM:
    torch.manual_seed(0)
    config = hf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, intermediate_size=64, initializer_range=0.5,
                            bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return hf.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint directory with a word-level tokenizer (token i is the word "w<i>"), and the
    transformers greedy tokens after PROMPT."""
    path = tmp_path_factory.mktemp("checkpoint")
    model = tiny_llama()
    model.save_pretrained(path)
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))
    with torch.no_grad():
        expected = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return path, expected[0, len(PROMPT):].tolist()


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    return llm.build(str(checkpoint[0]), capacity=32, prefill_chunks=(8,)).export(tmp_path_factory.mktemp("export"))


def run_generate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def new_tokens(out: str) -> list[int]:
    line = next(line for line in out.splitlines() if line.startswith("new tokens:"))
    return [int(t) for t in line.split(":")[1].split()]


def check_speeds(out: str) -> None:
    match = re.search(r"prefill: (\d+) tokens, ([\d.]+) tokens/s; decode: (\d+) tokens, ([\d.]+) tokens/s", out)
    assert match, out
    assert int(match[1]) == len(PROMPT) and int(match[3]) == NEW_TOKENS - 1
    assert float(match[2]) > 0 and float(match[4]) > 0


def test_generate_compiles_a_checkpoint_with_progress_and_prints_tokens_text_and_speeds(checkpoint, capsys):
    path, expected = checkpoint
    text = " ".join(f"w{i}" for i in PROMPT)
    code, out, err = run_generate(capsys, path, "--prompt", text, "--max-new-tokens", NEW_TOKENS,
                                  "--capacity", 32, "--prefill-chunks", 8)
    assert code == 0, err
    assert "compiling" in out and re.search(r"\[\s*[\d.]+s\]", out), "the progress display shows the build"
    assert new_tokens(out) == expected
    assert f"text: {' '.join(f'w{i}' for i in expected)!r}" in out
    check_speeds(out)


def test_generate_runs_an_export_on_the_cpp_loop(checkpoint, exported, capsys):
    _, expected = checkpoint
    code, out, err = run_generate(capsys, exported, "--prompt-ids", ",".join(map(str, PROMPT)),
                                  "--max-new-tokens", NEW_TOKENS, "--threads", 1)
    assert code == 0, err
    assert "C++ generation loop" in out
    assert new_tokens(out) == expected
    assert "text: " in out  # the export carries tokenizer.json
    check_speeds(out)


@pytest.mark.parametrize(("args", "message"), [
    (["{missing}", "--prompt-ids", "1", "--max-new-tokens", "2"], "no such directory"),
    (["{export}", "--prompt-ids", "1,x", "--max-new-tokens", "2"], "--prompt-ids: 'x' is not an integer"),
    (["{export}", "--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["{export}", "--prompt-ids", "1", "--max-new-tokens", "2", "--threads", "0"], "--threads must be at least 1"),
    (["{export}", "--prompt-ids", "1", "--max-new-tokens", "2", "--capacity", "64"], "fixed at export"),
    (["{export}", "--prompt-ids", "5,96", "--max-new-tokens", "2"],
     r"token id 96 at position 1 is outside the vocabulary \[0, 96\)"),
    (["{export}", "--prompt-ids", ",".join(["1"] * 30), "--max-new-tokens", "5"],
     "a prompt of 30 tokens and 5 new tokens need 34 cache rows; the cache capacity is 32"),
    (["{bare}", "--prompt", "w1 w2", "--max-new-tokens", "2"], "--prompt needs .*tokenizer.json"),
])
def test_bad_arguments_end_in_one_line_naming_the_problem(exported, tmp_path, capsys, args, message):
    places = {"missing": tmp_path / "nowhere", "export": exported, "bare": tmp_path}
    code, _, err = run_generate(capsys, *(a.format(**places) for a in args))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tvm-hetero generate: error: ")
    assert re.search(message, lines[0]), lines[0]
