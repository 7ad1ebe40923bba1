"""A transformer stack's shape, its RoPE tables and its decoder layer, shared by the target and the draft."""

from dataclasses import dataclass

import torch
from torch import nn

from dflash_et.models.attention import CACHE_OF_OPS, Attention, AttentionSpec, ring_rows
from dflash_et.models.deltanet import DeltaNetSpec, GatedDeltaNet
from dflash_et.models.dflash2 import GroupedCausalConv
from dflash_et.models.layers import MLP, RMSNorm


@dataclass(frozen=True)
class ModelArgs:
    """The shape of one transformer stack; each layer carries its own attention spec, or a Gated
    DeltaNet spec for the linear-attention layers of hybrid models (Qwen3.5).

    The Gemma 4 variants are flags here, not a second model: `sandwich_norms` also norms each
    branch's output (four norms per layer), `layer_scalar` multiplies each layer's output by a
    stored scalar, `embed_scale` multiplies the embedding (sqrt(hidden), rounded to the weights'
    dtype), `logit_softcap` bounds the logits to (-cap, cap) with tanh. `norm_offset` 1 makes every
    RMSNorm zero-centred, `(1 + w)` (Qwen3.5).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    rms_norm_eps: float
    mlp_bias: bool
    tie_word_embeddings: bool
    layers: tuple[AttentionSpec | DeltaNetSpec, ...]
    hidden_act: str = "silu"
    sandwich_norms: bool = False
    layer_scalar: bool = False
    embed_scale: float = 1.0
    logit_softcap: float | None = None
    norm_offset: float = 0.0

    @property
    def num_layers(self) -> int:
        return len(self.layers)


class Rope(nn.Module):
    """The model's cos/sin tables [max_seq_len, D], one per name that layers' specs refer to."""

    def __init__(self, tables: dict[str, tuple[torch.Tensor, torch.Tensor]]):
        super().__init__()
        self.names = sorted(tables)
        for name in self.names:
            self.register_buffer(f"cos_{name}", tables[name][0], persistent=False)
            self.register_buffer(f"sin_{name}", tables[name][1], persistent=False)

    @property
    def max_seq_len(self) -> int:
        return getattr(self, f"cos_{self.names[0]}").shape[0]

    def forward(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {n: (getattr(self, f"cos_{n}")[positions], getattr(self, f"sin_{n}")[positions]) for n in self.names}


def scale_embedding(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Multiply by `scale` rounded to x's dtype first, as Gemma does (sqrt(5376) = 73.32 is 73.5 in bf16)."""
    return x if scale == 1.0 else x * torch.tensor(scale, dtype=x.dtype)


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if cap is None else torch.tanh(logits / cap) * cap


class Block(nn.Module):
    """A pre-norm decoder layer. With `ctx` (a draft layer), K/V also cover the un-normed context rows.
    `ops`: the op set (see attention). `max_call`: the longest call (None: any), which sizes DeltaNet's
    buffers and, with `ring`, sliding layers' ring buffers (see attention). `verify_call`: the longest call
    that may be kept in part, whose rows DeltaNet layers keep to replay (see deltanet; None: any call).
    `conv` (kernel size, group size): a DFlash2 draft layer's causal convolutions over the block around attention
    and around the MLP (models.dflash2)."""

    def __init__(self, a: ModelArgs, spec: AttentionSpec | DeltaNetSpec, max_seq_len: int, ops: str,
                 max_call: int | None = None, verify_call: int | None = None, ring: bool = False,
                 conv: tuple[int, int] | None = None):
        super().__init__()
        if conv is not None:
            self.attention_conv = GroupedCausalConv(a.hidden_size, *conv)
            self.mlp_conv = GroupedCausalConv(a.hidden_size, *conv)
        self.sandwich = a.sandwich_norms
        if isinstance(spec, DeltaNetSpec):
            self.linear_attn = GatedDeltaNet(a.hidden_size, spec, a.rms_norm_eps, max_call or max_seq_len,
                                             verify_call or max_call or max_seq_len, ops)
        else:
            kv = CACHE_OF_OPS[ops](spec, max_seq_len, ring_rows(spec, max_seq_len, max_call if ring else None))
            self.self_attn = Attention(a.hidden_size, spec, a.rms_norm_eps, kv, a.norm_offset)
        self.mlp = MLP(a.hidden_size, a.intermediate_size, a.mlp_bias, a.hidden_act)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps, offset=a.norm_offset)
        # Llama/Qwen: the MLP's input norm. Gemma: the attention output's norm, then two around the MLP.
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps, offset=a.norm_offset)
        if a.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        if a.layer_scalar:
            self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x: torch.Tensor, rope: dict[str, tuple[torch.Tensor, torch.Tensor]], start: int,
                positions: torch.Tensor, ctx: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        rows_see = None if mask is None or ctx is None else mask[:, ctx.shape[1]:]  # a training draft's blocks
        h = self.input_layernorm(x)
        if hasattr(self, "attention_conv"):
            h, kernel = self.attention_conv.prepare(h, rows_see)
        if hasattr(self, "linear_attn"):
            attn = self.linear_attn(h, positions)
        else:
            kv_in = h if ctx is None else torch.cat([ctx, h], dim=1)
            attn = self.self_attn(h, kv_in, rope, start, positions, mask)
        if hasattr(self, "attention_conv"):
            attn = self.attention_conv.finish(attn, kernel, rows_see)
        if not self.sandwich:
            x = x + attn
            return x + self._mlp(self.post_attention_layernorm(x), rows_see)
        x = x + self.post_attention_layernorm(attn)
        x = x + self.post_feedforward_layernorm(self._mlp(self.pre_feedforward_layernorm(x), rows_see))
        return x * self.layer_scalar if hasattr(self, "layer_scalar") else x

    def _mlp(self, h: torch.Tensor, rows_see: torch.Tensor | None) -> torch.Tensor:
        if not hasattr(self, "mlp_conv"):
            return self.mlp(h)
        h, kernel = self.mlp_conv.prepare(h, rows_see)
        return self.mlp_conv.finish(self.mlp(h), kernel, rows_see)


def start_position(input_pos: torch.Tensor, length: int, max_seq_len: int) -> int:
    """First position of a call, with the bounds the exporter needs to reason about it."""
    start = input_pos[0].item()
    torch._check(start >= 0)
    torch._check(start + length <= max_seq_len)
    return start
