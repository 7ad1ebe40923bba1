"""Training a DFlash draft for any target, following z-lab's published recipe, on the CPU or a GPU.

Data are the target's own greedy responses (training.data: so the draft learns what the target will say, not
what a dataset says), to the project's prompts and, with `synthetic_prompts`, to prompts the target writes
itself (training.synthesize). Each step packs blocks of anchors in the replies into one call of the very
`Draft` that is exported (its `packed` method, the layers of `forward`), with the visibility each row has in
decoding as its mask (training.blocks).
The target's embedding and head are borrowed and frozen.
Their cost per block row (vocab x hidden, twice: forward and the input gradient) dominates a step
for real vocabularies, so `compute_budget` caps the steps by multiply-accumulates, not seconds:
the same target gets the same draft on every machine; `minutes` caps a run by the clock instead (a GPU lease
is time). Loss, learning rate and held-out tau are logged with DVCLive where it is installed, and held-out tau
against the rows trained goes into the draft's card (train_draft.json).

On a GPU (`device`: auto or cuda) the same code runs with the replies' taps resident on the device, bf16
autocast, and no host synchronisation per step (losses are read every LOG_EVERY steps); the held-out tau is
measured on the host, by the eager reference decoding. Data-parallel under `torchrun` through
DistributedDataParallel (gloo on CPU, NCCL on GPUs): each rank draws different sequences and anchors; DDP
averages the gradients.

(Over 300 lines: the run's phases, data, fit, evaluation and the card, share one clock, config and log, and run
once each, in order; split into modules, each would take most of them as arguments.)
"""

import copy
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.load import build_draft, checkpoint_id, eos_ids, load_config, load_target
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.emitted import write_counts
from dflash_et.data.prompts import text_of
from dflash_et.files import write_json
from dflash_et.models.draft import DFlash2Draft, Draft
from dflash_et.models.target import Target
from dflash_et.runtime.generate import generate_dflash, pooled_tau
from dflash_et.threads import all_cores
from dflash_et.training.blocks import draft_loss, pack, sample_anchors
from dflash_et.training.config import TrainConfig, training_device
from dflash_et.training.data import (Sequence, fitting, is_measured, reply_model, target_sequences, training_prompts,
                                     with_long_rows)
from dflash_et.training.synthesize import synthesize_prompts, user_turn

LOG_EVERY = 50  # steps between reading the losses back from the device (each read waits for the device)
CALIBRATE = 5   # and after this step, for a first rate of steps against the clock

# A new DFlash2 draft's parts: z-lab's released Qwen3.6-27B-DFlash2 config (conv 2 rows, groups of 16 channels,
# a rank-256 selector over the top 16 candidates)
DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


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
    if not isinstance(draft, DFlash2Draft):
        return 0
    selector = draft.candidate_selector
    return selector.hidden_projection.out_features * (selector.top_k + 1)


