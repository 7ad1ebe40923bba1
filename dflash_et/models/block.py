"""A transformer stack's shape and its pre-norm decoder layer, shared by the target and the draft."""

from dataclasses import dataclass

import torch
from torch import nn

from dflash_et.models.attention import CACHES, Attention, AttentionSpec
from dflash_et.models.layers import MLP, RMSNorm


@dataclass(frozen=True)
class ModelArgs:
    """The shape of one transformer stack; each layer carries its own attention spec."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    rms_norm_eps: float
    mlp_bias: bool
    tie_word_embeddings: bool
    layers: tuple[AttentionSpec, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)


class Block(nn.Module):
    """A pre-norm decoder layer. With `ctx` (a draft layer), K/V also cover the un-normed context rows."""

    def __init__(self, a: ModelArgs, spec: AttentionSpec, max_seq_len: int, cache: str):
        super().__init__()
        self.self_attn = Attention(a.hidden_size, spec, a.rms_norm_eps, CACHES[cache](spec, max_seq_len))
        self.mlp = MLP(a.hidden_size, a.intermediate_size, a.mlp_bias)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int, positions: torch.Tensor,
                ctx: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.input_layernorm(x)
        kv_in = h if ctx is None else torch.cat([ctx, h], dim=1)
        x = x + self.self_attn(h, kv_in, cos, sin, start, positions, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def start_position(input_pos: torch.Tensor, length: int, max_seq_len: int) -> int:
    """First position of a call, with the bounds the exporter needs to reason about it."""
    start = input_pos[0].item()
    torch._check(start >= 0)
    torch._check(start + length <= max_seq_len)
    return start
