"""Attention with its KV cache, one cache class per op set (`ops`), chosen when the model is built.

`Attention` owns the projections, q/k/v norms and RoPE; its `cache` writes the call's K/V rows and
attends. Every op set has the same contract, so the decode loops, the export and training never
ask which one runs:

    cache(q [1,T,H,D], k [1,S,Hkv,D], v, start, positions [S], mask=None) -> [1,T,H,D]

The S key rows sit at `positions` (consecutive from `start`), the T queries are the last T of them,
and they attend to every cached row before the call's end allowed by the layer's `AttentionSpec`
(causal or not, an optional sliding window). Rolling back is calling again at an earlier `start`:
nothing ever looks past the current call's end.

- `LlamaOpsCache` (`llama`): ExecuTorch's `llama::update_cache` / `llama::custom_sdpa` (XNNPACK and portable
  programs); the cache is updated in place instead of copied each call.
- `MlxOpsCache` (`mlx`): the MLX delegate's `mlx::kv_cache_update` / `mlx::custom_sdpa` (heads-first caches).
- `DenseCache` (`torch`): plain tensors and `F.scaled_dot_product_attention`, for eager use and training. With
  an explicit `mask` [T,S] it attends over the given K/V only and caches nothing: that is how
  training runs many draft blocks in one call. A `Segmented` mask says that the blocks of each sequence see only
  that sequence's rows, so each sequence is attended on its own: the dense product over every sequence's rows
  was most of a training step (docs/measurements.md).

A sliding window is a mask over a full-length cache, which survives any rollback; or, for
`LlamaOpsCache` given `rows` (see `ring_rows`), a ring buffer of window + `max_call` - 1 rows,
which survives rolling back within the last call (all DFlash ever does).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dflash_et.models.layers import RMSNorm


@dataclass(frozen=True)
class AttentionSpec:
    """One layer's attention: its own head shapes, scale, causality and window."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    qk_norm: bool = False
    bias: bool = False
    causal: bool = True
    window: int | None = None     # a query at p sees keys at p-window+1 .. (p, or the call's end if not causal)
    scale: float | None = None    # None: head_dim ** -0.5
    v_norm: bool = False          # a weightless RMS norm on V (Gemma 4)
    k_eq_v: bool = False          # no v_proj: V is the raw K projection (Gemma 4's full layers)
    rope: str = "default"         # which of the model's RoPE tables (Gemma 4: one per layer type)
    output_gate: bool = False     # q_proj also makes a per-head gate: output * sigmoid(gate) (Qwen3.5)

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5


