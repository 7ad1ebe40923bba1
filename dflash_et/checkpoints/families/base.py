"""What a target family is (`Family`, its built-in tiny target `Builtin`) and the pieces most families share.

A family maps a Hugging Face config onto the project's one model definition (`models/`): it says
which layer spec each layer gets, which `ModelArgs` variants it turns on, how its RoPE tables are made,
what it refuses, how z-lab lays out its drafts and what its built-in tiny target looks like. Every
field but the layer spec has a default that fits a plain Llama-style stack.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from dflash_et.models.attention import AttentionSpec
from dflash_et.models.deltanet import DeltaNetSpec

Layer = AttentionSpec | DeltaNetSpec
RopeTables = dict[str, tuple[torch.Tensor, torch.Tensor]]


def attention(c: PretrainedConfig, kind: str, causal: bool | None, qk_norm: bool = False,
              output_gate: bool = False) -> AttentionSpec:
    """A standard attention layer of `kind` ("full_attention" or "sliding_attention"); `causal=None` is
    z-lab's rule for drafts: sliding layers causal inside the block, full layers see the whole block."""
    return AttentionSpec(
        num_heads=c.num_attention_heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        qk_norm=qk_norm, bias=bool(getattr(c, "attention_bias", False)),
        causal=kind == "sliding_attention" if causal is None else causal,
        window=getattr(c, "sliding_window", None) if kind == "sliding_attention" else None, output_gate=output_gate)


def rope_table(rope: torch.nn.Module, max_seq_len: int, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_seq_len, D] for positions 0..max_seq_len-1 from a transformers rotary embedding."""
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), torch.arange(max_seq_len)[None], *args)
    return cos[0], sin[0]


def llama_rope(c: PretrainedConfig, max_seq_len: int) -> RopeTables:
    """One table from transformers' own RoPE code (default, llama3, yarn, ... scaling)."""
    return {"default": rope_table(LlamaRotaryEmbedding(c), max_seq_len)}


def no_args(c: PretrainedConfig) -> dict:
    return {}


def accept(c: PretrainedConfig) -> None:
    return None


def accept_json(raw: dict, where: str) -> None:
    return None


def no_draft_changes(target: dict, num_layers: int) -> dict:
    return {}


@dataclass(frozen=True)
class Builtin:
    """A family's tiny built-in target, as `checkpoints.builtin.write_target(family=...)` writes it."""

    source: str | None  # the model.target value that fetches it ("builtin-gemma"); None: none of its own
    shape: dict  # its HF config's shape (write_target's `shape` overrides parts)
    # (HF config, EOS ids, pad id) for the built tokenizer and the shape (with vocab_size)
    config: Callable[[PreTrainedTokenizerFast, dict], tuple[PretrainedConfig, list[int], int]]
    model: type[PreTrainedModel]  # the HF class that makes it (Qwen3ForCausalLM, ...)
    sampling: dict  # what the real family's generation_config.json recommends
    tokenizer: dict = field(default_factory=dict)  # builtin.build_tokenizer's arguments; {}: its defaults


@dataclass(frozen=True)
class Family:
    """One target family: the HF model_types it claims and how their configs map onto `models/`."""

    name: str
    model_types: tuple[str, ...]  # config.model_type values (a multimodal wrapper's and its text model's)
    layer: Callable[[PretrainedConfig, int, str, bool | None], Layer]  # (text config, index, layer type, causal)
    args: Callable[[PretrainedConfig], dict] = no_args  # the ModelArgs variants it turns on (Gemma's norms, ...)
    rope: Callable[[PretrainedConfig, int], RopeTables] = llama_rope  # (text config, max_seq_len) -> tables
    refuse: Callable[[PretrainedConfig], None] = accept  # raises CheckpointError on features not built
    refuse_json: Callable[[dict, str], None] = accept_json  # (raw config.json, its path): before transformers reads it
    draft_layout: Callable[[dict, int], dict] = no_draft_changes  # z-lab's draft config.json changes for this target
    builtin: Builtin | None = None
