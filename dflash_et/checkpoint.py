"""Getting a checkpoint into `artifacts/weights/<role>/`, and refusing ones that cannot work.

A source is `builtin` (the project's tiny pair), a local directory, or a Hugging Face repo id
with an optional `@revision`. Whatever the source, the result is the same Hugging Face file
layout, written to a temporary directory and renamed into place only once it has passed
every check, so a failed fetch leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import TYPE_CHECKING
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dflash_et import builtin
from dflash_et.files import staged_dir

if TYPE_CHECKING:
    from dflash_et.train import TrainConfig
from dflash_et.model import (DRAFT_BORROWED, CheckpointError, Draft, DraftSettings, ModelArgs, Target, build_draft,
                             build_target, check_weights, checkpoint_id, draft_settings, load_config, load_draft,
                             load_target, target_state_dict, weight_files)

BUILTIN = "builtin"                # the built-in pair: a target trained on the project's corpus
BUILTIN_RANDOM = "builtin-random"  # the same layout with random weights (seconds to make; tests)
TRAIN = "train"  # model.draft only: train a draft for the target (dflash_et.train)
CHECKPOINT_FILES = [
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "vocab.json", "merges.txt", "tokenizer.model",
]
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")


def fetch(role: str, source: str, out: Path, target_dir: Path | None = None, train: TrainConfig | None = None) -> None:
    """Put the `role` ("target" or "draft") checkpoint named by `source` at `out`, checked.

    A draft is checked against the target already at `target_dir`; source `train` trains one for
    it with the `train` settings.
    """
    param = f"model.{role}"
    with staged_dir(out) as tmp:
        if source in (BUILTIN, BUILTIN_RANDOM):
            if role == "target":
                builtin.write_target(tmp, trained=source == BUILTIN)
            else:
                builtin.write_draft(tmp, target_dir)
        elif source == TRAIN and role == "draft":
            from dflash_et.train import TrainConfig, train_draft  # noqa: F811  (imported only when training)

            train_draft(target_dir, tmp, train or TrainConfig())
        elif _looks_like_path(source):
            _copy_checkpoint(Path(source).expanduser(), tmp, param)
        elif HUB_ID.match(source):
            _download(source, tmp, param)
        else:
            raise CheckpointError(
                f"{param}={source!r} is neither '{BUILTIN}', an existing directory, nor a hub id like "
                "'Qwen/Qwen3-4B[@revision]'"
            )
        check_target(tmp, source) if role == "target" else check_pair(target_dir, tmp, source)


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", ".", "~")) or os.path.isdir(source)


def _copy_checkpoint(src: Path, dst: Path, param: str) -> None:
    """Copy (not link: DVC makes its cached files read-only) the checkpoint files of a local directory."""
    if not src.is_dir():
        raise CheckpointError(f"{param}: {src} is not a directory; give a checkpoint directory, a hub id or '{BUILTIN}'")
    for pattern in CHECKPOINT_FILES:
        for f in src.glob(pattern):
            shutil.copy2(f, dst / f.name)


def _download(source: str, dst: Path, param: str) -> None:
    """snapshot_download into the Hugging Face cache (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply), then copy out."""
    from huggingface_hub import snapshot_download

    repo_id, _, revision = source.partition("@")
    try:
        snapshot = snapshot_download(repo_id, revision=revision or None, allow_patterns=CHECKPOINT_FILES)
    except Exception as e:  # noqa: BLE001  network boundary: HTTP, proxy, offline, gated, not found
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{param}: cannot download {source!r} from the Hugging Face hub ({type(e).__name__}: {reason}). "
            f"Set {param} to a local checkpoint directory or to '{BUILTIN}'"
        ) from None
    _copy_checkpoint(Path(snapshot), dst, param)


# --- checks ------------------------------------------------------------------------------------


def _header_shapes(ckpt: Path, name: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor, from the safetensors headers alone (no weights read)."""
    files = weight_files(ckpt)
    if not files:
        raise CheckpointError(f"{name}: no .safetensors weights")
    shapes = {}
    for f in files:
        if not f.exists():
            raise CheckpointError(f"{name}: shard {f.name} listed in the index is missing")
        try:
            with safe_open(f, "pt") as st:
                shapes |= {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
        except SafetensorError as e:
            raise CheckpointError(f"{name}/{f.name}: unreadable safetensors ({e}); the file is truncated or corrupt, fetch it again") from None
    return shapes


def _config(ckpt: Path, name: str):
    if not (ckpt / "config.json").is_file():
        raise CheckpointError(f"{name}: no config.json, so it is not a Hugging Face checkpoint directory")
    try:
        return load_config(ckpt)
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{name}/config.json: cannot be read as a model config ({e})") from None


def check_target(ckpt: Path, name: str | None = None) -> None:
    """A usable target: supported architecture, tokenizer, weights that match the config.

    `name` is how the user knows the checkpoint (its source), used in messages instead of `ckpt`.
    """
    name = f"target {name or ckpt}"
    config = _config(ckpt, name)
    if not ((ckpt / "tokenizer.json").exists() or (ckpt / "tokenizer.model").exists()):
        raise CheckpointError(f"{name}: no tokenizer.json or tokenizer.model")
    with torch.device("meta"):
        model = build_target(config, [], 1)
    shapes = target_state_dict(_header_shapes(ckpt, name))
    check_weights(name, model, shapes, ("lm_head.weight",) if model.args.tie_word_embeddings else ())


def check_pair(target_dir: Path, draft_dir: Path, name: str | None = None) -> None:
    """A usable draft for this target: z-lab layout, and every dimension it shares with the target agrees."""
    name = f"draft {name or draft_dir}"
    draft, target = _config(draft_dir, name), _config(target_dir, f"target {target_dir}")
    if "DFlashDraftModel" not in (getattr(draft, "architectures", None) or []):
        raise CheckpointError(f"{name}: config.json architectures is not ['DFlashDraftModel']")
    settings = draft_settings(draft)
    t = ModelArgs.from_config(target)
    shapes = _header_shapes(draft_dir, name)
    mismatches = []
    if draft.hidden_size != t.hidden_size:
        mismatches.append(f"draft hidden_size {draft.hidden_size} != target hidden_size {t.hidden_size}")
    bad_ids = [i for i in settings.target_layer_ids if not 0 <= i < t.num_layers]
    if bad_ids:
        mismatches.append(f"target_layer_ids {bad_ids} outside the target's {t.num_layers} layers")
    if not 0 <= settings.mask_token_id < t.vocab_size:
        mismatches.append(f"mask_token_id {settings.mask_token_id} outside the target vocab_size {t.vocab_size}")
    if getattr(draft, "num_target_layers", t.num_layers) != t.num_layers:
        mismatches.append(f"num_target_layers {draft.num_target_layers} != target num_hidden_layers {t.num_layers}")
    fc = shapes.get("fc.weight")
    if fc is not None and fc[1] != len(settings.target_layer_ids) * t.hidden_size:
        mismatches.append(f"fc.weight input {fc[1]} != {len(settings.target_layer_ids)} target_layer_ids x "
                          f"target hidden_size {t.hidden_size}")
    if mismatches:
        raise CheckpointError(f"{name} does not fit target {target_dir}: {'; '.join(mismatches)}")
    with torch.device("meta"):
        model = build_draft(draft, t, 1)
    check_weights(name, model, shapes, DRAFT_BORROWED)
    report = draft_dir / "train_draft.json"  # written by train_draft: which target the draft learned
    trained_for = json.loads(report.read_text()).get("target_checkpoint_id") if report.is_file() else None
    if trained_for is not None and trained_for != checkpoint_id(target_dir):
        raise CheckpointError(f"{name} was trained for another target than {target_dir} (see its train_draft.json) "
                              "and would accept little; retrain it for this target (model.draft: train), or delete "
                              "its train_draft.json to use it anyway")


def load_pair(target_dir: Path, draft_dir: Path, max_seq_len: int) -> tuple[Target, Draft, DraftSettings]:
    """Both eager models of a checked pair, the target tapping the layers the draft reads."""
    check_target(target_dir)
    check_pair(target_dir, draft_dir)
    settings = draft_settings(load_config(draft_dir))
    target = load_target(target_dir, settings.target_layer_ids, max_seq_len)
    return target, load_draft(draft_dir, target), settings
