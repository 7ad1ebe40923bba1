"""Training a DFlash draft for any target, following z-lab's published recipe.

Data are the target's own greedy responses (so the draft learns what the target will say, not
what a dataset says). Per sequence, anchor positions are sampled; each training block is
`[anchor token, mask x (B-1)]` at the anchor's positions, whose queries see the target taps of
the positions before the anchor and the whole block (bidirectional inside the block, nothing
after it). The loss is cross-entropy on the B-1 masked positions, position k weighted by
exp(-(k-1)/gamma): early positions matter most, since a block is accepted left to right.
The target's embedding and head are borrowed and frozen.

Data-parallel under `torchrun` (torch.distributed reads WORLD_SIZE/RANK; each rank draws
different sequences and anchors, gradients are all-reduced to their mean), NCCL on GPUs.
"""

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dflash_et import builtin
from dflash_et.files import write_csv, write_json
from dflash_et.generate import generate_ar, generate_dflash, pooled_tau
from dflash_et.model import Draft, Target, apply_rope, build_draft, checkpoint_id, eos_ids, load_target
from dflash_et.prompts import builtin_prompts, encode_chat, load_prompts, tokenizer
from dflash_et.threads import all_cores

TRAIN_PROMPT_SEED = 4321


@dataclass(frozen=True)
class TrainConfig:
    """The `train_draft` section of params.yaml."""

    steps: int = 2000
    lr: float = 1e-3
    batch: int = 4                # sequences per step (per rank)
    block_size: int = 16
    anchors: int = 16             # anchors sampled per sequence
    gamma: float = 7.0
    num_layers: int = 2
    prompts: str = "builtin"      # builtin | a JSONL file (see prompts.load_prompts)
    num_prompts: int = 768
    heldout: int = 12             # prompts kept out of training, for the acceptance estimate
    max_new_tokens: int = 48
    max_seq_len: int = 512
    seed: int = 0


@dataclass
class Sequence:
    tokens: torch.Tensor          # [L] prompt + the target's greedy response
    taps: torch.Tensor            # [L, k*H] the target's hidden states at every position
    prompt_len: int


def target_sequences(target: Target, prompts: list[list[int]], max_new_tokens: int, eos: set[int]) -> list[Sequence]:
    """The target's own greedy continuation of each prompt, and its taps over the whole sequence."""
    out = []
    with torch.no_grad():
        for ids in prompts:
            reply = generate_ar(target, ids, max_new_tokens, eos, target.max_seq_len, 64).tokens
            tokens = torch.tensor(ids + reply)
            _, taps = target(tokens[None], torch.arange(len(tokens)))
            out.append(Sequence(tokens, taps[0], len(ids)))
    return out


def sample_anchors(seq: Sequence, n: int, gen: torch.Generator) -> torch.Tensor:
    """Anchor positions where decoding actually happens: from the last prompt token to the one before the end."""
    low, high = max(seq.prompt_len - 1, 1), len(seq.tokens) - 2
    if high < low:
        return torch.empty(0, dtype=torch.long)
    return torch.randint(low, high + 1, (n,), generator=gen).unique()


