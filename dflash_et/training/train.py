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
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.load import build_draft, checkpoint_id, eos_ids, load_config, load_target
from dflash_et.data.chat import tokenizer
from dflash_et.data.emitted import head_ids, write_counts
from dflash_et.files import write_json
from dflash_et.models.draft import DFlash2Draft, Draft, reduce_head
from dflash_et.models.target import Target
from dflash_et.runtime.generate import generate_dflash, pooled_tau
from dflash_et.threads import all_cores
from dflash_et.training import state
from dflash_et.training.blocks import block_tau
from dflash_et.training.config import TrainConfig, check_settings, compute_dtype, training_device
from dflash_et.training.collect import collect
from dflash_et.training.data import Sequence, cached_taps, reply_model, tapped
from dflash_et.training.fit import Clock, Loop, fit

# A new DFlash2 draft's parts: z-lab's released Qwen3.6-27B-DFlash2 config (conv 2 rows, groups of 16 channels,
# a rank-256 selector over the top 16 candidates)
DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


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
    if config.warm_start:
        warm_start(draft, target)
    zlab.borrow(draft, target)
    for p in (draft.embed_tokens.weight, draft.lm_head.weight):
        p.requires_grad_(False)
    return draft_cfg, draft


def warm_start(draft: Draft, target: Target) -> None:
    """train_draft.warm_start: the draft's layers start as copies of the target's last ones (every weight of the
    same name and shape: attention, MLP, norms; a Qwen3-style draft's q/k norms over a Llama target stay as
    initialised). SpecForge's ablation reports a far better first-position accuracy from this start at equal steps."""
    for ours, theirs in zip(draft.layers, target.layers[-len(draft.layers):]):
        given = dict(theirs.named_parameters())
        with torch.no_grad():
            for name, p in ours.named_parameters():
                if name in given and given[name].shape == p.shape:
                    p.copy_(given[name])


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
    selector instead multiplies rank x (top-k + 1) per row (`selector_macs`), and RoPE's rotate-half, a product
    with a fixed permutation, is forward and input gradient (2 x, `rotation_macs`). Attention's scores and values
    grow with the context, not the rows, and stay out of the count, for both variants."""
    rows = config.batch * config.anchors * config.block_size
    head = draft.lm_head.weight.numel()
    own = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    looked_up = sum(m.weight.numel() for m in draft.modules() if isinstance(m, nn.Embedding) and m.weight.requires_grad)
    return rows * (2 * head + 3 * (own - looked_up + selector_macs(draft)) + 2 * rotation_macs(draft))


def rotation_macs(draft: Draft) -> int:
    """RoPE's rotate-half per row (models.attention.rotate_half, an R x R matrix): each layer's query and key heads.
    Keys of the context rows are charged per block row, as the taps' projection is."""
    return sum((spec.num_heads + spec.num_kv_heads) * draft.rope.rotation(spec.rope).numel()
               for spec in draft.args.layers)


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
def train_draft(target_dir: Path, out_dir: Path, config: TrainConfig, log=print, live_dir: Path | None = None,
                state_dir: Path | None = None, last_draft: Path | None = None) -> dict:
    """Train a draft for the target in `target_dir`; write it to `out_dir` in z-lab's layout, with its card
    `train_draft.json` (data counts, steps, loss and held-out tau against rows trained, the target's fingerprint:
    nothing that changes from run to run, since the pipeline's draft directory is a dependency). DVCLive, where
    installed, logs loss, learning rate and held-out tau to `live_dir` (default `out_dir/dvclive`; the pipeline's:
    reports/train_draft). Under torchrun every rank writes the same draft to its `out_dir`. Returns the card plus
    `timings` (seconds per phase, throughput, device), which `dflash train-draft` adds to its own card.
    `state_dir`: a campaign's state (training.state), continued when it holds one and written every
    `save_minutes` and at the end; the card then also lists each session's host, dtype and rates. `last_draft`
    (default `out_dir`): where the campaign wrote its draft before, whose weights go on where `state_dir` lacks its
    own (a clone: training.state)."""
    device = training_device(config)  # a device that is not there is refused before anything runs
    compute_dtype(config, device)
    check_settings(config)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank = 0
    if distributed:
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank = torch.distributed.get_rank()
    try:
        return _train(target_dir, out_dir, config, device, rank, distributed, log, live_dir or out_dir / "dvclive",
                      state_dir, last_draft or out_dir)
    finally:
        if distributed:
            torch.distributed.destroy_process_group()


