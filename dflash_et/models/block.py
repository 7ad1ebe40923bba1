"""A transformer stack's shape, its RoPE tables and its decoder layer, shared by the target and the draft."""

from dataclasses import dataclass

import torch
from torch import nn

from dflash_et.models.attention import CACHE_OF_OPS, Attention, AttentionSpec, RopeRows, ring_rows, rotate_half
from dflash_et.models.deltanet import DeltaNetSpec, GatedDeltaNet
from dflash_et.models.layers import MLP, RMSNorm


@dataclass(frozen=True)
class ModelArgs:
    """The shape of one transformer stack; each layer carries its own attention spec, or a Gated
    DeltaNet spec for the linear-attention layers of hybrid models (Qwen3.5).

    The Gemma 4 variants are flags here, not a second model: `sandwich_norms` also norms each
    branch's output (four norms per layer) and multiplies each layer's output by a stored scalar
    (models.block.SandwichBlock), `embed_scale` multiplies the embedding (sqrt(hidden), rounded to the weights'
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
    embed_scale: float = 1.0
    logit_softcap: float | None = None
    norm_offset: float = 0.0

    @property
    def num_layers(self) -> int:
        return len(self.layers)


class Rope(nn.Module):
    """The model's cos/sin tables [max_seq_len, 1, R], one per name that layers' specs refer to, each with its
    rotate-half as a signed permutation [R, R] (models.attention.apply_rope)."""

    def __init__(self, tables: dict[str, tuple[torch.Tensor, torch.Tensor]]):
        super().__init__()
        self.names = sorted(tables)
        for name in self.names:
            cos, sin = tables[name]
            self.register_buffer(f"cos_{name}", cos[:, None, :], persistent=False)
            self.register_buffer(f"sin_{name}", sin[:, None, :], persistent=False)
            self.register_buffer(f"rotate_{name}", rotate_half(cos.shape[-1], cos.dtype, cos.device), persistent=False)

    @property
    def max_seq_len(self) -> int:
        return getattr(self, f"cos_{self.names[0]}").shape[0]

    def rotation(self, name: str) -> torch.Tensor:
        return getattr(self, f"rotate_{name}")

    def forward(self, positions: torch.Tensor) -> dict[str, RopeRows]:
        return {n: (getattr(self, f"cos_{n}")[positions], getattr(self, f"sin_{n}")[positions], self.rotation(n))
                for n in self.names}


def scale_embedding(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Multiply by `scale` rounded to x's dtype first, as Gemma does (sqrt(5376) = 73.32 is 73.5 in bf16)."""
    return x if scale == 1.0 else x * torch.tensor(scale, dtype=x.dtype)


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if cap is None else torch.tanh(logits / cap) * cap


def attention(a: ModelArgs, spec: AttentionSpec, max_seq_len: int, ops: str, max_call: int | None,
              ring: bool) -> Attention:
    """A layer's attention with its cache for `ops`; with `ring`, a sliding layer's cache is a ring buffer sized
    for calls of at most `max_call` (models.attention)."""
    kv = CACHE_OF_OPS[ops](spec, max_seq_len, ring_rows(spec, max_seq_len, max_call if ring else None))
    return Attention(a.hidden_size, spec, a.rms_norm_eps, kv, a.norm_offset)


def add_mlp(layer: nn.Module, a: ModelArgs) -> None:
    """The MLP and the two norms every layer has (the target's and the draft's), registered after its mixer: an
    export takes the parameters in their registration order, which stays the checkpoints' (and the programs'
    bytes with it)."""
    layer.mlp = MLP(a.hidden_size, a.intermediate_size, a.mlp_bias, a.hidden_act)
    layer.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps, offset=a.norm_offset)
    # Llama/Qwen: the MLP's input norm. Gemma: the attention output's norm, then two around the MLP.
    layer.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps, offset=a.norm_offset)