def block_attention_mask(num_ctx: int, anchors: torch.Tensor, block: int) -> torch.Tensor:
    """[N*B, num_ctx + N*B] bool: block i's queries see context keys before anchor i, and block i itself."""
    n = len(anchors)
    q_block = torch.arange(n * block) // block
    ctx = torch.arange(num_ctx)[None, :] < anchors[q_block][:, None]
    own = q_block[:, None] == (torch.arange(n * block) // block)[None, :]
    return torch.cat([ctx, own], dim=1)


def loss_weights(block: int, gamma: float) -> torch.Tensor:
    """exp(-(k-1)/gamma) for the masked positions k = 1..B-1."""
    return torch.exp(-(torch.arange(1, block, dtype=torch.float32) - 1) / gamma)


def training_logits(draft: Draft, seq: Sequence, anchors: torch.Tensor, block: int, mask_token_id: int) -> torch.Tensor:
    """Logits [N, B-1, V] of every anchor's block at once; the same math as `Draft.forward`, without a cache."""
    a, n = draft.args, len(anchors)
    num_ctx = int(anchors.max())  # taps up to the last anchor; each block's mask cuts at its own
    ctx = draft.hidden_norm(draft.fc(seq.taps[None, :num_ctx]))
    block_tokens = torch.full((n, block), mask_token_id)
    block_tokens[:, 0] = seq.tokens[anchors]
    x = draft.embed_tokens(block_tokens.reshape(1, -1)) * draft.embed_scale
    block_pos = (anchors[:, None] + torch.arange(block)[None, :]).reshape(-1)
    kv_pos = torch.cat([torch.arange(num_ctx), block_pos])
    mask = block_attention_mask(num_ctx, anchors, block)
    for layer in draft.layers:
        attn, h = layer.self_attn, layer.input_layernorm(x)
        kv_in = torch.cat([ctx, h], dim=1)
        q = attn.q_proj(h).view(1, n * block, a.num_heads, a.head_dim)
        k = attn.k_proj(kv_in).view(1, num_ctx + n * block, a.num_kv_heads, a.head_dim)
        v = attn.v_proj(kv_in).view(1, num_ctx + n * block, a.num_kv_heads, a.head_dim)
        if a.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = apply_rope(q, draft.rope_cos[block_pos], draft.rope_sin[block_pos])
        k = apply_rope(k, draft.rope_cos[kv_pos], draft.rope_sin[kv_pos])
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                           enable_gqa=True)
        x = x + attn.o_proj(y.transpose(1, 2).reshape(1, n * block, a.num_heads * a.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = draft.norm(x).view(n, block, -1)[:, 1:]
    return draft.lm_head(x) * draft.logit_scale


def block_loss(logits: torch.Tensor, seq: Sequence, anchors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Position-weighted cross-entropy; positions past the end of the sequence are ignored."""
    block = weights.shape[0] + 1
    pos = anchors[:, None] + torch.arange(1, block)[None, :]
    valid = pos < len(seq.tokens)
    labels = torch.where(valid, seq.tokens[pos.clamp(max=len(seq.tokens) - 1)], -100)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(labels.shape)
    w = weights[None, :] * valid
    return (ce * w).sum() / w.sum()


def new_draft(target_dir: Path, target: Target, config: TrainConfig) -> tuple[dict, Draft]:
    """An initialised draft (z-lab config + weights) for the target, borrowing its embedding and head."""
    target_config = json.loads((target_dir / "config.json").read_text())
    draft_cfg = builtin.draft_config(target_config, builtin.mask_token_id(target_dir), config.num_layers,
                                     config.block_size)
    weights = builtin.init_draft_weights(draft_cfg, config.seed)
    from transformers import Qwen3Config

    draft = build_draft(Qwen3Config(**draft_cfg), target.args, config.max_seq_len)
    draft.load_state_dict(weights, strict=False)
    draft.embed_tokens.weight = target.embed_tokens.weight
    draft.lm_head.weight = target.lm_head.weight
    for p in (draft.embed_tokens.weight, draft.lm_head.weight):
        p.requires_grad_(False)
    return draft_cfg, draft


def acceptance(target: Target, draft: Draft, prompts: list[list[int]], eos: set[int], config: TrainConfig,
               mask_token_id: int) -> float:
    """tau (tokens per round) of eager greedy DFlash with this draft on `prompts`."""
    with torch.no_grad():
        return pooled_tau([generate_dflash(target, draft, ids, config.max_new_tokens, eos, target.max_seq_len, 64,
                                           config.block_size, mask_token_id) for ids in prompts])


def training_prompts(config: TrainConfig) -> tuple[list[dict], list[dict]]:
    """(held-out rows, training rows). Built-in prompts: training from the `train` split only and
    held-out from `eval`, the split validate and bench measure; a file: its first rows held out."""
    if config.prompts == "builtin":
        return (builtin_prompts(config.heldout, seed=TRAIN_PROMPT_SEED, split="eval"),
                builtin_prompts(config.num_prompts, seed=TRAIN_PROMPT_SEED, split="train"))
    rows = load_prompts(config.prompts, config.num_prompts + config.heldout)
    return rows[:config.heldout], rows[config.heldout:]


@all_cores()
def train_draft(target_dir: Path, out_dir: Path, config: TrainConfig, log=print) -> dict:
    """Train a draft for the target in `target_dir`; write it to `out_dir` in z-lab's layout, with
    `train_draft.json` (held-out tau before/after) and `train_loss.csv`. Returns the report."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank = 0
    if distributed:
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank = torch.distributed.get_rank()
    torch.manual_seed(config.seed)
    target_config = json.loads((target_dir / "config.json").read_text())
    layer_ids = builtin.default_target_layer_ids(target_config["num_hidden_layers"], config.num_layers)
    target = load_target(target_dir, layer_ids, config.max_seq_len)
    draft_cfg, draft = new_draft(target_dir, target, config)
    mask_id = draft_cfg["dflash_config"]["mask_token_id"]
    eos = set(eos_ids(target_dir))

    tok = tokenizer(target_dir)
    heldout_rows, train_rows = training_prompts(config)
    heldout = [encode_chat(tok, r["prompt"]) for r in heldout_rows]
    train_prompts = [encode_chat(tok, r["prompt"]) for r in train_rows]
    t0 = time.perf_counter()
    data = target_sequences(target, train_prompts, config.max_new_tokens, eos)
    log(f"[train_draft] {len(data)} target responses in {time.perf_counter() - t0:.0f} s")
    tau_before = acceptance(target, draft, heldout, eos, config, mask_id)

    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / config.steps)))
    weights = loss_weights(config.block_size, config.gamma)
    gen = torch.Generator().manual_seed(config.seed * 1000 + rank)
    losses = []
    for step in range(config.steps):
        picks = torch.randint(0, len(data), (config.batch,), generator=gen).tolist()
        loss = torch.zeros(())
        for i in picks:
            anchors = sample_anchors(data[i], config.anchors, gen)
            if len(anchors):
                logits = training_logits(draft, data[i], anchors, config.block_size, mask_id)
                loss = loss + block_loss(logits, data[i], anchors, weights) / len(picks)
        opt.zero_grad()
        loss.backward()
        if distributed:  # data parallel: every rank steps with the mean gradient
            for p in params:
                torch.distributed.all_reduce(p.grad)
                p.grad /= torch.distributed.get_world_size()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == config.steps - 1:
            log(f"[train_draft] step {step}: loss {loss.item():.3f}")

    tau_after = acceptance(target, draft, heldout, eos, config, mask_id)
    report = {"steps": config.steps, "final_loss": losses[-1], "heldout_tau_untrained": tau_before,
              "heldout_tau": tau_after, "target_checkpoint_id": checkpoint_id(target_dir),
              "train_sequences": len(data), "seconds": time.perf_counter() - t0,
              "config": asdict(config), "loss_curve": [{"step": i, "loss": v} for i, v in enumerate(losses)]}
    if rank == 0:  # the checkpoint carries its own training report
        builtin.save_draft(out_dir, draft_cfg, draft.state_dict())
        write_csv(out_dir / "train_loss.csv", report["loss_curve"])
        write_json(out_dir / "train_draft.json", {k: v for k, v in report.items() if k != "loss_curve"})
    if distributed:
        torch.distributed.destroy_process_group()
    log(f"[train_draft] held-out tau {tau_before:.2f} -> {tau_after:.2f}")
    return report