def _card(config: TrainConfig, target_dir: Path, data: list[Sequence], mask_id: int, progress: state.Progress,
          heldout: int, head: int | None, campaign: bool) -> dict:
    """The draft's card (train_draft.json): what it was trained on, and held-out tau before, during and after; a
    campaign's also each session's host, dtype and rates, and the step of the draft it wrote (its best)."""
    end = progress.best if campaign else progress.curve[-1]  # a campaign writes its best draft
    card = {"steps": progress.step, "final_loss": progress.losses[-1] if progress.losses else None,
            "heldout_tau_untrained": progress.tau_untrained, "heldout_tau": end["heldout_tau"],
            "heldout_block_tau": end["block_tau"], "target_checkpoint_id": checkpoint_id(target_dir),
            "train_sequences": len(data), "mask_token_id": mask_id, "head_vocab": head,
            "data": {"prompts": progress.counts, "sequences": len(data),
                     "reply_tokens": sum(len(s.tokens) - s.prompt_len for s in data), "heldout_prompts": heldout},
            "curve": progress.curve, "config": asdict(config)}
    return card | ({"draft_step": end["step"], "sessions": progress.sessions} if campaign else {})


def _train(target_dir: Path, out_dir: Path, config: TrainConfig, device: torch.device, rank: int, distributed: bool,
           log, live_dir: Path, state_dir: Path | None, last_draft: Path) -> dict:
    clock = Clock(config.minutes)
    torch.manual_seed(config.seed)
    target_id = checkpoint_id(target_dir)
    if state_dir is not None and distributed:
        raise ValueError("--resume trains on one process; run it without torchrun")
    saved = state.load(state_dir, config, target_id, last_draft) if state_dir is not None else None
    dtype = compute_dtype(config, device)
    layers = zlab.default_target_layer_ids(load_config(target_dir).num_hidden_layers, config.num_layers)
    target = load_target(target_dir, layers, config.max_seq_len)
    _check_mask_token(target_dir, config.mask_token_id, target.args.vocab_size)
    draft_cfg, draft = new_draft(target_dir, target, config)
    mask_id = draft_cfg["dflash_config"]["mask_token_id"]
    eos, tok, model = set(eos_ids(target_dir)), tokenizer(target_dir), reply_model(target_dir, device, dtype)
    log(f"[train_draft] {device} ({state.host()}): replies, taps and training in {DTYPE_NAMES[dtype]}")
    clock.add("loading", clock.start)
    saved, had = collect(config, saved, state_dir, target_id, tok, model, eos, draft, clock, log)
    since = time.perf_counter()
    if state_dir is None:
        data, heldout = (tapped(model, target.layer_ids, ids, taps_dtype=dtype) for ids in (saved.train, saved.heldout))
    else:  # a campaign: its working copy keeps the taps it has made
        both = cached_taps(model, target.layer_ids, saved.train + saved.heldout, state.taps_file(state_dir),
                           f"{target_id} layers {target.layer_ids} {DTYPE_NAMES[dtype]}", dtype)
        data, heldout = both[:len(saved.train)], both[len(saved.train):]
    del model
    clock.add("taps", since)
    new_tokens = sum(len(s.tokens) - s.prompt_len for s in data[had:])
    if "replies" in clock.seconds:
        log(f"[train_draft] {len(data) - had} target responses ({new_tokens} tokens, "
            f"{new_tokens / clock.seconds['replies']:.0f} tokens/s on {device}; mask token {mask_id})")
    if config.head_vocab != "full":  # the set export.draft_vocab of the same size keeps
        emitted = Counter(t for tokens, p in saved.train for t in tokens[p:])
        reduce_head(draft, head_ids(tok, eos, emitted, config.head_vocab, target.args.vocab_size))
    trainee = draft if device.type == "cpu" else copy.deepcopy(draft).to(device)
    run = Run(config, target, draft, trainee, data, [s.tokens[:s.prompt_len].tolist() for s in heldout], heldout, eos,
              mask_id, dtype, clock, saved.progress)
    progress, first_rows = _fit_session(run, saved, state_dir, target_id, rank, distributed, live_dir, log)
    report = _card(config, target_dir, data, mask_id, progress, len(heldout),
                   None if config.head_vocab == "full" else config.head_vocab, state_dir is not None)
    report["macs"] = progress.step * step_macs(config, draft)
    since = time.perf_counter()
    zlab.save_draft(out_dir, draft_cfg, draft.state_dict())
    write_counts(out_dir, [tokens[p:] for tokens, p in saved.train])  # for export.draft_vocab
    write_json(out_dir / "train_draft.json", report)  # the card; the clock's figures only in what is returned
    clock.add("saving", since)
    seconds = {k: round(v, 2) for k, v in clock.seconds.items()}
    seconds["total"] = round(time.perf_counter() - clock.start, 2)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {state.host()}"
    rates = {"block_rows_per_s": round((progress.rows - first_rows) / clock.seconds["training"], 1)}
    if "replies" in clock.seconds:
        rates["reply_tokens_per_s"] = round(new_tokens / clock.seconds["replies"], 1)
    return report | {"timings": {"seconds": seconds, "device": f"{device} ({name})", "dtype": DTYPE_NAMES[dtype],
                                 **rates}}


