"""A training run's resumable state (`dflash train-draft TARGET OUT --resume DIR`): a campaign of runs, each
continuing the last, so a draft can train for many hours on machines that each live for a few.

DIR holds three files, written together (a staged folder swapped in whole: a run stopped mid-write leaves the
last complete state):
- `replies.npz`: the token ids of every training sequence and held-out reply (prompt + the target's greedy reply),
  compressed. The taps are not kept (gigabytes): a resumed run recomputes them from the ids in one prefill each.
- `state.safetensors`: the draft's own weights, AdamW's moments (fp32, so that a resumed run steps exactly as an
  uninterrupted one), the batch sampler's generator, and the weights of the best held-out block tau measured so far
  (`best.<name>`: a campaign that trains past what its data carry ships its best draft, not its last).
- `state.json`: the step, block rows, losses, curve, each session's host, dtype and rates, the prompts' counts, the
  target's fingerprint and the settings that shape the run (`FIXED`).

Git keeps replies.npz and state.json; state.safetensors (93 MB) stays in the working copy that trained. A clone
without it goes on from the draft the campaign wrote (its best weights, which ship in drafts/), with fresh AdamW
moments, or, where there is none, from new weights on the same replies (`_without_trainer`).
"""

import json
import platform
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dflash_et.checkpoints.zlab import draft_weight_names
from dflash_et.files import staged_dir, write_json
from dflash_et.training.config import TrainConfig

FILES = ("replies.npz", "state.safetensors", "state.json")
# Settings a resumed run may change: the clock and its share for data, where and in what it runs, how often it saves
# and measures, the campaign's planned steps (the cosine is then the new length's), and how many prompts of the set
# it answers and the target writes itself (more than the state holds: a resumed run answers the rest). Every other one
# shapes the draft or its data.
CHANGEABLE = {"minutes", "data_share", "device", "precision", "save_minutes", "curve_points", "steps",
              "compute_budget", "num_prompts", "synthetic_prompts", "generate_batch"}


@dataclass
class Progress:
    """How far a run has come; what state.json holds beside its settings."""

    step: int = 0
    rows: int = 0
    losses: list[float] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)
    sessions: list[dict] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    tau_untrained: float | None = None
    eval_seconds: float = 0.0     # the last full held-out decode's: what a session keeps for its final one
    best: dict | None = None      # {step, block_tau} of the weights kept as `best.<name>` (keep_best)


@dataclass
class Saved:
    """A run's state as read back from DIR."""

    train: list[tuple[list[int], int]]    # (tokens, prompt length) of each training sequence
    heldout: list[tuple[list[int], int]]  # the same of each held-out prompt and its reply
    progress: Progress
    tensors: dict[str, torch.Tensor]      # draft.<name>, exp_avg.<name>, exp_avg_sq.<name>, generator


def refuse(state_dir: Path, why: str) -> ValueError:
    return ValueError(f"--resume {state_dir}: {why}; resume from the folder an earlier run wrote, or give a new or "
                      "empty folder to start a run there")


def load(state_dir: Path, config: TrainConfig, target_id: str, draft_dir: Path | None = None) -> Saved | None:
    """The state in `state_dir`, or None where there is none yet (a missing or empty folder: a new run starts).
    A damaged state, one of another target, or one trained with other settings than `config` (beyond
    `CHANGEABLE`) is refused in one line, before anything is written. Without its state.safetensors (a clone), the
    weights come from the campaign's draft in `draft_dir` (`_without_trainer`)."""
    if not state_dir.exists() or (state_dir.is_dir() and not any(state_dir.iterdir())):
        return None
    missing = [name for name in FILES if not (state_dir / name).is_file()]
    if missing and missing != ["state.safetensors"]:
        raise refuse(state_dir, f"{missing[0]} is missing, so this is not a training run's state")
    try:
        meta = json.loads((state_dir / "state.json").read_text())
        progress = Progress(**meta["progress"])
        settings, saved_target = meta["settings"], meta["target_checkpoint_id"]
        with np.load(state_dir / "replies.npz") as arrays:
            train, heldout = _sequences(arrays, "train"), _sequences(arrays, "heldout")
        tensors = None if missing else load_file(state_dir / "state.safetensors")
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:
        raise refuse(state_dir, f"its state is damaged ({type(e).__name__}: {str(e)[:80]})") from None
    if saved_target != target_id:
        raise refuse(state_dir, f"it trained a draft for another target (fingerprint {saved_target}, this one "
                                f"{target_id})")
    ours = asdict(config)
    for key, value in settings.items():
        if key not in CHANGEABLE and ours.get(key) != value:
            raise refuse(state_dir, f"it was trained with train_draft.{key}={value!r}, not {ours.get(key)!r} (pass "
                                    f"--set {key}={json.dumps(value)} to continue it)")
    if tensors is None:
        tensors = _without_trainer(progress, settings, target_id, draft_dir)
    return Saved(train, heldout, progress, tensors)


