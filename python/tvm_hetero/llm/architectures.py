"""The graph builder of each decoder family, chosen by the configuration's family."""

from __future__ import annotations

from .config import DecoderConfig
from .family import Family
from .gpt2 import FAMILY as GPT2
from .llama import FAMILY as LLAMA

#: family name (config.FAMILIES' values) -> its builder.
FAMILY_BUILDERS: dict[str, Family] = {"llama": LLAMA, "gpt2": GPT2}


def family_builder(cfg: DecoderConfig) -> Family:
    return FAMILY_BUILDERS[cfg.family]
