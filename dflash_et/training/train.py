"""Training a DFlash draft for any target, following z-lab's published recipe.

Data are the target's own greedy responses (so the draft learns what the target will say, not
what a dataset says), generated in batches by transformers' `generate`, whose forward passes also
give every position's taps (HF `hidden_states[i + 1]` is layer i's output, as in the target program). Per sequence, anchor positions are sampled; each training block is
`[anchor token, mask x (B-1)]` at the anchor's positions, whose rows see the target taps of the
positions before the anchor and the whole block (bidirectional inside the block, nothing after
it). One step packs every block of every sequence in the batch into one call of the very
`Draft.forward` that is exported, with that visibility as its mask. The loss is cross-entropy on
the B-1 masked positions, position k weighted by exp(-(k-1)/gamma): early positions matter most,
since a block is accepted left to right. The target's embedding and head are borrowed and frozen.
Their cost per block row (vocab x hidden, twice: forward and the input gradient) dominates a step
for real vocabularies, so `compute_budget` caps the steps by multiply-accumulates, not seconds:
the same target gets the same draft on every machine. Loss, learning rate and held-out tau are
logged with DVCLive.

Data-parallel under `torchrun` through DistributedDataParallel (gloo on CPU, NCCL on GPUs):
each rank draws different sequences and anchors; DDP averages the gradients.
"""

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.load import build_draft, checkpoint_id, eos_ids, load_config, load_target
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import (PROMPT_SETS, builtin_prompts, document_texts, load_prompts, text_of,
                                    with_documents)
from dflash_et.files import write_json
from dflash_et.models.draft import Draft
from dflash_et.models.target import Target
from dflash_et.runtime.generate import generate_dflash, pooled_tau
from dflash_et.threads import all_cores

TRAIN_PROMPT_SEED = 4321


@dataclass(frozen=True)
class TrainConfig:
    """The `train_draft` section of params.yaml."""

    steps: int = 2000             # at most; see compute_budget
    compute_budget: float | None = 1.0e14  # multiply-accumulates a run may spend (None: no cap); see planned_steps
    lr: float = 1e-3
    batch: int = 4                # sequences per step (per rank)
    block_size: int = 16
    anchors: int = 16             # anchors sampled per sequence
    gamma: float = 7.0
    num_layers: int = 2
    prompts: str = "builtin"      # builtin | assistant | a JSONL file (see prompts.load_prompts)
    num_prompts: int = 768
    heldout: int = 12             # prompts kept out of training, for the acceptance estimate
    max_new_tokens: int = 48
    generate_batch: int = 16      # prompts per batched generation of the target's replies
    max_seq_len: int = 512        # positions the target and the draft hold while training (stages: export.max_seq_len)
    long_prompts: float = 0.0     # share of the prompts (training and held-out) asked after a document (long_rows)
    mask_token_id: int | None = None  # None: chosen from the tokenizer (see zlab.choose_mask_token)
    embed_scale: float | None = None  # model.draft_embed_scale: None, the target's own (see zlab.DraftSettings)
    sliding_window: int | None = None  # every draft layer attends this far back (zlab.DraftSettings.context_window)
    variant: str = "dflash"       # dflash | dflash2 (DFLASH2's parts, its selector trained with the draft)
    seed: int = 0


# A new DFlash2 draft's parts: z-lab's released Qwen3.6-27B-DFlash2 config (conv 2 rows, groups of 16 channels,
# a rank-256 selector over the top 16 candidates)
DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


@dataclass
class Sequence:
    tokens: torch.Tensor          # [L] prompt + the target's greedy response
    taps: torch.Tensor            # [L-1 or L, k*H] the target's taps (the last token's is never seen: no
    prompt_len: int               # anchor lies past it, and generation never feeds it)


