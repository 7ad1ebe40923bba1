"""Gated DeltaNet (Qwen3.5's linear attention) with a recurrent state that rolls back like a KV cache.

An attention layer rolls back for free: the next call writes its K/V over the rejected rows. A
DeltaNet layer folds every token into one recurrent state (and a short convolution window), so after
verifying T tokens of which only the first `keep` were accepted, the state must be the state after
exactly those `keep`. This layer keeps the contract of the attention caches all the same: a call
starting at `start` continues from the state after every token before `start`, `keep = start -
previous start`. Each call stores its final state, its start state and the keys, values, decays and
betas of its first `verify_call` tokens; the next call takes the final state when the previous call
was kept whole (prefill, plain steps, a verify accepted in full), else replays the kept tokens from
the start state (a program replays all `verify_call` rows, those past `keep` masked out: decay 1,
beta 0 leave the state as it is). A call at position 0 starts a new sequence. So calls go forward:
each starts at 0, or from the previous call's start to its end, and one kept in part keeps at most
its first `verify_call` tokens (the programs' `get_recurrent_state`, `get_verify_rows`; every decode
loop does this).

Why replay and not per-position states: keeping the state after every verified token costs a full
state per token (Qwen3.5-4B: 2 MiB per layer, 32 MiB per layer for a 16-token verify, 768 MiB over its
24 DeltaNet layers), written every call; the replay keeps 64 KiB of inputs per token and layer and
reruns the recurrence over them. Measured at Qwen3.5-4B's shapes: docs/measurements.md.

`ops` picks the recurrence as it picks the attention's cache: `llama` is ExecuTorch's fused
`llama::gated_delta_rule` (what the programs call), `torch` the same recurrence in plain torch (the
reference, and what eager models run).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dflash_et.models.layers import RMSNorm


@dataclass(frozen=True)
class DeltaNetSpec:
    """One Gated DeltaNet layer's shapes (transformers' `linear_*` config fields)."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim


def torch_rule(query, key, value, decay, beta, state):
    """The gated delta rule token by token, heads first ([1, H, T, D]; decay and beta [1, H, T]): what
    `llama::gated_delta_rule` computes, in plain torch. Returns (output, final state)."""
    out = []
    for i in range(key.shape[2]):
        state = state * decay[:, :, i, None, None]
        k, v = key[:, :, i], value[:, :, i]
        delta = (v - (state * k[..., None]).sum(-2)) * beta[:, :, i, None]
        state = state + k[..., None] * delta[..., None, :]
        out.append((state * query[:, :, i, :, None]).sum(-2))
    return (torch.stack(out, dim=2) if out else value[:, :, :0]), state  # (a replay may have no rows)


def fused_rule(query, key, value, decay, beta, state):
    return torch.ops.llama.gated_delta_rule(query, key, value, decay, beta, state)


