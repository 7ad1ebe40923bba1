"""Loading a target and its draft together, after the checks that would refuse them (checkpoints.check):
every caller that runs a pair (export, validate, the tests' eager twins) gets the same refusals first. Where
model.draft is none (load.has_draft), the pair is the target alone."""

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.check import check_pair, check_target
from dflash_et.checkpoints.load import has_draft, load_config, load_draft, load_target, target_alone_layers
from dflash_et.models.draft import Draft
from dflash_et.models.target import Target


def load_pair(target_dir: Path, draft_dir: Path, max_seq_len: int, ops: str = "torch",
              dtype: torch.dtype = torch.float32, prepare: Callable[[nn.Module], None] | None = None, *,
              target_only: tuple[str, ...] | None = None, max_call: int | None = None, verify_call: int | None = None,
              ring: bool = False, max_block: int | None = None,
              convert: Callable[[torch.Tensor, torch.dtype], torch.Tensor] | None = None
              ) -> tuple[Target, Draft | None, zlab.DraftSettings | None]:
    """Both models of a checked pair, the target tapping the layers the draft reads; `ops` is the op set
    (`torch` to run eagerly, the backend's to export), `dtype` the weights', and `prepare`, `target_only`
    (load.load_target's `only`), `max_call`, `verify_call`, `ring` and `convert` as in load.load_target; `ring` and
    `max_block` (the draft's longest block) size a windowed draft's ring buffers (load.build_draft). Without a draft
    (model.draft: none) the draft and its settings are None and the target taps `load.target_alone_layers`."""
    check_target(target_dir)
    drafted = has_draft(draft_dir)
    if drafted:
        check_pair(target_dir, draft_dir)
    settings = zlab.draft_settings(load_config(draft_dir)) if drafted else None
    target = load_target(target_dir, settings.target_layer_ids if drafted else target_alone_layers(target_dir),
                         max_seq_len, ops, dtype, prepare, only=target_only, max_call=max_call,
                         verify_call=verify_call, ring=ring, convert=convert)
    return target, load_draft(draft_dir, target, ops, dtype, prepare, max_block, ring) if drafted else None, settings