def planned_steps(config: TrainConfig, draft: Draft) -> int:
    """`steps`, or fewer when `compute_budget` runs out first: a budget in operations, not seconds, so a
    target gets the same draft on every machine."""
    if config.compute_budget is None:
        return config.steps
    return max(1, min(config.steps, int(config.compute_budget // step_macs(config, draft))))


def _check_mask_token(target_dir: Path, mask: int | None, vocab_size: int) -> None:
    """A mask token given in train_draft (None: the tokenizer's choice) must be one of the target's embedding rows."""
    if mask is not None and not 0 <= mask < vocab_size:
        raise ValueError(f"train_draft.mask_token_id={mask} is outside the target {target_dir}'s {vocab_size} "
                         "embedding rows; pick one inside, or null to choose it from the tokenizer")


@all_cores()
def train_draft(target_dir: Path, out_dir: Path, config: TrainConfig, log=print, live_dir: Path | None = None) -> dict:
    """Train a draft for the target in `target_dir`; write it to `out_dir` in z-lab's layout, with its card
    `train_draft.json` (data counts, steps, loss and held-out tau against rows trained, the target's fingerprint:
    nothing that changes from run to run, since the pipeline's draft directory is a dependency). DVCLive, where
    installed, logs loss, learning rate and held-out tau to `live_dir` (default `out_dir/dvclive`; the pipeline's:
    reports/train_draft). Under torchrun every rank writes the same draft to its `out_dir`. Returns the card plus
    `timings` (seconds per phase, throughput, device), which `dflash train-draft` adds to its own card."""
    device = training_device(config)  # a device that is not there is refused before anything runs
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank = 0
    if distributed:
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank = torch.distributed.get_rank()
    try:
        return _train(target_dir, out_dir, config, device, rank, distributed, log, live_dir or out_dir / "dvclive")
    finally:
        if distributed:
            torch.distributed.destroy_process_group()


class Clock:
    """A run's wall clock: seconds per phase, and what `minutes` leaves."""

    def __init__(self, minutes: float | None):
        self.start = time.perf_counter()
        self.deadline = None if minutes is None else self.start + 60 * minutes
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, since: float) -> float:
        """Charge the time since `since` to `phase`; returns now."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - since
        return now

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def until(self, share: float) -> float | None:
        """When `share` of the run's minutes will have passed (None without a limit): where a data phase stops."""
        return None if self.deadline is None else self.start + share * (self.deadline - self.start)


@dataclass
class Fitted:
    losses: list[float]
    rows: int                     # block rows trained on (the draft's training tokens)
    curve: list[dict]             # held-out tau measured during training: step, rows, loss, heldout_tau


def _fit(trainee: Draft, data: list[Sequence], config: TrainConfig, steps: int, mask_id: int, rank: int,
         distributed: bool, live, clock: Clock, reserve: float, evaluate) -> Fitted:
    """At most `steps` AdamW steps of the draft on batches drawn from `data` (learning rate: 20 steps of warmup,
    then a cosine to 0 at the last step); with a deadline, the last step is brought forward so that the run ends
    in time with `reserve` seconds left (an evaluation's), the cosine with it. `evaluate()` (held-out tau) runs
    `config.curve_points` times, evenly spread. Losses are read back every LOG_EVERY steps, when rank 0 logs them
    and the learning rates to `live` (DVCLive)."""
    device = next(trainee.parameters()).device
    model = draft_loss(trainee)
    if distributed:  # every rank steps with the mean gradient; the caches are not model state
        model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    params = [p for p in trainee.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0, fused=device.type == "cuda" or None)
    horizon = steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, horizon) / horizon)))
    gen = torch.Generator().manual_seed(config.seed * 1000 + rank)
    fitted, pending, rates, trained_s, eval_s = Fitted([], 0, []), [], [], 0.0, reserve
    bar = tqdm(total=steps, desc="[train_draft] training", unit="step", disable=rank != 0)
    step, since = 0, time.perf_counter()
    while step < horizon:
        picks = [data[i] for i in torch.randint(0, len(data), (config.batch,), generator=gen).tolist()]
        batch = pack(picks, [sample_anchors(s, config.anchors, gen) for s in picks], config.block_size, mask_id,
                     config.gamma, trainee.context_window)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        rates.append(schedule.get_last_lr()[0])
        schedule.step()
        pending.append(loss.detach())
        fitted.rows += batch.tokens.shape[1]
        step += 1
        bar.update()
        point = len(fitted.curve) < config.curve_points and step >= horizon * (len(fitted.curve) + 1) / (
            config.curve_points + 1)
        if len(pending) < LOG_EVERY and step not in (horizon, CALIBRATE) and not point:
            continue
        for value, lr in zip(torch.stack(pending).tolist(), rates):  # the one wait for the device
            fitted.losses.append(value)
            if live:
                live.log_metric("loss", value)
                live.log_metric("lr", lr)
                live.next_step()
        pending, rates = [], []
        since, trained_s = time.perf_counter(), trained_s + clock.add("training", since) - since
        if point:
            tau = evaluate()
            fitted.curve.append({"step": step, "rows": fitted.rows, "loss": fitted.losses[-1], "heldout_tau": tau})
            since, eval_s = time.perf_counter(), time.perf_counter() - since
        if clock.deadline is not None:  # the steps the clock leaves, at this rate, after the evaluations still due
            left = clock.left() - reserve - eval_s * (config.curve_points - len(fitted.curve))
            horizon = _agreed(max(step, min(steps, step + int(left / (trained_s / step)))), device, distributed)
            bar.total = horizon
    bar.close()
    clock.add("training", since)
    return fitted


