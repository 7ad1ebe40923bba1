"""The eager models against independent oracles: transformers for the target, a from-scratch
implementation and z-lab's DFlashDraftModel for the draft."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from dflash_et.checkpoints.pair import load_pair
from dflash_et.checkpoints.load import load_config, load_target, weight_files
from dflash_et.errors import CheckpointError
from tests.tiny_checkpoints import TARGET_CONFIGS, random_checkpoint

TAPS = [0, 2, 3]  # includes the last layer, whose transformers hidden state is after the final norm


def close(ours: torch.Tensor, ref: torch.Tensor, tol: float = 1e-5) -> None:
    """Equal up to `tol` of the reference's largest magnitude (and 1e-4 relative)."""
    scale = ref.abs().max().item()
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=tol * max(scale, 1.0))


def check_against_hf(target, hf, layer_ids, calls, tol: float = 1e-5):
    """Run (tokens, start) calls through our cached target; each must equal HF on the true sequence so far.

    The true sequence is the previous one cut at `start` plus the call's tokens: that is a rollback
    whenever `start` is before the end of what was written.
    """
    seq = []
    for tokens, start in calls:
        seq = seq[:start] + tokens
        with torch.no_grad():
            logits, taps = target(torch.tensor([tokens]), torch.arange(start, start + len(tokens)))
            ref = hf(torch.tensor([seq]), output_hidden_states=True)
        end = start + len(tokens)
        close(logits, ref.logits[:, start:end], tol)
        close(taps, torch.cat([ref.hidden_states[i + 1][:, start:end] for i in layer_ids], dim=-1), tol)


