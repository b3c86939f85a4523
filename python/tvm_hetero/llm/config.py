"""A decoder's shape, read from a Hugging Face ``config.json`` (or a ``transformers`` config).

:class:`DecoderConfig` is the one description every other file of the package reads: the family's
graph builder, the checkpoint reader (expected tensor shapes) and the session (cache sizes). A
configuration this package cannot run exactly (an unknown architecture, a RoPE scaling type, a
sliding window) is refused here, naming what it is, rather than run approximately.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: model_type -> the family whose graph builder runs it.
FAMILIES = {"llama": "llama", "qwen2": "llama", "gpt2": "gpt2"}


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a decoder-only transformer, normalised across Hugging Face's config classes."""

    #: The Hugging Face model_type ("llama", "qwen2", "gpt2").
    model_type: str
    #: The graph builder that runs it: "llama" (Llama, Qwen2) or "gpt2".
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    #: Bias on the q, k and v projections (Qwen2; Llama's attention_bias).
    qkv_bias: bool = False
    #: Bias on the attention output and the MLP projections (Llama's attention_bias / mlp_bias).
    o_bias: bool = False
    mlp_bias: bool = False
    #: The LM head reuses the token embedding (no separate lm_head.weight).
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    #: Positions the model has embeddings for (GPT-2's n_positions); None: unbounded (RoPE).
    max_positions: int | None = None
    #: Token ids that end a generation by default.
    eos_token_ids: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DecoderConfig:
        """The inverse of :meth:`to_dict` (an exported model's manifest)."""
        values = dict(data)
        values["eos_token_ids"] = tuple(values.get("eos_token_ids", ()))
        return cls(**values)


def decoder_config(hf: Any) -> DecoderConfig:
    """Normalise a Hugging Face config (a ``config.json`` dict or a ``PretrainedConfig``)."""
    d = hf if isinstance(hf, dict) else hf.to_dict()
    model_type = d.get("model_type")
    if model_type not in FAMILIES:
        names = ", ".join(d.get("architectures") or []) or "no architectures field"
        raise ValueError(f"unsupported architecture: model_type {model_type!r} ({names}); "
                         f"supported: {', '.join(sorted(FAMILIES))}")
    eos = d.get("eos_token_id")
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [] if eos is None else [eos]))
    if model_type == "gpt2":
        return _gpt2(d, eos_ids)
    return _llama_like(d, model_type, eos_ids)


def _gpt2(d: dict, eos_ids: tuple[int, ...]) -> DecoderConfig:
    if d.get("activation_function", "gelu_new") != "gelu_new":
        raise ValueError(f"gpt2: activation_function {d['activation_function']!r} is not supported (gelu_new is)")
    if d.get("scale_attn_by_inverse_layer_idx") or d.get("reorder_and_upcast_attn") or not d.get(
            "scale_attn_weights", True):
        raise ValueError("gpt2: only the default attention scaling (scale_attn_weights=True, no per-layer scaling, "
                         "no reorder_and_upcast_attn) is supported")
    hidden, heads = int(d["n_embd"]), int(d["n_head"])
    return DecoderConfig(
        model_type="gpt2", family="gpt2", vocab_size=int(d["vocab_size"]), hidden_size=hidden,
        num_layers=int(d["n_layer"]), num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
        intermediate_size=int(d.get("n_inner") or 4 * hidden), norm_eps=float(d.get("layer_norm_epsilon", 1e-5)),
        qkv_bias=True, o_bias=True, mlp_bias=True, tie_word_embeddings=True,
        max_positions=int(d["n_positions"]), eos_token_ids=eos_ids,
    )


def _llama_like(d: dict, model_type: str, eos_ids: tuple[int, ...]) -> DecoderConfig:
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"{model_type}: RoPE type {rope_type!r} is not supported (only 'default')")
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    if d.get("use_sliding_window"):
        raise ValueError(f"{model_type}: sliding-window attention is not supported")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{model_type}: hidden_act {d['hidden_act']!r} is not supported (silu is)")
    hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
    kv_heads = int(d.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ValueError(f"{model_type}: {heads} attention heads are not a multiple of {kv_heads} key/value heads")
    attention_bias = bool(d.get("attention_bias", False))
    return DecoderConfig(
        model_type=model_type, family="llama", vocab_size=int(d["vocab_size"]), hidden_size=hidden,
        num_layers=int(d["num_hidden_layers"]), num_heads=heads, num_kv_heads=kv_heads,
        head_dim=int(d.get("head_dim") or hidden // heads), intermediate_size=int(d["intermediate_size"]),
        norm_eps=float(d.get("rms_norm_eps", 1e-6)), qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias, mlp_bias=bool(d.get("mlp_bias", False)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), rope_theta=float(theta),
        eos_token_ids=eos_ids,
    )