def _without_trainer(progress: Progress, settings: dict, target_id: str, draft_dir: Path | None
                     ) -> dict[str, torch.Tensor]:
    """The tensors of a state whose state.safetensors another working copy kept: the weights of the draft the
    campaign wrote to `draft_dir` (its card names this target and the same `FIXED` settings), as both the weights
    to train on and the best so far, `progress` set back to that draft's step; else none, and `progress` back to a
    new run's on the same replies (its sessions and prompt counts kept)."""
    card_file = draft_dir / "train_draft.json" if draft_dir is not None else None
    card = json.loads(card_file.read_text()) if card_file is not None and card_file.is_file() else {}
    same = all(card.get("config", {}).get(k) == v for k, v in settings.items() if k not in CHANGEABLE)
    if card.get("target_checkpoint_id") == target_id and "draft_step" in card and same \
            and (draft_dir / "model.safetensors").is_file():
        try:
            weights = draft_weight_names(load_file(draft_dir / "model.safetensors"))
        except (OSError, SafetensorError) as e:
            raise ValueError(f"--resume: {draft_dir / 'model.safetensors'}, the campaign's draft it would go on from, "
                             f"is damaged ({type(e).__name__}); restore it from git, or move it away to start from "
                             "new weights") from None
        progress.step = card["draft_step"]
        progress.curve = [p for p in progress.curve if p["step"] <= progress.step]
        progress.rows = progress.curve[-1]["rows"] if progress.curve else 0
        progress.best = {"step": progress.step, "block_tau": card["heldout_block_tau"],
                         "heldout_tau": card["heldout_tau"]}
        return {f"{kind}.{name}": w.float() for name, w in weights.items() for kind in ("draft", "best")}
    progress.step, progress.rows, progress.losses, progress.curve = 0, 0, [], []
    progress.tau_untrained, progress.eval_seconds, progress.best = None, 0.0, None
    return {}


def save(state_dir: Path, config: TrainConfig, target_id: str, saved: Saved) -> None:
    """Write `saved` to `state_dir` whole, replacing what was there."""
    with staged_dir(state_dir) as tmp:
        np.savez_compressed(tmp / "replies.npz", **_arrays(saved.train, "train"), **_arrays(saved.heldout, "heldout"))
        save_file({k: v.detach().contiguous() for k, v in saved.tensors.items()}, tmp / "state.safetensors")
        write_json(tmp / "state.json", {"target_checkpoint_id": target_id, "settings": asdict(config),
                                        "progress": asdict(saved.progress)})


def trainable(trainee: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of the draft's own weights: what a campaign saves, restores and keeps as its best (the
    borrowed embedding and head are frozen)."""
    return ((name, p) for name, p in trainee.named_parameters() if p.requires_grad)


def copy_into(trainee: torch.nn.Module, tensors: dict[str, torch.Tensor], prefix: str) -> None:
    """The trainee's own weights set to `tensors`' `<prefix><name>` entries."""
    with torch.no_grad():
        for name, p in trainable(trainee):
            p.copy_(tensors[f"{prefix}{name}"])


def trainer_tensors(trainee: torch.nn.Module, opt: torch.optim.Optimizer | None, gen: torch.Generator
                    ) -> dict[str, torch.Tensor]:
    """What state.safetensors keeps of a run: the draft's trainable weights, their AdamW moments and step (none
    before the first step: `opt` None), the batch sampler's generator."""
    out = {"generator": gen.get_state()}
    for name, p in trainable(trainee):
        out[f"draft.{name}"] = p.detach().float().cpu()
        for key, value in (opt.state.get(p, {}) if opt is not None else {}).items():
            out[f"{key}.{name}"] = value.detach().float().cpu().reshape(p.shape if key != "step" else ())
    return out


def restore(tensors: dict[str, torch.Tensor], trainee: torch.nn.Module, opt: torch.optim.Optimizer,
            gen: torch.Generator) -> None:
    """Put `trainer_tensors`' output back into a freshly built draft, its optimizer and generator."""
    if "generator" in tensors:  # none in weights taken from a draft (_without_trainer): the sampler starts anew
        gen.set_state(tensors["generator"])
    copy_into(trainee, tensors, "draft.")
    for name, p in trainable(trainee):
        moments = {key: tensors[f"{key}.{name}"].to(p.device) for key in ("step", "exp_avg", "exp_avg_sq")
                   if f"{key}.{name}" in tensors}
        if moments:
            opt.state[p] = moments


def keep_best(progress: Progress, block_tau: float, trainee: torch.nn.Module, best: dict[str, torch.Tensor]
              ) -> dict[str, torch.Tensor]:
    """The weights a campaign ships: `best` (the `best.<name>` copies of the best block tau so far), or a copy of
    the trainee's own weights where `block_tau`, measured at `progress.step`, beats it (a tie keeps the earlier)."""
    if progress.best is not None and block_tau <= progress.best["block_tau"]:
        return best
    progress.best = {"step": progress.step, "block_tau": block_tau}
    return {f"best.{name}": p.detach().float().cpu().clone() for name, p in trainable(trainee)}


def best_of(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The `best.<name>` entries of a campaign's tensors."""
    return {k: v for k, v in tensors.items() if k.startswith("best.")}


def taps_file(state_dir: Path) -> Path:
    """Where a campaign's working copy keeps its taps (training.data.cached_taps): beside DIR, not in it (a save
    replaces DIR whole), and not in git (gigabytes, which the ids in replies.npz recompute)."""
    return state_dir.with_name(f"{state_dir.name}.taps.safetensors")


def host() -> str:
    """The machine a session ran on, as a card records it (the CPU's model name where Linux says it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _arrays(seqs: list[tuple[list[int], int]], name: str) -> dict[str, np.ndarray]:
    tokens = [t for s, _ in seqs for t in s]
    return {f"{name}_tokens": np.asarray(tokens, dtype=np.int32),
            f"{name}_lengths": np.asarray([len(s) for s, _ in seqs], dtype=np.int32),
            f"{name}_prompt_lens": np.asarray([p for _, p in seqs], dtype=np.int32)}


def _sequences(arrays, name: str) -> list[tuple[list[int], int]]:
    tokens, lengths = arrays[f"{name}_tokens"].tolist(), arrays[f"{name}_lengths"].tolist()
    starts = np.cumsum([0, *lengths]).tolist()
    return [(tokens[a:a + n], p) for a, n, p in zip(starts, lengths, arrays[f"{name}_prompt_lens"].tolist())]