class Block(nn.Module):
    """A target's pre-norm decoder layer (Llama, Qwen): a token mixer, then the MLP, each added to the residual.
    Subclasses say what mixes (`AttentionBlock`, `DeltaNetBlock`) and `SandwichBlock` is Gemma 4's layer; `block`
    picks one per layer."""

    def forward(self, x: torch.Tensor, rope: dict[str, RopeRows], start: int,
                positions: torch.Tensor) -> torch.Tensor:
        return self.join(x, self.mix(self.input_layernorm(x), rope, start, positions))

    def mix(self, h: torch.Tensor, rope: dict[str, RopeRows], start: int,
            positions: torch.Tensor) -> torch.Tensor:
        """The token mixer's output for the normed input `h`."""
        raise NotImplementedError

    def join(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """The residual `x` plus the mixer's output, then plus the MLP's."""
        x = x + mixed
        return x + self.mlp(self.post_attention_layernorm(x))


class AttentionBlock(Block):
    """Self-attention as the mixer. `ops`: the op set (see attention). `max_call`: the longest call (None: any),
    which with `ring` sizes sliding layers' ring buffers (see attention)."""

    def __init__(self, a: ModelArgs, spec: AttentionSpec, max_seq_len: int, ops: str, max_call: int | None = None,
                 ring: bool = False):
        super().__init__()
        self.self_attn = attention(a, spec, max_seq_len, ops, max_call, ring)
        add_mlp(self, a)

    def mix(self, h: torch.Tensor, rope: dict[str, RopeRows], start: int,
            positions: torch.Tensor) -> torch.Tensor:
        return self.self_attn(h, h, rope, start, positions)


class SandwichBlock(AttentionBlock):
    """Gemma 4's layer: each branch's output normed too (four norms), the layer's output times a stored scalar."""

    def __init__(self, a: ModelArgs, spec: AttentionSpec, max_seq_len: int, ops: str, max_call: int | None = None,
                 ring: bool = False):
        super().__init__(a, spec, max_seq_len, ops, max_call, ring)
        self.pre_feedforward_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.register_buffer("layer_scalar", torch.ones(1))

    def join(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(mixed)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x * self.layer_scalar


class DeltaNetBlock(Block):
    """A hybrid target's linear-attention layer (Qwen3.5): a Gated DeltaNet mixes. `max_call` sizes its buffers;
    `verify_call`: the longest call that may be kept in part, whose rows it keeps to replay (see deltanet; None:
    any call)."""

    def __init__(self, a: ModelArgs, spec: DeltaNetSpec, max_seq_len: int, ops: str, max_call: int | None = None,
                 verify_call: int | None = None):
        super().__init__()
        self.linear_attn = GatedDeltaNet(a.hidden_size, spec, a.rms_norm_eps, max_call or max_seq_len,
                                         verify_call or max_call or max_seq_len, ops)
        add_mlp(self, a)

    def mix(self, h: torch.Tensor, rope: dict[str, RopeRows], start: int,
            positions: torch.Tensor) -> torch.Tensor:
        return self.linear_attn(h, positions)


def block(a: ModelArgs, spec: AttentionSpec | DeltaNetSpec, max_seq_len: int, ops: str, max_call: int | None,
          verify_call: int | None, ring: bool) -> Block:
    """The target's layer for `spec`."""
    if isinstance(spec, DeltaNetSpec):
        if a.sandwich_norms:
            raise ValueError("Gemma's sandwich norms come with attention layers only; no model has DeltaNet layers too")
        return DeltaNetBlock(a, spec, max_seq_len, ops, max_call, verify_call)
    layer = SandwichBlock if a.sandwich_norms else AttentionBlock
    return layer(a, spec, max_seq_len, ops, max_call, ring)


def start_position(input_pos: torch.Tensor, length: int, max_seq_len: int) -> int:
    """First position of a call, with the bounds the exporter needs to reason about it."""
    start = input_pos[0].item()
    torch._check(start >= 0)
    torch._check(start + length <= max_seq_len)
    return start