@dataclass
class Batch:
    """Every block of several sequences, packed into one `Draft.forward` call."""

    tokens: torch.Tensor          # [1, R] block rows: anchor token, then masks
    hidden: torch.Tensor          # [1, C, k*H] the sequences' taps, one after another
    ctx_pos: torch.Tensor         # [C] each tap's position in its own sequence
    block_pos: torch.Tensor       # [R] each block row's position in its own sequence
    mask: torch.Tensor            # [R, C + R] what each row may see
    labels: torch.Tensor          # [R] the token each row should predict (-100: none)
    weights: torch.Tensor         # [R] loss weight of each row
    before: torch.Tensor          # [R] the token before each row's label (the anchor, then the labels): DFlash2


def target_sequences(target_dir: Path, layer_ids: list[int], prompts: list[list[int]], max_new_tokens: int,
                     eos: set[int], batch: int = 16) -> list[Sequence]:
    """The target's own greedy continuation of each prompt, with its taps, through transformers' `generate`
    on `batch` prompts at a time (left-padded; prompts sorted by length, so little is padding). The
    forward passes that generate a reply also give the taps of every position before its last token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    pad = next(iter(sorted(eos)), 0)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: dict[int, Sequence] = {}
    with torch.no_grad(), tqdm(total=len(prompts), desc="[train_draft] target replies", unit="reply") as bar:
        for first in range(0, len(order), batch):
            picks = order[first:first + batch]
            width = max(len(prompts[i]) for i in picks)
            ids = torch.full((len(picks), width), pad)
            attention = torch.zeros(len(picks), width, dtype=torch.long)
            for row, i in enumerate(picks):
                ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
                attention[row, width - len(prompts[i]):] = 1
            gen = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=sorted(eos) or None, pad_token_id=pad,
                                 output_hidden_states=True, return_dict_in_generate=True)
            # per step, [1 + layers] hidden states of the tokens it fed: the prompt, then one token each
            steps = [torch.cat([h[i + 1] for i in layer_ids], dim=-1) for h in gen.hidden_states]
            fed = torch.cat(steps, dim=1)  # [B, width + steps - 1, k*H]
            for row, i in enumerate(picks):
                reply = gen.sequences[row, width:].tolist()
                reply = next((reply[:j + 1] for j, t in enumerate(reply) if t in eos), reply)
                tokens = torch.tensor(prompts[i] + reply)
                taps = fed[row, width - len(prompts[i]):width - len(prompts[i]) + len(tokens)]
                out[i] = Sequence(tokens, taps.clone(), len(prompts[i]))
            bar.update(len(picks))
    return [out[i] for i in range(len(prompts))]


def sample_anchors(seq: Sequence, n: int, gen: torch.Generator) -> torch.Tensor:
    """Anchor positions where decoding actually happens: from the last prompt token to the one before the end."""
    low, high = max(seq.prompt_len - 1, 1), len(seq.tokens) - 2
    if high < low:
        return torch.empty(0, dtype=torch.long)
    return torch.randint(low, high + 1, (n,), generator=gen).unique()


def loss_weights(block: int, gamma: float) -> torch.Tensor:
    """exp(-(k-1)/gamma) for the masked positions k = 1..B-1."""
    return torch.exp(-(torch.arange(1, block, dtype=torch.float32) - 1) / gamma)


def read_span(anchors: torch.Tensor, window: int | None) -> tuple[int, int]:
    """The taps a sequence's blocks read: those before its last anchor, and, under a context `window`, no older
    than its first anchor's window. Packing only these keeps a long prompt's step as cheap as a short one's."""
    if not len(anchors):
        return 0, 0
    low = 0 if window is None else max(int(anchors.min()) - window + 1, 0)
    return low, int(anchors.max())


