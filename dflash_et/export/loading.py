"""The target and the draft loaded as a program of an export config holds them: its dtype, its recipes, its caches.

The export loads them to lower them; validate loads the same models eagerly (torch ops) as the twin it compares
the programs with, so the two cannot drift apart.
"""

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from dflash_et.checkpoints.load import eos_ids
from dflash_et.checkpoints.pair import load_pair
from dflash_et.checkpoints.zlab import BORROWED, DraftSettings
from dflash_et.data.chat import tokenizer
from dflash_et.data.emitted import TOKEN_COUNTS, coverage, head_ids, read_counts
from dflash_et.export.config import DTYPES, OPS_OF_BACKEND, ExportConfig
from dflash_et.export.frugal import Spiller
from dflash_et.export.recipes import quantize
from dflash_et.models.draft import Draft, reduce_head
from dflash_et.models.target import Target

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loading:
    """What the models are loaded for, beyond the config. The defaults: eagerly (torch ops, both models quantized
    whole), as validate's twin of the programs; `for_program`: to lower a program."""

    ops: str = "torch"                                # the op set: torch, or the backend's (OPS_OF_BACKEND)
    quantized: tuple[str, ...] = ("target", "draft")  # the models quantized whole (a program's own)
    spiller: Spiller | None = None  # the weights each step makes go to its spool (frugal.Spiller.kept, .converted)
    target_only: tuple[str, ...] | None = None  # the target's weights read (the draft's program: those it borrows)
    max_call: int | None = None     # the longest target call, the verify call, a windowed draft's longest block
    verify_call: int | None = None  # (sizes of ring buffers: checkpoints.load.load_target, build_draft)
    max_block: int | None = None
    ring: bool = False              # sliding-window layers in ring buffers (export.sliding_cache)

    @classmethod
    def for_program(cls, kind: str, config: ExportConfig, max_block: int, spiller: Spiller | None) -> "Loading":
        """For the program of `kind` (config.PROGRAM_KINDS): its backend's ops, its models, its call sizes."""
        own = tuple(k for k in ("target", "draft") if kind in (k, "single"))
        return cls(ops=OPS_OF_BACKEND[config.backend], quantized=own, spiller=spiller,
                   target_only=BORROWED if kind == "draft" else None, max_call=max(config.prefill_chunk, max_block), verify_call=max_block, max_block=max_block,
                   ring=config.sliding_cache == "ring" and config.backend != "mlx")


def load_models(target_dir: Path, draft_dir: Path, config: ExportConfig, max_seq_len: int,
                loading: Loading = Loading()) -> tuple[Target, Draft | None, DraftSettings | None]:
    """The target and the draft as programs of `config` hold them: weights read in its dtype and quantized by its
    recipes (recipes.quantize), each decoder layer as it loads, then the rest of the models `loading` names
    (`quantized`); with its `spiller` (export), the weights each step makes go to the spool (frugal.Spiller.kept),
    and those outside the decoder layers are converted into it (frugal.Spiller.converted). Without a draft
    (model.draft: none), the target alone, as checkpoints.pair.load_pair returns it."""
    spiller = loading.spiller
    prepare = partial(_prepare, config=config, spiller=spiller)
    target, draft, settings = load_pair(target_dir, draft_dir, max_seq_len, loading.ops, DTYPES[config.dtype], prepare,
                                        target_only=loading.target_only, max_call=loading.max_call,
                                        verify_call=loading.verify_call, ring=loading.ring, max_block=loading.max_block,
                                        convert=None if spiller is None else spiller.converted)
    if config.draft_vocab != "full" and draft is not None:
        reduce_head(draft, _draft_vocab(target_dir, draft_dir, config.draft_vocab, draft.args.vocab_size))
    for name, model in (("target", target), ("draft", draft)):
        if name in loading.quantized and model is not None:
            prepare(model)  # what is not in a decoder layer: the head, the embedding, the draft's fc
    return target, draft, settings


def _draft_vocab(target_dir: Path, draft_dir: Path, size: int, vocab_size: int) -> list[int]:
    """export.draft_vocab: the ids the draft's head keeps (data.emitted), every special and end-of-turn token among them."""
    counts = read_counts(draft_dir)
    ids = head_ids(tokenizer(target_dir), set(eos_ids(target_dir)), counts, size, vocab_size)
    share = coverage(counts, ids)
    logger.info(f"draft head: {size} of {vocab_size} tokens, " + (
        f"{share:.2%} of the {sum(counts.values())} its target emitted in the draft's training replies" if counts else
        f"the lowest ids ({draft_dir} has no {TOKEN_COUNTS}: a draft not trained here)"))
    return ids


def _prepare(module: torch.nn.Module, config: ExportConfig, spiller: Spiller | None) -> None:
    with nullcontext() if spiller is None else spiller.kept(module):
        quantize(module, config)
