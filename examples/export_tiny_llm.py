"""Export a tiny random Llama (2 layers, hidden 64, capacity 64, prefill chunks 8 and 32) for the C++
generation tests and examples/generate.cc, and save the Python loop's greedy tokens next to it.

TVM kernels only (no oneDNN): oneDNN's primitive execute allocates on every call, which would hide
what the allocation test checks, the generation loop's own allocations.

    python examples/export_tiny_llm.py OUT_DIR

OUT_DIR/expected_tokens.txt holds one line: the prompt ids, a tab, the 16 greedy new token ids.
"""

import sys

import torch
import transformers as hf
from tvm_hetero import llm

PROMPT = [3, 17, 42, 5, 99, 7, 1, 64, 12, 33, 8]
NEW_TOKENS = 16


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    config = hf.LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=128, initializer_range=0.5,
                            bos_token_id=None, eos_token_id=None, pad_token_id=None)
    lm = llm.build(hf.LlamaForCausalLM(config).eval(), capacity=64, prefill_chunks=(8, 32),
                   backends=[])
    lm.export(out_dir)
    tokens = lm.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    with open(f"{out_dir}/expected_tokens.txt", "w") as f:
        f.write(",".join(map(str, PROMPT)) + "\t" + ",".join(map(str, tokens)) + "\n")
    print(f"exported to {out_dir}; greedy tokens {tokens}")


if __name__ == "__main__":
    main(sys.argv[1])