def pack(seqs: list[Sequence], anchors: list[torch.Tensor], block: int, mask_token_id: int, gamma: float,
         window: int | None = None) -> Batch:
    """One batch of blocks: a row of anchor i of sequence s sees the taps of s before the anchor and block i
    (within `window` of it: the draft's `context_window`; only the taps some row reads are packed)."""
    spans = [read_span(a, window) for a in anchors]
    ctx_seq = torch.cat([torch.full((high - low,), i) for i, (low, high) in enumerate(spans)])
    ctx_pos = torch.cat([torch.arange(low, high) for low, high in spans])
    rows = [(i, a) for i, a_s in enumerate(anchors) for a in a_s.tolist()]
    row_seq = torch.tensor([i for i, _ in rows]).repeat_interleave(block)
    row_anchor = torch.tensor([a for _, a in rows]).repeat_interleave(block)
    row_block = torch.arange(len(rows)).repeat_interleave(block)
    offset = torch.arange(block).repeat(len(rows))
    sees_ctx = (ctx_seq[None, :] == row_seq[:, None]) & (ctx_pos[None, :] < row_anchor[:, None])
    sees_block = row_block[:, None] == row_block[None, :]
    tokens = torch.full((len(rows) * block,), mask_token_id)
    labels = torch.full((len(rows) * block,), -100)
    for r, (i, a) in enumerate(rows):
        seq = seqs[i].tokens
        tokens[r * block] = seq[a]
        end = min(a + block, len(seq))
        labels[r * block + 1:r * block + 1 + end - a - 1] = seq[a + 1:end]
    weights = torch.cat([torch.zeros(1), loss_weights(block, gamma)]).repeat(len(rows)) * (labels >= 0)
    hidden = torch.cat([s.taps[low:high] for s, (low, high) in zip(seqs, spans)])
    before = torch.where(offset == 1, tokens.roll(1), labels.roll(1)).clamp(min=0)  # row 0 and past-the-end: unused
    return Batch(tokens[None], hidden[None], ctx_pos, row_anchor + offset,
                 torch.cat([sees_ctx, sees_block], dim=1), labels, weights, before)