def _agreed(horizon: int, device: torch.device, distributed: bool) -> int:
    """Under torchrun, the earliest last step any rank's clock allows, so that every rank stops at the same step."""
    if not distributed:
        return horizon
    agreed = torch.tensor([horizon], device=device)
    torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
    return int(agreed)


def _prompts(config: TrainConfig, tok, model, device: torch.device, log, deadline: float | None = None
             ) -> tuple[list[dict], list[dict], dict]:
    """(held-out rows, training rows, their counts): the prompt set's, then `synthetic_prompts` the target writes
    itself (none, in one logged line, when it has no chat template; no batch of them starts after `deadline`), then
    long rows as `long_prompts` asks."""
    heldout, train = training_prompts(config)
    synthetic = []
    if config.synthetic_prompts and user_turn(tok) is None:
        log(f"[train_draft] the target has no chat template to write its own prompts with: training on "
            f"train_draft.prompts={config.prompts} alone")
    elif config.synthetic_prompts:
        measured = is_measured(config)
        written = synthesize_prompts(model, tok, config.synthetic_prompts, config.seed, batch=config.generate_batch,
                                     exclude=[text_of(r["prompt"]) for r in heldout], device=device, log=log,
                                     deadline=deadline)
        synthetic = [r for r in written if not measured(r["prompt"])]
        if len(synthetic) < len(written):
            log(f"[train_draft] {len(written) - len(synthetic)} prompts the target wrote are measured prompts "
                "(validate's and bench's eval split): left out")
    counts = {"set": len(train), "synthetic": len(synthetic), "heldout": len(heldout),
              "synthetic_examples": [r["prompt"] for r in synthetic[:5]]}
    heldout, train = with_long_rows(config, heldout, train + synthetic, lambda p: len(encode_chat(tok, p)))
    return heldout, train, counts


def _card(config: TrainConfig, target_dir: Path, data: list[Sequence], mask_id: int, counts: dict, heldout: int,
          fitted: Fitted, tau_before: float, tau_after: float) -> dict:
    """The draft's card (train_draft.json): what it was trained on, and held-out tau before, during and after."""
    reply_tokens = sum(len(s.tokens) - s.prompt_len for s in data)
    return {"steps": len(fitted.losses), "final_loss": fitted.losses[-1], "heldout_tau_untrained": tau_before,
            "heldout_tau": tau_after, "target_checkpoint_id": checkpoint_id(target_dir),
            "train_sequences": len(data), "mask_token_id": mask_id,
            "data": {"prompts": counts, "sequences": len(data), "reply_tokens": reply_tokens,
                     "heldout_prompts": heldout},
            "curve": [{"step": 0, "rows": 0, "loss": None, "heldout_tau": tau_before}, *fitted.curve,
                      {"step": len(fitted.losses), "rows": fitted.rows, "loss": fitted.losses[-1],
                       "heldout_tau": tau_after}],
            "config": asdict(config)}


