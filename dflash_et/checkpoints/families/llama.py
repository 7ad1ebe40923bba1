"""Llama (Llama 3.x, SmolLM2, and the GGUF files transformers reads as `llama`): the plain stack.

Its RoPE scalings (llama3, yarn, ...) come from transformers' own code (`base.llama_rope`); biases
(`attention_bias`, `mlp_bias`) and explicit `head_dim` are read from the config."""

from dflash_et.checkpoints.families.base import Family, attention


def layer(c, i: int, kind: str, causal: bool | None):
    return attention(c, kind, causal)


FAMILY = Family(name="llama", model_types=("llama",), layer=layer)