def cache_calls(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def toks(n):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    # prefill in chunks, decode, verify a block, roll back into it, verify again, decode
    return [(toks(4), 0), (toks(4), 4), (toks(2), 8), (toks(1), 10), (toks(6), 11), (toks(5), 13),
            (toks(8), 15), (toks(1), 19), (toks(3), 17)]


@pytest.mark.parametrize("name", TARGET_CONFIGS)
def test_target_matches_transformers(name, tmp_path):
    family, overrides, shard = TARGET_CONFIGS[name]
    ckpt = random_checkpoint(tmp_path / name, family, shard=shard, **overrides)
    if shard:
        assert (ckpt / "model.safetensors.index.json").exists()
    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    target = load_target(ckpt, TAPS, max_seq_len=64)
    check_against_hf(target, hf, TAPS, cache_calls(hf.config.get_text_config().vocab_size))


def test_builtin_target_matches_transformers(pair):
    target_dir, _ = pair
    hf = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    layer_ids = [1, 3, 5]
    check_against_hf(load_target(target_dir, layer_ids, max_seq_len=64), hf, layer_ids, cache_calls(2048, seed=1))


def test_target_refuses_to_write_past_max_seq_len(pair):
    target = load_target(pair[0], [1, 3], max_seq_len=16)
    with pytest.raises(RuntimeError):
        target(torch.zeros(1, 4, dtype=torch.long), torch.arange(14, 18))


# --- draft ------------------------------------------------------------------------------------


def reference_draft(w, config, embed, lm_head, taps, block, start, embed_scale=1.0):
    """DFlash draft math from scratch: full context every call, plain tensors, no cache. A layer of
    `layer_types` "sliding_attention" sees keys less than `sliding_window` positions back and is causal
    inside the block, a full layer sees the whole block (z-lab's rule); logits are softcapped when the
    config says `final_logit_softcapping`."""
    heads, kv_heads, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    eps = config.rms_norm_eps
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    cap = getattr(config, "final_logit_softcapping", None)

    def norm(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    c, b = taps.shape[1], block.shape[1]
    rope = LlamaRotaryEmbedding(config)
    cos, sin = rope(taps, torch.arange(c + b)[None])
    ctx = norm(F.linear(taps, w["fc.weight"]), w["hidden_norm.weight"])
    x = F.embedding(block, embed) * embed_scale
    q_pos, k_pos = torch.arange(c, c + b)[:, None], torch.arange(c + b)[None, :]
    for i in range(config.num_hidden_layers):
        visible = torch.ones(b, c + b, dtype=torch.bool)
        if kinds[i] == "sliding_attention":
            visible = (k_pos <= q_pos) & (q_pos - k_pos < config.sliding_window)
        p = f"layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        kv = torch.cat([ctx, h], dim=1)
        q = norm(F.linear(h, w[p + "self_attn.q_proj.weight"]).view(1, b, heads, hd), w[p + "self_attn.q_norm.weight"])
        k = norm(F.linear(kv, w[p + "self_attn.k_proj.weight"]).view(1, c + b, kv_heads, hd), w[p + "self_attn.k_norm.weight"])
        v = F.linear(kv, w[p + "self_attn.v_proj.weight"]).view(1, c + b, kv_heads, hd)
        q, _ = apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), cos[:, c:], sin[:, c:])
        k, _ = apply_rotary_pos_emb(k.transpose(1, 2), k.transpose(1, 2), cos, sin)
        rep = heads // kv_heads
        k, v = k.repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1)
        scores = (q @ k.transpose(-1, -2) / hd ** 0.5).masked_fill(~visible, float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v
        x = x + F.linear(att.transpose(1, 2).reshape(1, b, heads * hd), w[p + "self_attn.o_proj.weight"])
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        x = x + F.linear(F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"])) * F.linear(h, w[p + "mlp.up_proj.weight"]),
                         w[p + "mlp.down_proj.weight"])
    logits = F.linear(norm(x, w["norm.weight"])[:, 1:], lm_head)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def draft_rounds(draft, settings, width, oracle, seed=0, vocab=2048):
    """Feed the cached draft growing context over several rounds; compare each round with `oracle`."""
    g = torch.Generator().manual_seed(seed)
    all_taps = torch.empty(1, 0, width)
    for n, b in [(7, 16), (1, 4), (3, 2), (16, 9), (2, 16), (5, 3)]:
        new = torch.randn(1, n, width, generator=g)
        start = all_taps.shape[1]
        all_taps = torch.cat([all_taps, new], dim=1)
        block = torch.tensor([[int(torch.randint(0, vocab, (1,), generator=g))] + [settings.mask_token_id] * (b - 1)])
        with torch.no_grad():
            ours = draft(block, new, torch.arange(start, start + n))
            ref = oracle(all_taps, block)
        assert ours.shape == (1, b - 1, vocab)
        close(ours, ref)


@pytest.fixture(scope="module")
def eager_pair(pair):
    return load_pair(*pair, max_seq_len=128)


def test_draft_matches_from_scratch_reference(pair, eager_pair):
    target, draft, settings = eager_pair
    w, config = load_file(weight_files(pair[1])[0]), load_config(pair[1])
    embed, head = target.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    width = len(settings.target_layer_ids) * target.args.hidden_size
    draft_rounds(draft, settings, width,
                 lambda taps, block: reference_draft(w, config, embed, head, taps, block, 0))


def test_draft_matches_zlab(pair, tmp_path):
    from dflash import DFlashDraftModel

    target, draft, settings = load_pair(*pair, max_seq_len=128)
    zlab = DFlashDraftModel.from_pretrained(pair[1]).eval()
    width = len(settings.target_layer_ids) * target.args.hidden_size

    def oracle(taps, block):
        c, b = taps.shape[1], block.shape[1]
        hidden = zlab(position_ids=torch.arange(c + b)[None], noise_embedding=target.embed_tokens(block),
                      target_hidden=taps)
        return zlab.compute_logits(hidden[:, 1:], target.lm_head)

    draft_rounds(draft, settings, width, oracle, seed=1)


def test_draft_loads_strictly(pair, tmp_path):
    from safetensors.torch import load_file, save_file

    import shutil
    target_dir, draft_dir = pair
    bad = tmp_path / "draft"
    shutil.copytree(draft_dir, bad)
    weights = load_file(bad / "model.safetensors")
    weights["layers.0.extra.weight"] = torch.zeros(2)
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match="unexpected: layers.0.extra.weight"):
        load_pair(target_dir, bad, 64)
    del weights["layers.0.extra.weight"], weights["layers.1.mlp.up_proj.weight"]
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing: layers.1.mlp.up_proj.weight"):
        load_pair(target_dir, bad, 64)


def test_pair_mismatch_is_a_clear_error(pair, tmp_path):
    import shutil
    bad = tmp_path / "draft"
    shutil.copytree(pair[1], bad)
    config = json.loads((bad / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 7]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"does not fit target .*target_layer_ids \[7\]"):
        load_pair(pair[0], bad, 64)


def test_loading_is_strict_without_the_fetch_checks(pair, tmp_path):
    """load_target itself refuses incomplete weights, for callers that skip checkpoint.check_target."""
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "target"
    shutil.copytree(pair[0], bad)
    weights = load_file(bad / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"weights do not match its config.json \(missing: norm.weight\)"):
        load_target(bad, [1, 3], 32)


def test_gelu_tanh_matches_torch():
    """models.layers spells GELU's tanh form out (XNNPACK lowers F.gelu's tanh form to exact GELU)."""
    from dflash_et.models.layers import gelu_tanh

    x = torch.linspace(-8, 8, 4001)
    torch.testing.assert_close(gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=1e-6, atol=1e-6)
