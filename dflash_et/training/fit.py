"""A draft's optimizer loop: AdamW steps on packed blocks of the target's replies, 20 steps of warmup then a cosine
to 0 at the last planned step, under a wall clock; and, in a campaign (`--resume DIR`), the checkpoints a later run
continues from.

Without a campaign, a run's `minutes` bring the last step forward so that it ends in time (the cosine with it). In a
campaign the schedule is the campaign's (`steps` in all, over every session): a session's clock only stops it,
and the next session resumes at the same step, with the same optimizer moments and batch sampler.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm import tqdm

from dflash_et.models.draft import Draft
from dflash_et.training.blocks import draft_loss, pack, sample_anchors
from dflash_et.training.config import TrainConfig
from dflash_et.training.data import Sequence
from dflash_et.training.state import Progress, best_of, keep_best, restore, trainer_tensors

LOG_EVERY = 50  # steps between reading the losses back from the device (each read waits for the device)
CALIBRATE = 5   # and after this step, for a first rate of steps against the clock


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


def learning_rate(base: float, step: int, horizon: int) -> float:
    """The rate of step `step` (from 0) of `horizon`: a linear warmup over 20 steps, then a cosine to 0."""
    return base * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(step, horizon) / horizon))


@dataclass
class Loop:
    """What the loop runs beside the draft and its data: where it reports, and, in a campaign, what it resumes
    from and how it saves."""

    rank: int = 0
    distributed: bool = False
    live: object = None                             # DVCLive's logger (rank 0), or None
    measure: Callable[[], float] | None = None      # held-out block tau of the draft as trained so far
    resume: dict[str, torch.Tensor] | None = None   # state.trainer_tensors of the run continued
    save: Callable[[dict[str, torch.Tensor]], None] | None = None  # a campaign's checkpoint (None: no campaign)
    dtype: torch.dtype = torch.float32              # autocast's, when it is not fp32


def fit(trainee: Draft, data: list[Sequence], config: TrainConfig, steps: int, mask_id: int, clock: Clock,
        reserve: float, progress: Progress, loop: Loop) -> dict[str, torch.Tensor]:
    """AdamW steps of the draft on batches drawn from `data`, from `progress.step` to `steps` or until the clock
    leaves `reserve` seconds (a final evaluation's), extending `progress` (losses, rows, curve: block tau at
    `config.curve_points` evenly spread steps and, in a campaign, at each save). Losses are read back every
    LOG_EVERY steps, when rank 0 logs them and the learning rates to `loop.live`. A campaign's checkpoints keep the
    weights of the best block tau (state.keep_best). Returns what a campaign saves of the trainer at the end
    (state.trainer_tensors, and the best weights kept)."""
    device = next(trainee.parameters()).device
    model = draft_loss(trainee)
    if loop.distributed:  # every rank steps with the mean gradient; the caches are not model state
        model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    params = [p for p in trainee.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0, fused=device.type == "cuda" or None)
    gen = sampler(config, loop.rank)
    if loop.resume is not None:
        restore(loop.resume, trainee, opt, gen)
    best = best_of(loop.resume or {})
    campaign, horizon, first, before = loop.save is not None, steps, progress.step, len(progress.curve)
    pending, rates, trained_s, saved_at = [], [], 0.0, time.perf_counter()
    bar = tqdm(total=steps, initial=first, desc="[train_draft] training", unit="step", disable=loop.rank != 0)
    step, since = first, time.perf_counter()
    while step < horizon and not (campaign and clock.left() < reserve):
        picks = [data[i] for i in torch.randint(0, len(data), (config.batch,), generator=gen).tolist()]
        batch = pack(picks, [sample_anchors(s, config.anchors, gen) for s in picks], config.block_size, mask_id,
                     config.gamma, trainee.context_window)
        rates.append(learning_rate(config.lr, step, horizon))
        for group in opt.param_groups:
            group["lr"] = rates[-1]
        with torch.autocast(device.type, dtype=loop.dtype, enabled=loop.dtype != torch.float32):
            loss = model(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        pending.append(loss.detach())
        progress.rows += batch.tokens.shape[1]
        step += 1
        bar.update()
        made = len(progress.curve) - before  # the points of this fit (the curve holds the start's)
        point = made < config.curve_points and not campaign and step >= horizon * (made + 1) / (config.curve_points + 1)
        checkpoint = campaign and time.perf_counter() - saved_at > 60 * config.save_minutes
        if len(pending) < LOG_EVERY and step not in (horizon, CALIBRATE) and not point and not checkpoint:
            continue
        pending, rates = _logged(pending, rates, progress, loop.live)
        since, trained_s = time.perf_counter(), trained_s + clock.add("training", since) - since
        progress.step = step
        if point or checkpoint:
            progress.curve.append({"step": step, "rows": progress.rows, "loss": progress.losses[-1],
                                   "block_tau": loop.measure() if loop.measure else None})
            since = clock.add("evaluation", since)
        if checkpoint:
            if loop.measure:
                best = keep_best(progress, progress.curve[-1]["block_tau"], trainee, best)
            loop.save(trainer_tensors(trainee, opt, gen) | best)
            since, saved_at = clock.add("saving", since), time.perf_counter()
        if clock.deadline is not None and not campaign:  # the steps the clock leaves at this rate
            left = int((clock.left() - reserve) / (trained_s / (step - first)))
            horizon = _agreed(max(step, min(steps, step + left)), device, loop.distributed)
            bar.total = horizon
    bar.close()
    clock.add("training", since)
    _logged(pending, rates, progress, loop.live)
    progress.step = step
    return trainer_tensors(trainee, opt, gen) | best


def sampler(config: TrainConfig, rank: int = 0) -> torch.Generator:
    """The generator that draws a run's batches and anchors (each rank its own)."""
    return torch.Generator().manual_seed(config.seed * 1000 + rank)


def _logged(pending: list[torch.Tensor], rates: list[float], progress: Progress, live) -> tuple[list, list]:
    """The losses not read back yet appended to `progress` and logged with their rates (the one wait for the
    device); returns the emptied lists."""
    for value, lr in zip(torch.stack(pending).tolist() if pending else [], rates):
        progress.losses.append(value)
        if live:
            live.log_metric("loss", value)
            live.log_metric("lr", lr)
            live.next_step()
    return [], []


def _agreed(horizon: int, device: torch.device, distributed: bool) -> int:
    """Under torchrun, the earliest last step any rank's clock allows, so that every rank stops at the same step."""
    if not distributed:
        return horizon
    agreed = torch.tensor([horizon], device=device)
    torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
    return int(agreed)