def _train(target_dir: Path, out_dir: Path, config: TrainConfig, device: torch.device, rank: int, distributed: bool,
           log, live_dir: Path) -> dict:
    clock = Clock(config.minutes)
    torch.manual_seed(config.seed)
    layers = zlab.default_target_layer_ids(load_config(target_dir).num_hidden_layers, config.num_layers)
    target = load_target(target_dir, layers, config.max_seq_len)
    _check_mask_token(target_dir, config.mask_token_id, target.args.vocab_size)
    draft_cfg, draft = new_draft(target_dir, target, config)
    mask_id = draft_cfg["dflash_config"]["mask_token_id"]
    eos, tok, model = set(eos_ids(target_dir)), tokenizer(target_dir), reply_model(target_dir, device)
    since = clock.add("loading", clock.start)
    # with `minutes`, the data phases stop starting batches at a fifth and at half of the run: training gets the rest
    heldout_rows, train_rows, counts = _prompts(config, tok, model, device, log, clock.until(0.2))
    heldout = fitting([encode_chat(tok, r["prompt"]) for r in heldout_rows], config, "held-out", log)
    train_prompts = fitting([encode_chat(tok, r["prompt"]) for r in train_rows], config, "training", log)
    since = clock.add("synthesis", since)
    data = target_sequences(model, target.layer_ids, train_prompts, config.max_new_tokens, eos, config.generate_batch,
                            torch.bfloat16 if device.type == "cuda" else torch.float32, clock.until(0.5), log)
    del model
    since = clock.add("replies", since)
    reply_tokens = sum(len(s.tokens) - s.prompt_len for s in data)
    log(f"[train_draft] {len(data)} target responses ({reply_tokens} tokens, "
        f"{reply_tokens / clock.seconds['replies']:.0f} tokens/s on {device}; mask token {mask_id})")
    tau_before = acceptance(target, draft, heldout, eos, config, mask_id, "untrained")
    since = clock.add("evaluation", since)
    steps = planned_steps(config, draft)
    budget = f" (compute_budget {config.compute_budget:.2e})" if steps < config.steps else ""
    log(f"[train_draft] {steps} steps of {step_macs(config, draft):.2e} MACs{budget}"
        + (f", or fewer: {config.minutes:.1f} minutes in all" if config.minutes is not None else ""))
    trainee = draft if device.type == "cpu" else copy.deepcopy(draft).to(device)

    def evaluate() -> float:  # on the host, by the reference decoding, with the weights trained so far
        started = time.perf_counter()
        if trainee is not draft:  # its own weights only: the borrowed head and embedding never change
            draft.load_state_dict({k: v for k, v in trainee.state_dict().items() if k not in zlab.BORROWED},
                                  strict=False)
        tau = acceptance(target, draft, heldout, eos, config, mask_id, "training")
        clock.add("evaluation", started)
        return tau

    live = _live(live_dir) if rank == 0 else None
    fitted = _fit(trainee, data, config, steps, mask_id, rank, distributed, live, clock, clock.seconds["evaluation"],
                  evaluate)
    tau_after = evaluate()
    log(f"[train_draft] held-out tau {tau_before:.2f} -> {tau_after:.2f} after {len(fitted.losses)} steps "
        f"({fitted.rows / clock.seconds['training']:.0f} block rows/s; {time.perf_counter() - clock.start:.0f} s)")
    report = _card(config, target_dir, data, mask_id, counts, len(heldout), fitted, tau_before, tau_after)
    if live:  # the run's summary (metrics.json): what `dvc exp show` lists as train_draft's metrics
        for key in ("heldout_tau_untrained", "heldout_tau", "final_loss", "steps", "train_sequences"):
            live.summary[key] = report[key]
        live.end()
    since = time.perf_counter()
    zlab.save_draft(out_dir, draft_cfg, draft.state_dict())
    write_counts(out_dir, [s.tokens[s.prompt_len:].tolist() for s in data])  # for export.draft_vocab
    write_json(out_dir / "train_draft.json", report)  # the card; the clock's figures only in what is returned
    clock.add("saving", since)
    seconds = {k: round(v, 2) for k, v in clock.seconds.items()} | {"total": round(time.perf_counter() - clock.start, 2)}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return report | {"timings": {"seconds": seconds, "device": f"{device} ({name})", "reply_tokens_per_s": round(
        reply_tokens / clock.seconds["replies"], 1), "block_rows_per_s": round(fitted.rows / clock.seconds["training"], 1)}}


def _live(live_dir: Path):
    """DVCLive's logger, or None where it is not installed (a bare GPU machine: the card keeps the curve)."""
    try:
        from dvclive import Live
    except ImportError:
        return None
    return Live(str(live_dir), save_dvc_exp=False, dvcyaml=None)