def batch_loss(draft: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Position-weighted cross-entropy of the draft's predictions for every masked row of the batch. Only
    rows with a weight get logits: anchors and rows past a reply's end skip the head.

    A DFlash2 draft adds its selector's cross-entropy over each row's top-k candidates, scored after the true
    predecessor (teacher forcing), with the same weights and denominator: the objective of the public
    reproductions (SpecForge, vLLM speculators, NeMo; z-lab publishes none). A row whose label is not among its
    candidates adds nothing to it: the selector cannot choose it, the token loss must bring it in."""
    rows = batch.weights.nonzero().squeeze(1)
    out = draft(batch.tokens, batch.hidden, batch.ctx_pos, batch.block_pos, batch.mask, rows, batch.before[rows])
    dflash2 = isinstance(out, tuple)
    logits = (out[0] if dflash2 else out).squeeze(0)
    labels, weights = batch.labels[rows], batch.weights[rows]
    total = (F.cross_entropy(logits, labels, reduction="none") * weights).sum()
    if dflash2:
        candidates, scores = out[1], out[2]
        hit = candidates == labels[:, None]
        chosen = F.cross_entropy(scores, hit.int().argmax(-1), reduction="none")
        total = total + (chosen * weights * hit.any(-1)).sum()
    return total / weights.sum().clamp(min=1e-9)


def new_draft(target_dir: Path, target: Target, config: TrainConfig) -> tuple[dict, Draft]:
    """An initialised draft (z-lab config + weights) for the target, borrowing its frozen embedding and head."""
    target_config = json.loads((target_dir / "config.json").read_text())
    mask = config.mask_token_id
    if mask is None:
        mask = zlab.choose_mask_token(target_dir, target.args.vocab_size, eos_ids(target_dir))
    draft_cfg = zlab.draft_config(target_config, mask, config.num_layers, config.block_size)
    if config.embed_scale is not None:
        draft_cfg["dflash_config"]["embed_scale"] = float(config.embed_scale)
    if config.sliding_window is not None:  # z-lab's key; training's block masks then honour it (models.attention)
        draft_cfg["dflash_config"]["sliding_window_size"] = config.sliding_window
    if config.variant not in zlab.ARCHITECTURES:
        raise ValueError(f"train_draft.variant={config.variant!r} is not one of {', '.join(zlab.ARCHITECTURES)}")
    if config.variant == "dflash2":
        if draft_cfg["hidden_size"] % DFLASH2["conv_group_size"]:
            raise ValueError(f"train_draft.variant=dflash2 convolves groups of {DFLASH2['conv_group_size']} channels, "
                             f"which do not divide the target's hidden size {draft_cfg['hidden_size']}; use dflash")
        draft_cfg["dflash_config"] |= DFLASH2
        draft_cfg["architectures"] = [zlab.ARCHITECTURES["dflash2"]]
    from transformers import Qwen3Config

    draft = build_draft(Qwen3Config(**draft_cfg), target.args, config.max_seq_len)
    draft.load_state_dict(zlab.draft_weight_names(zlab.init_draft_weights(draft_cfg, config.seed)), strict=False)
    zlab.borrow(draft, target)
    for p in (draft.embed_tokens.weight, draft.lm_head.weight):
        p.requires_grad_(False)
    return draft_cfg, draft


def acceptance(target: Target, draft: Draft, prompts: list[list[int]], eos: set[int], config: TrainConfig,
               mask_token_id: int, label: str) -> float:
    """tau (tokens per round) of eager greedy DFlash with this draft on `prompts`."""
    with torch.no_grad():
        return pooled_tau([generate_dflash(target, draft, ids, config.max_new_tokens, eos, target.max_seq_len, 64,
                                           config.block_size, mask_token_id)
                           for ids in tqdm(prompts, desc=f"[train_draft] held-out tau, {label}", unit="prompt")])


def step_macs(config: TrainConfig, draft: Draft) -> float:
    """Multiply-accumulates of one training step, at most: per block row, the frozen head forward and its
    input gradient (2 x vocab x hidden; rows without a loss skip it) and, forward and backward (3 x), every
    product with the draft's own weights: each parameter multiplies once per row (Linears, norms, and a DFlash2
    convolution's base kernel, whose 2 x K x H entries are its two convolutions' K products per channel: the
    input-dependent kernel is added to the base, not multiplied), except the selector's codebooks, rows looked
    up, not multiplied (2 x vocab x rank entries, more than the rest of the draft for a real vocabulary). The
    selector instead multiplies rank x (top-k + 1) per row (`selector_macs`). Attention's scores and values grow
    with the context, not the rows, and stay out of the count, for both variants."""
    rows = config.batch * config.anchors * config.block_size
    head = draft.lm_head.weight.numel()
    own = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    looked_up = sum(m.weight.numel() for m in draft.modules() if isinstance(m, nn.Embedding) and m.weight.requires_grad)
    return rows * (2 * head + 3 * (own - looked_up + selector_macs(draft)))


def selector_macs(draft: Draft) -> int:
    """A DFlash2 selector's products per row in training (CandidateSelector.teacher_forced), beyond its hidden
    projection (a Linear, counted as a weight): the predecessor's code times the projected hidden state (rank),
    then that against each of the top-k candidates' codes (rank x top-k). 0 for a DFlash draft."""
    selector = getattr(draft, "candidate_selector", None)
    return 0 if selector is None else selector.hidden_projection.out_features * (selector.top_k + 1)