@dataclass
class Run:
    """What a session's training and its measurements share."""

    config: TrainConfig
    target: Target
    draft: Draft                  # on the host: the reference decoding's
    trainee: Draft                # the one that trains (the draft itself on the CPU, a copy on a GPU)
    data: list[Sequence]          # the training sequences, with their taps
    prompts: list[list[int]]      # the held-out prompts
    heldout: list[Sequence]       # and the target's replies to them, with their taps
    eos: set[int]
    mask_id: int
    dtype: torch.dtype
    clock: Clock
    progress: state.Progress

    def block_tau(self) -> float:
        """Held-out block tau of the weights trained so far (one batched pass)."""
        device = next(self.trainee.parameters()).device
        with torch.autocast(device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            return block_tau(self.trainee, self.heldout, self.config.block_size, self.mask_id)

    def heldout_tau(self) -> float:
        """Held-out tau of the weights trained so far, by the reference decoding on the host."""
        started = time.perf_counter()
        if self.trainee is not self.draft:  # its own weights only: the borrowed head and embedding never change
            self.draft.load_state_dict({k: v for k, v in self.trainee.state_dict().items() if k not in zlab.BORROWED},
                                       strict=False)
        tau = acceptance(self.target, self.draft, self.prompts, self.eos, self.config, self.mask_id, "training")
        self.progress.eval_seconds = self.clock.add("evaluation", started) - started
        return tau

    def point(self) -> dict:
        """A curve point at the progress so far, by both measures."""
        p = self.progress
        return {"step": p.step, "rows": p.rows, "loss": p.losses[-1] if p.losses else None,
                "heldout_tau": self.heldout_tau(), "block_tau": self.block_tau(),
                "reply_tokens": sum(len(s.tokens) - s.prompt_len for s in self.data)}


def _fit_session(run: Run, saved: state.Saved, state_dir: Path | None, target_id: str, rank: int, distributed: bool,
                 live_dir: Path, log) -> tuple[state.Progress, int]:
    """This session's steps (fit.fit), held-out tau before (a new run) and after, each save of a campaign; returns
    the progress and the block rows it had before."""
    config, progress = run.config, run.progress
    if progress.tau_untrained is None:  # a new run, or one whose state was saved before its first step
        progress.curve.append(run.point())
        progress.tau_untrained = progress.curve[-1]["heldout_tau"]
    steps = planned_steps(config, run.draft)
    budget = f" (compute_budget {config.compute_budget:.2e})" if steps < config.steps else ""
    log(f"[train_draft] {steps} steps of {step_macs(config, run.draft):.2e} MACs{budget}"
        + (f", or fewer: {config.minutes:.1f} minutes in all" if config.minutes is not None else ""))
    session = {"host": state.host(), "device": str(next(run.trainee.parameters()).device),
               "dtype": DTYPE_NAMES[run.dtype], "from_step": progress.step,
               "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    progress.sessions.append(session)
    first_rows = progress.rows

    def save(tensors: dict[str, torch.Tensor]) -> None:
        session.update(to_step=progress.step, block_rows_per_s=round(
            (progress.rows - first_rows) / max(run.clock.seconds.get("training", 0.0), 1e-9), 1))
        state.save(state_dir, config, target_id, state.Saved(saved.train, saved.heldout, progress, tensors))

    live = _live(live_dir) if rank == 0 else None
    loop = Loop(rank, distributed, live, run.block_tau, saved.tensors if progress.step else None,
                save if state_dir is not None else None, run.dtype)
    tensors = fit(run.trainee, run.data, config, steps, run.mask_id, run.clock, progress.eval_seconds, progress, loop)
    progress.curve.append(run.point())
    if state_dir is not None:
        tensors |= state.keep_best(progress, progress.curve[-1]["block_tau"], run.trainee, state.best_of(tensors))
        save(tensors)
        _ship_best(run, tensors, log)
    log(f"[train_draft] held-out tau {progress.tau_untrained:.2f} -> {progress.curve[-1]['heldout_tau']:.2f} after "
        f"{progress.step} steps ({(progress.rows - first_rows) / run.clock.seconds['training']:.0f} block rows/s; "
        f"{time.perf_counter() - run.clock.start:.0f} s)")
    if live:  # the run's summary (metrics.json): what `dvc exp show` lists as train_draft's metrics
        for key, value in (("heldout_tau_untrained", progress.tau_untrained),
                           ("heldout_tau", progress.curve[-1]["heldout_tau"]),
                           ("final_loss", progress.losses[-1] if progress.losses else None), ("steps", progress.step),
                           ("train_sequences", len(saved.train))):
            live.summary[key] = value
        live.end()
    return progress, first_rows


def _ship_best(run: Run, tensors: dict[str, torch.Tensor], log) -> None:
    """A campaign writes the draft of its best held-out block tau (the state keeps training from the last weights):
    past what its replies carry, further steps learn them by heart and lose held-out tau. The best's held-out tau
    (the reference decoding) goes into `progress.best`."""
    best = run.progress.best
    if best["step"] == run.progress.step:
        best["heldout_tau"] = run.progress.curve[-1]["heldout_tau"]
        return
    state.copy_into(run.trainee, tensors, "best.")
    best["heldout_tau"] = run.heldout_tau()
    log(f"[train_draft] writing the draft of step {best['step']} (held-out block tau {best['block_tau']:.3f}, tau "
        f"{best['heldout_tau']:.2f}): the best measured; step {run.progress.step}'s is "
        f"{run.progress.curve[-1]['block_tau']:.3f}")


def _live(live_dir: Path):
    """DVCLive's logger, or None where it is not installed (a bare GPU machine: the card keeps the curve)."""
    try:
        from dvclive import Live
    except ImportError:
        return None
    return Live(str(live_dir), save_dvc_exp=False, dvcyaml=None)
