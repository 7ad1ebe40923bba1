"""The records a program carries of itself (dflash_et.metadata), read from the checkpoints it was made from."""

from pathlib import Path

import torch

from dflash_et.checkpoints.load import bos_id, checkpoint_id, eos_ids, recommended_sampling
from dflash_et.checkpoints.zlab import DraftSettings
from dflash_et.export.config import ExportConfig
from dflash_et.metadata import DraftMeta, TargetMeta, merged
from dflash_et.models.block import ModelArgs
from dflash_et.models.deltanet import DeltaNetSpec
from dflash_et.models.draft import Draft
from dflash_et.models.target import Target


def metadata(kind: str, models: tuple[Target, Draft | None, DraftSettings | None], config: ExportConfig,
             target_dir: Path, draft_dir: Path, max_block: int) -> dict:
    """Everything a runner must know, inside the program itself: the constant methods of the records of
    the methods a program of `kind` holds (dflash_et.metadata); `models` as loading.load_models returns them.

    Each carries the fingerprint of the checkpoint it was made from; the draft also carries its target's
    and the layers it reads, so a mismatched pair is caught when loading. A hybrid target (only) says
    `recurrent_state` and `verify_rows`: its calls must go forward (start at 0, or within the previous
    call), and one kept in part keeps at most its first `verify_rows` tokens, as every decode loop does
    (models.deltanet). A target without a draft (model.draft: none) says its longest verify, `max_block_len`, itself.
    """
    target, draft, settings = models
    args = target.args
    common = {"max_context_len": config.max_seq_len, "vocab_size": args.vocab_size,
              "target_layer_ids": tuple(target.layer_ids), "uses_llama_custom_ops": config.backend != "mlx"}
    records = []
    if kind != "draft":
        hybrid = {"recurrent_state": True, "verify_rows": max_block} if recurrent(args) else {}
        records.append(TargetMeta(**common, **recommended_sampling(target_dir), **hybrid,
                                  max_seq_len=max(config.prefill_chunk, max_block), eos_ids=tuple(eos_ids(target_dir)),
                                  bos_id=bos_id(target_dir), checkpoint_id=checkpoint_id(target_dir),
                                  max_block_len=None if draft is not None else max_block))
    if kind != "target" and draft is not None:
        records.append(DraftMeta(**common, max_block_len=max_block, mask_token_id=settings.mask_token_id,
                                 draft_checkpoint_id=checkpoint_id(draft_dir), target_checkpoint_id=checkpoint_id(target_dir),
                                 context_window=draft.context_window, vocab_ids=_ids(draft.vocab_ids),
                                 selector_top_k=settings.selector[1] if settings.selector else None))
    return merged(*records)


def recurrent(args: ModelArgs) -> bool:
    """Whether a target has Gated DeltaNet layers (a hybrid model), whose state only goes forward."""
    return any(isinstance(spec, DeltaNetSpec) for spec in args.layers)


def _ids(vocab_ids: torch.Tensor | None) -> tuple[int, ...] | None:
    """A reduced head's token ids (models.draft.reduce_head) as the record keeps them."""
    return None if vocab_ids is None else tuple(vocab_ids.tolist())