def planned_steps(config: TrainConfig, draft: Draft) -> int:
    """`steps`, or fewer when `compute_budget` runs out first: a budget in operations, not seconds, so a
    target gets the same draft on every machine."""
    if config.compute_budget is None:
        return config.steps
    return max(1, min(config.steps, int(config.compute_budget // step_macs(config, draft))))


def training_prompts(config: TrainConfig) -> tuple[list[dict], list[dict]]:
    """(held-out rows, training rows). The project's prompt sets: training from the `train` split only and
    held-out from `eval`, the split validate and bench measure; a file: its first rows held out."""
    if config.prompts == "builtin":
        return (builtin_prompts(config.heldout, seed=TRAIN_PROMPT_SEED, split="eval"),
                builtin_prompts(config.num_prompts, seed=TRAIN_PROMPT_SEED, split="train"))
    if config.prompts in PROMPT_SETS:
        return (load_prompts(config.prompts, config.heldout, split="eval"),
                load_prompts(config.prompts, config.num_prompts, split="train"))
    rows = load_prompts(config.prompts, config.num_prompts + config.heldout)
    return rows[:config.heldout], rows[config.heldout:]


def long_rows(row_sets: list[list[dict]], share: float, texts: list[str], room: int, count) -> list[list[dict]]:
    """Each list of `row_sets`, `share` of its rows (evenly spread) asked after a document of `texts` as the bench's
    `long` prompts are (prompts.with_documents, one call for all the lists: each text counted once), their
    lengths in tokens (`count`) rising evenly to `room` in each list, each document starting at another text. A
    draft trained on short prompts alone stops accepting after a long one, even one the target answers as it
    would a short one (docs/measurements.md#long-context)."""
    picks = [[i for i in range(len(rows)) if int((i + 1) * share) > int(i * share)] for rows in row_sets]
    lengths = [room * (j + 1) // len(picked) for picked in picks for j in range(len(picked))]
    asked = iter(with_documents([rows[i]["prompt"] for rows, picked in zip(row_sets, picks) for i in picked],
                                texts, lengths, count, rotate=True))
    out = []
    for rows, picked in zip(row_sets, picks):
        out.append(list(rows))
        for i in picked:
            out[-1][i] = {**rows[i], "prompt": next(asked)}
    return out


def with_long_rows(config: TrainConfig, heldout: list[dict], train: list[dict], count) -> tuple[list[dict], list[dict]]:
    """`training_prompts`' rows with `config.long_prompts` of each asked after a document filling up to what
    `max_seq_len` leaves for the reply, of the set's train-split texts (prompts.document_texts; a file's: its
    training rows', so that no held-out question is in a document)."""
    if not 0 <= config.long_prompts <= 1:
        raise ValueError(f"train_draft.long_prompts={config.long_prompts} is a share of the prompts: give 0 to 1")
    if not config.long_prompts:
        return heldout, train
    room = config.max_seq_len - config.max_new_tokens
    texts = (document_texts(config.prompts, room) if config.prompts in PROMPT_SETS
             else [text_of(r["prompt"]) for r in train])
    heldout, train = long_rows([heldout, train], config.long_prompts, texts, room, count)
    return heldout, train


def _fitting(prompts: list[list[int]], config: TrainConfig, name: str, log) -> list[list[int]]:
    """The prompts that leave room for a reply within `max_seq_len` (export.max_seq_len): the programs can decode
    no longer one, so the draft need not learn it; none left is refused in one line."""
    fits = [ids for ids in prompts if len(ids) + config.max_new_tokens <= config.max_seq_len]
    if not fits:
        raise ValueError(f"no {name} prompt of train_draft.prompts={config.prompts} fits export.max_seq_len="
                         f"{config.max_seq_len} with a {config.max_new_tokens}-token reply; raise export.max_seq_len "
                         "or use shorter prompts")
    if len(fits) < len(prompts):
        log(f"[train_draft] {len(prompts) - len(fits)} of {len(prompts)} {name} prompts left out: longer than "
            f"export.max_seq_len={config.max_seq_len} leaves room for with a {config.max_new_tokens}-token reply")
    return fits


def _check_mask_token(target_dir: Path, mask: int, vocab_size: int) -> None:
    if not 0 <= mask < vocab_size:
        raise ValueError(f"train_draft.mask_token_id={mask} is outside the target {target_dir}'s {vocab_size} "
                         "embedding rows; pick one inside, or null to choose it from the tokenizer")


@all_cores()
def train_draft(target_dir: Path, out_dir: Path, config: TrainConfig, log=print, live_dir: Path | None = None) -> dict:
    """Train a draft for the target in `target_dir`; write it to `out_dir` in z-lab's layout, with
    `train_draft.json` (held-out tau before/after, the target's fingerprint). DVCLive logs loss, learning
    rate and held-out tau to `live_dir` (default `out_dir/dvclive`; the pipeline's: reports/train_draft).
    Under torchrun every rank writes the same draft to its `out_dir`. Returns the report."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank = 0
    if distributed:
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank = torch.distributed.get_rank()
    try:
        return _train(target_dir, out_dir, config, rank, distributed, log, live_dir or out_dir / "dvclive")
    finally:
        if distributed:
            torch.distributed.destroy_process_group()


def _fit(draft: Draft, data: list[Sequence], config: TrainConfig, steps: int, mask_id: int, rank: int,
         distributed: bool, live) -> list[float]:
    """`steps` AdamW steps of the draft on batches drawn from `data` (learning rate: 20 steps of warmup, then a
    cosine to 0); returns each step's loss, which rank 0 logs with the learning rate to `live` (DVCLive)."""
    model = draft
    if distributed:  # every rank steps with the mean gradient; the caches are not model state
        model = torch.nn.parallel.DistributedDataParallel(draft, broadcast_buffers=False)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    gen = torch.Generator().manual_seed(config.seed * 1000 + rank)
    losses = []
    for step in tqdm(range(steps), desc="[train_draft] training", unit="step", disable=rank != 0):
        picks = [data[i] for i in torch.randint(0, len(data), (config.batch,), generator=gen).tolist()]
        batch = pack(picks, [sample_anchors(s, config.anchors, gen) for s in picks], config.block_size, mask_id,
                     config.gamma, draft.context_window)
        loss = batch_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if live:
            live.log_metric("loss", losses[-1])
            live.log_metric("lr", schedule.get_last_lr()[0])
            live.next_step()
    return losses


def _train(target_dir: Path, out_dir: Path, config: TrainConfig, rank: int, distributed: bool, log,
           live_dir: Path) -> dict:
    from dvclive import Live

    torch.manual_seed(config.seed)
    num_layers = load_config(target_dir).num_hidden_layers
    target = load_target(target_dir, zlab.default_target_layer_ids(num_layers, config.num_layers), config.max_seq_len)
    if config.mask_token_id is not None:
        _check_mask_token(target_dir, config.mask_token_id, target.args.vocab_size)
    draft_cfg, draft = new_draft(target_dir, target, config)
    mask_id = draft_cfg["dflash_config"]["mask_token_id"]
    eos = set(eos_ids(target_dir))

    tok = tokenizer(target_dir)
    heldout_rows, train_rows = with_long_rows(config, *training_prompts(config), lambda p: len(encode_chat(tok, p)))
    heldout = _fitting([encode_chat(tok, r["prompt"]) for r in heldout_rows], config, "held-out", log)
    train_prompts = _fitting([encode_chat(tok, r["prompt"]) for r in train_rows], config, "training", log)
    t0 = time.perf_counter()
    data = target_sequences(target_dir, target.layer_ids, train_prompts, config.max_new_tokens, eos,
                            config.generate_batch)
    log(f"[train_draft] {len(data)} target responses in {time.perf_counter() - t0:.0f} s (mask token {mask_id})")
    tau_before = acceptance(target, draft, heldout, eos, config, mask_id, "untrained")
    steps = planned_steps(config, draft)
    log(f"[train_draft] {steps} steps of {step_macs(config, draft):.2e} MACs"
        + (f" (compute_budget {config.compute_budget:.2e})" if steps < config.steps else ""))

    live = Live(str(live_dir), save_dvc_exp=False, dvcyaml=None) if rank == 0 else None
    losses = _fit(draft, data, config, steps, mask_id, rank, distributed, live)

    tau_after = acceptance(target, draft, heldout, eos, config, mask_id, "trained")
    log(f"[train_draft] held-out tau {tau_before:.2f} -> {tau_after:.2f} ({time.perf_counter() - t0:.0f} s)")
    report = {"steps": steps, "final_loss": losses[-1], "heldout_tau_untrained": tau_before,
              "heldout_tau": tau_after, "target_checkpoint_id": checkpoint_id(target_dir),
              "train_sequences": len(data), "mask_token_id": mask_id, "config": asdict(config)}
    if live:  # the run's summary (metrics.json): what `dvc exp show` lists as train_draft's metrics
        for key in ("heldout_tau_untrained", "heldout_tau", "final_loss", "steps", "train_sequences"):
            live.summary[key] = report[key]
        live.end()
    # the checkpoint carries its own training report; timings only go to the log
    zlab.save_draft(out_dir, draft_cfg, draft.state_dict())
    write_json(out_dir / "train_draft.json", report)
    return report
