"""The position-wise parts of a decoder layer."""

import math

import torch
import torch.nn.functional as F
from torch import nn


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation (Gemma's `gelu_pytorch_tanh`), spelled out: XNNPACK lowers
    `F.gelu(x, approximate="tanh")` to its exact-erf GELU (5e-4 off per activation, 5e-3 on the logits
    of a tiny Gemma), so the programs would not match the checkpoint."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


# transformers' `hidden_act` / `hidden_activation` names of the gated MLP's activations
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": gelu_tanh}


class RMSNorm(nn.Module):
    """`x / rms(x) * w`, in float32 then cast back; `weight=False` (Gemma 4's v-norm) has no `w`.
    `offset` 1: Qwen3.5's zero-centred norms, `x / rms(x) * (1 + w)` with the product in float32."""

    def __init__(self, dim: int, eps: float, weight: bool = True, offset: float = 0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.ones(dim) if offset == 0 else torch.zeros(dim)) if weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # over a 4-D view [rows, 1, C, 1] with one inferred dim (a copy where x is strided: DeltaNet's heads): XNNPACK's
        # mean averages the last two dims of 4-D tensors, and delegates views by one inferred dim, not a symbolic size
        h = x.float().reshape(-1, 1, x.shape[-1], 1)
        h = (h * torch.rsqrt(h.pow(2).mean((2, 3), keepdim=True) + self.eps)).view(*x.shape[:1], -1, *x.shape[2:])
        if self.offset:
            return (h * (self.offset + self.weight.float())).to(x.dtype)
        return h.to(x.dtype) if self.weight is None else self.weight * h.to(x.dtype)


class MLP(nn.Module):
    """Gated feed-forward: SwiGLU (Llama, Qwen) or GeGLU with tanh GELU (Gemma)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, act: str = "silu"):
        super().__init__()
        self.act = ACTIVATIONS[act]
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
