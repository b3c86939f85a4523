"""Local Hugging Face checkpoints for the decoder benchmark, made offline: random weights, real shapes.

    python bench/llm/checkpoints.py [--shape smollm2-135m|tiny ...] [--force]

Each shape is a ``LlamaConfig`` saved with ``save_pretrained`` (safetensors) under
~/.cache/tvm-hetero/llm-bench/<shape>/, beside a byte-level BPE tokenizer trained on generated text
(tokenizer.json + tokenizer_config.json, loadable by ``AutoTokenizer`` and onnxruntime-genai).
No download: the weights are seeded random (speed does not depend on their values), and every peer
loads this same directory, so all compute the same model.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

CACHE = Path.home() / ".cache" / "tvm-hetero" / "llm-bench"

# SmolLM2-135M's published config (tied embeddings, rope_theta 1e5); "tiny" keeps its structure
# (grouped-query attention, tied embeddings) at a size that builds and checks in seconds. Its weights
# are drawn 5x wider than the default 0.02: at 0.02 greedy decoding only repeats the last token, and
# check_peers.py's token comparison would then show nothing.
SHAPES = {
    "smollm2-135m": {
        "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
        "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 2048, "rope_theta": 100000.0,
    },
    "tiny": {
        "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 256, "vocab_size": 2048, "max_position_embeddings": 2048, "rope_theta": 100000.0,
        "initializer_range": 0.1,
    },
}
COMMON = {"tie_word_embeddings": True, "rms_norm_eps": 1e-5, "hidden_act": "silu", "bos_token_id": 0,
          "eos_token_id": 0, "torch_dtype": "float32"}
EOS = "<|endoftext|>"
SEED = 0


def generated_text(n_words: int, seed: int) -> list[str]:
    """Lines of pseudo-words (random syllables, a Zipf-like word choice): enough distinct byte pairs
    for BPE to reach a 49152-entry vocabulary, made in well under a second."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + list("aeiou")
    lexicon = ["".join(rng.choices(syllables, k=rng.randint(1, 5))) for _ in range(60000)]
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    words = rng.choices(lexicon, weights=weights, k=n_words)
    punct = [",", ".", "", "", "", "", "!", "?", " 42", " 7"]
    return [" ".join(w + rng.choice(punct) for w in words[i:i + 16]) for i in range(0, n_words, 16)]


def train_tokenizer(vocab_size: int, seed: int):
    """A GPT-2-style byte-level BPE of exactly ``vocab_size`` entries (id 0 is the end-of-text token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(generated_text(400_000, seed), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"BPE reached {tok.get_vocab_size()} tokens, not {vocab_size}: generate more text")
    return tok


def make(shape: str, force: bool = False) -> Path:
    """The directory of ``shape`` (made once; ``force`` makes it again, dropping the peers' files)."""
    out = CACHE / shape
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists() and not force:
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    shutil.rmtree(out / "peers", ignore_errors=True)  # the peers' files were made from the old weights
    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**SHAPES[shape], **COMMON)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out, safe_serialization=True)

    fast = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(config.vocab_size, SEED),
                                   bos_token=EOS, eos_token=EOS, unk_token=EOS, model_max_length=2048)
    fast.save_pretrained(out)
    (out / "bench_source.json").write_text(json.dumps({"shape": shape, "seed": SEED, **SHAPES[shape]}, indent=1))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--force", action="store_true", help="make them again")
    args = parser.parse_args()
    for shape in args.shape:
        print(shape, make(shape, args.force), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