RULE_OF_OPS = {"torch": torch_rule, "llama": fused_rule}


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    """transformers' `Qwen3_5GatedDeltaNet` (same parameter names), with a state that rolls back (see above).
    `max_call`: the longest call; `verify_call`: the longest call that may be kept in part."""

    def __init__(self, hidden_size: int, spec: DeltaNetSpec, eps: float, max_call: int, verify_call: int,
                 ops: str = "torch"):
        super().__init__()
        if ops not in RULE_OF_OPS:
            raise ValueError(f"Gated DeltaNet layers run on the {' and '.join(RULE_OF_OPS)} op sets, not {ops}")
        if ops == "llama":
            import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (registers torch.ops.llama.*)
        self.spec, self.rule = spec, RULE_OF_OPS[ops]
        s, c = spec, spec.conv_dim
        self.in_proj_qkv = nn.Linear(hidden_size, c, bias=False)
        self.in_proj_z = nn.Linear(hidden_size, s.num_v_heads * s.v_head_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden_size, s.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden_size, s.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(c, c, s.conv_kernel, groups=c, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(s.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(s.num_v_heads))
        self.norm = RMSNorm(s.v_head_dim, eps)
        self.out_proj = nn.Linear(s.num_v_heads * s.v_head_dim, hidden_size, bias=False)
        h, window, v = s.num_v_heads, s.conv_kernel - 1, verify_call
        # float32 whatever the weights' dtype, as transformers runs the rule (and the fused op takes no other)
        state = {"state": (1, h, s.k_head_dim, s.v_head_dim),      # at the previous call's start
                 "final": (1, h, s.k_head_dim, s.v_head_dim),      # and after it
                 "conv_in": (1, window + max_call, c),                  # conv inputs: the window before it, its tokens
                 "keys": (1, h, v, s.k_head_dim), "values": (1, h, v, s.v_head_dim),
                 "decays": (1, h, v), "betas": (1, h, v)}           # its first tokens, to replay
        for name, shape in state.items():
            self.register_buffer(name, torch.zeros(shape, dtype=torch.float32), persistent=False)
        self.register_buffer("start", torch.zeros(1, dtype=torch.long), persistent=False)
        self.register_buffer("length", torch.zeros(1, dtype=torch.long), persistent=False)

    state_dtype = torch.float32  # loading keeps these buffers in float32 (see checkpoints.load)

    def _resume(self, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The state and the conv window at `start` [1]: the previous call's final state, or its first `keep`
        tokens replayed. Eagerly only those rows run; a program runs every row, since its shapes cannot
        depend on data."""
        fresh = start == 0
        keep = torch.where(fresh, 0, torch.minimum((start - self.start).clamp(min=0), self.length))
        n = self.keys.shape[2]
        if self.rule is torch_rule:
            n = 0 if keep == self.length else min(int(keep), n)
        kept = torch.arange(n) < keep
        decays = torch.where(kept, self.decays[:, :, :n], 1.0)
        betas = torch.where(kept, self.betas[:, :, :n], 0.0)
        # rows never written hold whatever the program's memory held (ExecuTorch does not zero mutable
        # buffers): a NaN there would survive beta 0, so masked rows are zeros
        keys = torch.where(kept[:, None], self.keys[:, :, :n], 0.0)
        values = torch.where(kept[:, None], self.values[:, :, :n], 0.0)
        _, replayed = self.rule(keys, keys, values, decays, betas, self.state)  # (any query: only the state is kept)
        state = torch.where(fresh, 0.0, torch.where(keep == self.length, self.final, replayed))
        window = self.conv_in.index_select(1, keep + torch.arange(self.spec.conv_kernel - 1))
        return state, torch.where(fresh, 0.0, window)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        s, t = self.spec, x.shape[1]
        state, window = self._resume(positions[:1])
        conv_in = torch.cat([window, self.in_proj_qkv(x).float()], dim=1)  # [1, window + T, C]
        mixed = F.silu(F.conv1d(conv_in.transpose(1, 2), self.conv1d.weight.float(), groups=s.conv_dim))
        q, k, v = mixed.transpose(1, 2).split([s.num_k_heads * s.k_head_dim] * 2 + [s.num_v_heads * s.v_head_dim], -1)
        repeat = s.num_v_heads // s.num_k_heads  # each key head serves `repeat` consecutive value heads
        q, k = (l2norm(y.view(1, t, s.num_k_heads, s.k_head_dim)).repeat_interleave(repeat, 2).transpose(1, 2)
                for y in (q, k))
        v = v.view(1, t, s.num_v_heads, s.v_head_dim).transpose(1, 2)
        beta = self.in_proj_b(x).float().sigmoid().transpose(1, 2)
        decay = torch.exp(-self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float()))
        decay = decay.transpose(1, 2)
        out, final = self.rule(q * s.k_head_dim ** -0.5, k, v, decay, beta, state)
        self._remember(positions[:1], t, state, final, conv_in, (k, v, decay, beta))
        z = self.in_proj_z(x).view(1, t, s.num_v_heads, s.v_head_dim)
        y = self.norm(out.transpose(1, 2).to(x.dtype)) * F.silu(z.float()).to(x.dtype)
        return self.out_proj(y.reshape(1, t, -1))

    def _remember(self, start, t, state, final, conv_in, replay) -> None:
        """This call's start and final states, conv inputs and first tokens' replay inputs."""
        self.state.copy_(state)
        self.final.copy_(final)
        self.conv_in.index_copy_(1, torch.arange(conv_in.shape[1]), conv_in)
        rows = self.keys.shape[2]
        for buffer, value in zip((self.keys, self.values, self.decays, self.betas), replay):
            # the first `rows` tokens, zero-padded when the call is shorter: a static shape to write
            pad = (0, 0, 0, rows) if value.dim() == 4 else (0, rows)
            buffer.copy_(F.pad(value, pad).narrow(2, 0, rows))
        self.start.copy_(start)
        self.length.fill_(t)
