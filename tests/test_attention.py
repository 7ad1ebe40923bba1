"""The attention backends (dense, llama ops, MLX ops) against a from-scratch reference, for each
variant a layer can carry: causal or not, GQA/MQA/MHA, a sliding window, a non-default scale; through
calls that write context and block rows, decode, and roll back."""

import pytest
import torch

from dflash_et.models.attention import CACHE_OF_OPS, AttentionSpec, ring_rows

SPECS = {
    "causal-gqa": AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=16),
    "causal-window-scale": AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=16, window=3, scale=0.3),
    "bidirectional-mqa": AttentionSpec(num_heads=4, num_kv_heads=1, head_dim=16, causal=False),
    "bidirectional-window-mha": AttentionSpec(num_heads=2, num_kv_heads=2, head_dim=8, causal=False, window=5,
                                              scale=1.0),
}
# (start, key rows S, queries T): prefill, decode, a draft-style call (context rows + a block), a verify,
# a rollback into it, and a call whose window reaches back over rolled-back rows
CALLS = [(0, 6, 6), (6, 1, 1), (7, 9, 4), (10, 5, 5), (12, 3, 3), (13, 8, 2), (21, 1, 1), (22, 7, 7), (25, 2, 2)]


def reference(spec: AttentionSpec, q, keys, values, q_pos):
    """softmax(q k^T * scale) v over every row in `keys`/`values` (rows = positions) the spec allows."""
    rep = spec.num_heads // spec.num_kv_heads
    k, v = keys.repeat_interleave(rep, 2)[0], values.repeat_interleave(rep, 2)[0]  # [S, H, D]
    out = torch.zeros_like(q)
    for i, p in enumerate(q_pos):
        visible = [j for j in range(len(k)) if (not spec.causal or j <= p) and (spec.window is None or p - j < spec.window)]
        scores = torch.einsum("hd,shd->hs", q[0, i], k[visible]) * spec.softmax_scale
        out[0, i] = torch.einsum("hs,shd->hd", scores.softmax(-1), v[visible])
    return out


@pytest.mark.parametrize("backend", [*sorted(CACHE_OF_OPS), "llama-ring"])
@pytest.mark.parametrize("name", SPECS)
def test_backend_matches_reference(backend, name):
    """`llama-ring`: windowed layers in a ring buffer sized for the longest call (9 key rows)."""
    spec = SPECS[name]
    if backend == "llama-ring":
        rows = ring_rows(spec, 32, max_call=max(s for _, s, _ in CALLS))
        assert (rows is None) == (spec.window is None) and (rows is None or rows < 32)
        cache = CACHE_OF_OPS["llama"](spec, max_seq_len=32, rows=rows)
    else:
        cache = CACHE_OF_OPS[backend](spec, max_seq_len=32)
    g = torch.Generator().manual_seed(0)
    keys = torch.empty(1, 0, spec.num_kv_heads, spec.head_dim)
    values = keys.clone()
    for start, s, t in CALLS:
        q = torch.randn(1, t, spec.num_heads, spec.head_dim, generator=g)
        k, v = (torch.randn(1, s, spec.num_kv_heads, spec.head_dim, generator=g) for _ in range(2))
        keys, values = torch.cat([keys[:, :start], k], 1), torch.cat([values[:, :start], v], 1)  # rows past the call: gone
        with torch.no_grad():
            out = cache(q, k, v, start, torch.arange(start, start + s))
        expected = reference(spec, q, keys, values, range(start + s - t, start + s))
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", SPECS)
def test_dense_with_an_explicit_mask_caches_nothing(name):
    """Training's path: the given K/V rows only, at the given positions, under mask AND the spec."""
    spec = SPECS[name]
    cache = CACHE_OF_OPS["torch"](spec, max_seq_len=32)
    g = torch.Generator().manual_seed(1)
    s, t = 10, 4
    q = torch.randn(1, t, spec.num_heads, spec.head_dim, generator=g)
    k, v = (torch.randn(1, s, spec.num_kv_heads, spec.head_dim, generator=g) for _ in range(2))
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 3, 4, 5, 6])  # context 0..5, then a block at 3..6
    mask = torch.ones(t, s, dtype=torch.bool)
    mask[:, 3:6] = False  # the block starts at 3: context rows 3..5 are hidden from it
    with torch.no_grad():
        out = cache(q, k, v, 0, positions, mask)
    assert not cache.k_cache.any()
    keep = [0, 1, 2, 6, 7, 8, 9]
    expected = torch.zeros_like(q)
    for i in range(t):
        p = int(positions[s - t + i])
        visible = [j for j in keep if (not spec.causal or positions[j] <= p)
                   and (spec.window is None or p - positions[j] < spec.window)]
        expected[:, i:i + 1] = reference(
            AttentionSpec(spec.num_heads, spec.num_kv_heads, spec.head_dim, causal=False, scale=spec.scale),
            q[:, i:i + 1], k[:, visible], v[:, visible], [0])
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)



@pytest.mark.parametrize("rows", [None, 12])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_llama_windows_in_half_precision(dtype, rows):
    """llama::custom_sdpa's kernel takes float32 masks only: a half-precision model's window mask must
    still be float32 (a bf16 mask fails to export, an fp16 one computes NaN)."""
    spec = SPECS["causal-window-scale"]
    llama, dense = CACHE_OF_OPS["llama"](spec, 32, rows).to(dtype), CACHE_OF_OPS["torch"](spec, 32).to(dtype)
    g = torch.Generator().manual_seed(2)
    for start, s, t in CALLS[:4]:
        q = torch.randn(1, t, spec.num_heads, spec.head_dim, generator=g).to(dtype)
        k, v = (torch.randn(1, s, spec.num_kv_heads, spec.head_dim, generator=g).to(dtype) for _ in range(2))
        with torch.no_grad():
            out, expected = (c(q, k, v, start, torch.arange(start, start + s)) for c in (llama, dense))
        torch.testing.assert_close(out.float(), expected.float(), rtol=1e-2, atol=1e-2)