# One RoPE table's rows for a call's positions: cos and sin [S, 1, R] (broadcast over heads) and rotate-half [R, R]
RopeRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def rotate_half(rotary: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """HF's rotate_half, `cat(-x2, x1)`, as the signed permutation `F.linear` multiplies by: exact (one +-1 term a
    row) and, unlike the split and cat, one XNNPACK op for any number of tokens, so a layer's projections, norms and
    RoPE are one delegate call (docs/measurements.md#programs-and-layouts). `device`: the tables' (real even where the
    model is built on the meta device)."""
    half = torch.arange(rotary // 2, device=device)
    rows = torch.zeros(rotary, rotary, dtype=dtype, device=device)
    rows[half, half + rotary // 2] = -1
    rows[half + rotary // 2, half] = 1
    return rows


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotate: torch.Tensor) -> torch.Tensor:
    """Rotate `x` [1, T, heads, D] by per-position cos/sin [T, 1, R] (HF's rotate_half convention); with
    partial rotary (R < D, Qwen3.5) only the first R channels turn."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rotary], cos, sin, rotate), x[..., rotary:]], dim=-1)
    return x * cos + F.linear(x, rotate) * sin


def allowed(spec: AttentionSpec, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """[T, S] bool: which keys each query may see under the layer's causality and window."""
    ok = torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
    if spec.causal:
        ok = ok & (k_pos[None, :] <= q_pos[:, None])
    if spec.window is not None:
        ok = ok & (q_pos[:, None] - k_pos[None, :] < spec.window)
    return ok


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as the float mask the backends' ops take (0 where allowed, -inf elsewhere)."""
    return torch.where(mask, 0.0, float("-inf")).to(dtype)


@dataclass(frozen=True)
class Segmented:
    """Training's mask [T, S] (`dense`: the S key rows are C context rows, then the T query rows) with where each
    sequence's rows are: `segments` (query start, end, context start, end); a sequence's queries see nothing
    outside its own context and query rows."""

    dense: torch.Tensor
    segments: tuple[tuple[int, int, int, int], ...]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               spec: AttentionSpec) -> torch.Tensor:
        """DenseCache's masked attention, one sequence at a time: [1, T, H, D]."""
        context, out = self.dense.shape[1] - q.shape[1], []
        for r0, r1, c0, c1 in self.segments:
            keys = torch.cat([torch.arange(c0, c1), torch.arange(context + r0, context + r1)]).to(q.device)
            mask = self.dense[r0:r1][:, keys] & allowed(spec, positions[context + r0:context + r1], positions[keys])
            out.append(F.scaled_dot_product_attention(q[:, r0:r1].transpose(1, 2), k[:, keys].transpose(1, 2),
                                                      v[:, keys].transpose(1, 2), attn_mask=mask,
                                                      scale=spec.softmax_scale, enable_gqa=True))
        return torch.cat(out, dim=2).transpose(1, 2)


def ring_rows(spec: AttentionSpec, max_seq_len: int, max_call: int | None) -> int | None:
    """Rows of a sliding layer's ring buffer: a call of T tokens must still see the window before its
    first query, and a rollback must not expose rows the last call overwrote: window + T - 1 for calls of
    at most T = `max_call` tokens. None (a full-length cache) when there is no window, no ring asked for
    (`max_call` None), or it would not be shorter."""
    if spec.window is None or max_call is None:
        return None
    rows = spec.window + max_call - 1
    return rows if rows < max_seq_len else None


class KVCache(nn.Module):
    """Static K/V buffers [1, rows, Hkv, D] and the layer's spec. Row p holds position p, or with a
    ring (`rows` < max_seq_len) position p lands in row p % rows."""

    heads_first = False
    has_ring = False

    def __init__(self, spec: AttentionSpec, max_seq_len: int, rows: int | None = None):
        super().__init__()
        if rows is not None and not self.has_ring:
            raise ValueError(f"{type(self).__name__} has no ring buffer; its sliding layers keep full-length caches")
        self.spec, self.ring = spec, rows is not None
        rows = rows or max_seq_len
        shape = (1, spec.num_kv_heads, rows, spec.head_dim) if self.heads_first else \
            (1, rows, spec.num_kv_heads, spec.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def window_mask(self, end: int, t: int, columns: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The float mask [t, columns] of the last `t` queries before `end` over cache rows 0..columns-1
        when a window applies (rows from `end` on are hidden), else None: the ops' causal flag suffices."""
        if self.spec.window is None:
            return None
        k_pos = torch.arange(columns)
        q_pos = torch.arange(end - t, end)
        return additive(allowed(self.spec, q_pos, k_pos) & (k_pos < end)[None, :], dtype)


    def ring_mask(self, end: int, t: int, dtype: torch.dtype) -> torch.Tensor:
        """The float mask [t, rows] over a ring: row j holds the last position before `end` that is j modulo
        rows (negative: never written)."""
        rows = self.k_cache.shape[1]
        j = torch.arange(rows)
        held = j + torch.div(end - 1 - j, rows, rounding_mode="floor") * rows
        return additive(allowed(self.spec, torch.arange(end - t, end), held) & (held >= 0)[None, :], dtype)


# llama::custom_sdpa's kernel takes float32 masks only, whatever the model's dtype
LLAMA_MASK_DTYPE = torch.float32


class LlamaOpsCache(KVCache):
    has_ring = True

    def __init__(self, spec: AttentionSpec, max_seq_len: int, rows: int | None = None):
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (registers torch.ops.llama.*)

        super().__init__(spec, max_seq_len, rows)

    def forward(self, q, k, v, start: int, positions: torch.Tensor, mask: torch.Tensor | None = None):
        t, s = q.shape[1], k.shape[1]
        if self.ring:
            rows = positions % self.k_cache.shape[1]
            self.k_cache.index_copy_(1, rows, k)
            self.v_cache.index_copy_(1, rows, v)
            return torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, start + s - t,
                                               self.ring_mask(start + s, t, LLAMA_MASK_DTYPE), 0, False,
                                               self.spec.softmax_scale)
        torch.ops.llama.update_cache(k, self.k_cache, start)
        torch.ops.llama.update_cache(v, self.v_cache, start)
        q_start = start + s - t
        # with a mask, the kernel attends over the whole cache: the mask covers every row
        window = self.window_mask(start + s, t, self.k_cache.shape[1], LLAMA_MASK_DTYPE)
        causal = self.spec.causal and window is None
        return torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, q_start, window, 0, causal,
                                           self.spec.softmax_scale)


class MlxOpsCache(KVCache):
    heads_first = True

    def __init__(self, spec: AttentionSpec, max_seq_len: int, rows: int | None = None):
        from dflash_et.models.mlx_ops import ensure_mlx_backend

        ensure_mlx_backend()  # registers torch.ops.mlx.*
        super().__init__(spec, max_seq_len, rows)

    def forward(self, q, k, v, start: int, positions: torch.Tensor, mask: torch.Tensor | None = None):
        t, s = q.shape[1], k.shape[1]
        torch.ops.mlx.kv_cache_update(self.k_cache, k.transpose(1, 2), start)
        torch.ops.mlx.kv_cache_update(self.v_cache, v.transpose(1, 2), start)
        q_start = start + s - t
        window = self.window_mask(start + s, t, start + s, q.dtype)  # the op slices the cache to the call's end
        causal = self.spec.causal and window is None
        y = torch.ops.mlx.custom_sdpa(q.transpose(1, 2), self.k_cache, self.v_cache, q_start, window, 0.0, causal,
                                      self.spec.softmax_scale)
        return y.transpose(1, 2)


class DenseCache(KVCache):
    def forward(self, q, k, v, start: int, positions: torch.Tensor, mask: torch.Tensor | Segmented | None = None):
        t, s = q.shape[1], k.shape[1]
        if isinstance(mask, Segmented):
            return mask.attend(q, k, v, positions, self.spec)
        if mask is None:
            self.k_cache[:, start:start + s] = k
            self.v_cache[:, start:start + s] = v
            k, v = self.k_cache[:, :start + s], self.v_cache[:, :start + s]
            positions = torch.arange(start + s)
            mask = torch.ones(t, start + s, dtype=torch.bool)
        mask = mask & allowed(self.spec, positions[-t:], positions)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                           scale=self.spec.softmax_scale, enable_gqa=True)
        return y.transpose(1, 2)


# the op sets: `torch` runs eagerly and trains, `llama` exports for XNNPACK and portable, `mlx` for MLX
CACHE_OF_OPS: dict[str, type[KVCache]] = {"torch": DenseCache, "llama": LlamaOpsCache, "mlx": MlxOpsCache}


class Attention(nn.Module):
    """Projections, q/k norms and RoPE around a backend's cache. Queries come from `x` (the last T
    rows); keys and values from `kv_in` (for a draft layer, the context rows and then the block)."""

    def __init__(self, hidden_size: int, spec: AttentionSpec, eps: float, cache: KVCache, norm_offset: float = 0.0):
        super().__init__()
        self.spec = spec
        gates = 2 if spec.output_gate else 1
        self.q_proj = nn.Linear(hidden_size, gates * spec.num_heads * spec.head_dim, bias=spec.bias)
        self.k_proj = nn.Linear(hidden_size, spec.num_kv_heads * spec.head_dim, bias=spec.bias)
        if not spec.k_eq_v:
            self.v_proj = nn.Linear(hidden_size, spec.num_kv_heads * spec.head_dim, bias=spec.bias)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, hidden_size, bias=spec.bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, eps, offset=norm_offset)
            self.k_norm = RMSNorm(spec.head_dim, eps, offset=norm_offset)
        if spec.v_norm:
            self.v_norm = RMSNorm(spec.head_dim, eps, weight=False)
        self.cache = cache

    def forward(self, x: torch.Tensor, kv_in: torch.Tensor, rope: dict[str, RopeRows],
                start: int, positions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`rope` holds each of the model's tables' rows at the key rows' positions (RopeRows)."""
        spec, t, s = self.spec, x.shape[1], kv_in.shape[1]
        cos, sin, rotate = rope[spec.rope]
        # views with one inferred dim: XNNPACK delegates those, not views by a symbolic size
        q = self.q_proj(x)
        if spec.output_gate:  # per head: the query's D channels, then its gate's D
            q, gate = q.view(1, -1, spec.num_heads, 2 * spec.head_dim).chunk(2, dim=-1)
        q = q.view(1, -1, spec.num_heads, spec.head_dim)
        k = self.k_proj(kv_in).view(1, -1, spec.num_kv_heads, spec.head_dim)
        v = k if spec.k_eq_v else self.v_proj(kv_in).view(1, -1, spec.num_kv_heads, spec.head_dim)
        if spec.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if spec.v_norm:
            v = self.v_norm(v)
        # a draft's queries are the last t key rows (explicit ends: the MLX partitioner rejects open slices); a
        # target's are all of them, with no slice to leave outside the delegate
        q_cos, q_sin = (cos, sin) if t == s else (cos[s - t:s], sin[s - t:s])
        q = apply_rope(q, q_cos, q_sin, rotate)
        k = apply_rope(k, cos, sin, rotate)
        y = self.cache(q, k, v, start, positions, mask)
        if spec.output_gate:
            y = y * torch.sigmoid(gate)
        return self.o_proj(y.reshape(1, -1, spec.num_heads * spec.head_dim))
