"""Refusing checkpoints that cannot work, before anything is written or exported, in one line each.

The checks read configs and safetensors headers only (no weights), so they are cheap enough to run
on every fetch and every load.
"""

import json
from pathlib import Path

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.load import (build_draft, build_target, check_weights, checkpoint_id, header_shapes,
                                        load_config, model_args, target_state_dict)
from dflash_et.errors import CheckpointError


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
    model = build_target(config, [], 1, empty=True)
    shapes = target_state_dict(header_shapes(ckpt, name))
    check_weights(name, model, shapes, ("lm_head.weight",) if model.args.tie_word_embeddings else ())


def check_pair(target_dir: Path, draft_dir: Path, name: str | None = None) -> None:
    """A usable draft for this target: z-lab layout, and every dimension it shares with the target agrees."""
    name = f"draft {name or draft_dir}"
    draft, target = _config(draft_dir, name), _config(target_dir, f"target {target_dir}")
    settings = zlab.draft_settings(draft)
    architecture = zlab.ARCHITECTURES[settings.variant]
    if architecture not in (getattr(draft, "architectures", None) or []):
        keys = "has" if settings.variant == "dflash2" else "lacks"
        raise CheckpointError(f"{name}: config.json architectures is not ['{architecture}'] (the config {keys} "
                              "DFlash2's conv_* and selector_* keys)")
    t = model_args(target)
    shapes = zlab.draft_weight_names(header_shapes(draft_dir, name))
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
    model = build_draft(draft, t, 1, empty=True)
    check_weights(name, model, shapes, zlab.BORROWED)
    report = draft_dir / "train_draft.json"  # written by train_draft: which target the draft learned
    trained_for = json.loads(report.read_text()).get("target_checkpoint_id") if report.is_file() else None
    if trained_for is not None and trained_for != checkpoint_id(target_dir):
        raise CheckpointError(f"{name} was trained for another target than {target_dir} (see its train_draft.json) "
                              "and would accept little; retrain it for this target (model.draft: train), or delete "
                              "its train_draft.json to use it anyway")
