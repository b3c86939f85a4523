"""A Hugging Face Llama directory as a GGUF file for llama.cpp: F32, or Q8_0 for the 8-bit line.

    python bench/llm/gguf_export.py DIR OUT.gguf [--q8]

llama.cpp's own converter is not on PyPI; this writes the same keys and tensor names with the
``gguf`` package (Llama architecture, a GPT-2-style byte-level BPE vocabulary). Two layout points:
llama.cpp applies RoPE to adjacent pairs while Hugging Face rotates the two halves of each head,
so the q/k rows are reordered (``rope_rows``); and with tied embeddings no ``output`` tensor is
written, llama.cpp then reads the logits through ``token_embd``. Q8_0 uses gguf's reference
quantizer (blocks of 32, one fp16 scale each) on every matrix, as llama.cpp's Q8_0 file type does;
norms stay F32. ``bench/llm/check_peers.py`` checks the result against ``transformers``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q/k projection from rotate-half order (per head: all first halves, then all second
    halves) to interleaved pairs, the order llama.cpp's RoPE reads."""
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_dim // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(src: Path, config: dict) -> dict[str, np.ndarray]:
    """GGUF tensor name -> fp32 array (Hugging Face's [out, in] shape; gguf reverses it to ggml's)."""
    from safetensors.numpy import load_file

    hf = {}
    for shard in sorted(src.glob("*.safetensors")):
        hf.update(load_file(shard))
    out = {"token_embd.weight": hf["model.embed_tokens.weight"], "output_norm.weight": hf["model.norm.weight"]}
    if not config.get("tie_word_embeddings", False):
        out["output.weight"] = hf["lm_head.weight"]
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(config["num_hidden_layers"]):
        for hf_name, name in names.items():
            w = hf[f"model.layers.{i}.{hf_name}.weight"]
            if name == "attn_q":
                w = rope_rows(w, config["num_attention_heads"])
            elif name == "attn_k":
                w = rope_rows(w, config["num_key_value_heads"])
            out[f"blk.{i}.{name}.weight"] = w
    return {name: np.ascontiguousarray(w, dtype=np.float32) for name, w in out.items()}


def add_tokenizer(writer, src: Path, config: dict) -> None:
    """The byte-level BPE of ``src/tokenizer.json`` as gguf's 'gpt2' tokenizer model."""
    import gguf

    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab.update(special)
    tokens = [None] * config["vocab_size"]
    for text, i in vocab.items():
        tokens[i] = text
    if any(t is None for t in tokens):
        raise ValueError(f"{src}/tokenizer.json does not fill the {config['vocab_size']}-token vocabulary")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # the GPT-2 split regex, as tokenizers' ByteLevel(use_regex=True)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(False)


def export(src: Path, dst: Path, q8: bool = False) -> Path:
    """Write ``dst`` from the Hugging Face directory ``src``; returns ``dst``."""
    import gguf

    config = json.loads((src / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer = gguf.GGUFWriter(dst, "llama")
    writer.add_name(src.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, src, config)
    for name, w in hf_tensors(src, config).items():
        if q8 and w.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, w)
    if q8:
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--q8", action="store_true", help="Q8_0 matrices instead of F32")
    args = parser.parse_args()
    print(export(args.src, args.dst, args.q8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
