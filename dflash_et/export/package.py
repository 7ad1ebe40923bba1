"""Gathering the exported programs into what ships: both .pte files, one shared weights file, the
tokenizer with its chat format, and a summary."""

import json
import os
import shutil
from pathlib import Path

from dflash_et.data.chat import chat_format, tokenizer as load_tokenizer
from dflash_et.errors import ExportError

# export settings only one program reads (dvc.yaml: the other's export stage does not rerun for them)
TARGET_ONLY, DRAFT_ONLY = ("prefill_chunk", "stock_forward"), ("draft_head", "draft_vocab")


def merge_weights(ptds: list[Path], out: Path) -> dict:
    """Merge the programs' .ptd files into one, storing every named tensor once.

    Delegated weights are keyed by content hash and the rest by module path (the same in both
    programs), so a key seen twice must hold the same bytes; anything else is a conflict.
    """
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    serializer = FlatTensorSerializer()
    buffers: list[bytes] = []
    named: dict[str, DataEntry] = {}
    for ptd in ptds:
        payload = serializer.deserialize(Cord(ptd.read_bytes()))
        for key, entry in payload.named_data.items():
            data = bytes(payload.buffers[entry.buffer_index])
            if key in named:
                if buffers[named[key].buffer_index] != data:
                    raise ExportError(f"{ptd}: tensor {key!r} differs from the one already in {ptds[0]}; "
                                      "the programs cannot share one weights file")
                continue
            named[key] = DataEntry(len(buffers), 64, entry.tensor_layout)
            buffers.append(data)
    with open(out, "wb") as f:
        serializer.serialize(DataPayload(buffers=buffers, named_data=named)).write_to_file(f)
    separate = sum(p.stat().st_size for p in ptds)
    return {"separate_bytes": separate, "shared_bytes": out.stat().st_size,
            "bytes_saved": separate - out.stat().st_size, "tensors": len(named)}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model")


def package(build_dirs: list[Path], out: Path, target_dir: Path) -> dict:
    """Gather what a runner needs into `out`: the programs the export stages built (target.pte and draft.pte,
    or the single layout's target.pte), `shared.ptd` (merged) when weights are external, the target's
    tokenizer and chat template (ExecuTorch's LLM runners look for the tokenizer beside the program;
    `dflash generate` reads it there), the template's rendering of one user turn as ChatFormat.FILE (for
    dflash_runner --prompt; none where the template is not a fixed prefix and suffix around the message),
    and export.json. `build_dirs` are named by their kind (config.PROGRAM_KINDS); those of kinds the layout
    does not use hold a summary alone."""
    summaries = {d.name: json.loads((d / "export.json").read_text()) for d in build_dirs}
    configs = {kind: s["config"] for kind, s in summaries.items()}
    if len({json.dumps({k: v for k, v in c.items() if k not in TARGET_ONLY + DRAFT_ONLY}, sort_keys=True)
            for c in configs.values()}) != 1:
        raise ExportError(f"the programs were exported with different settings {configs}; rerun both exports")
    config = configs["target"] | {k: configs["draft"][k] for k in DRAFT_ONLY if k in configs["draft"]}
    built = {d.name: d for d in build_dirs if summaries[d.name]["program"]}
    for kind, d in built.items():
        _link_or_copy(d / summaries[kind]["program"], out / summaries[kind]["program"])
    tokenizer = [f for f in TOKENIZER_FILES if (target_dir / f).is_file()]
    if not tokenizer:
        raise ExportError(f"{target_dir} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); fetch the target again")
    for f in tokenizer:
        shutil.copy2(target_dir / f, out / f)
    formatted = chat_format(load_tokenizer(target_dir))
    if formatted:
        formatted.write(out)
    shared = None
    if config["shared_weights"]:
        shared = merge_weights([d / f"{kind}.ptd" for kind, d in built.items()], out / "shared.ptd")
    summary = {"config": config, "programs": {kind: summaries[kind] for kind in built}, "shared_weights": shared,
               "tokenizer": tokenizer, "chat_format": formatted is not None}
    (out / "export.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _link_or_copy(src: Path, dst: Path) -> None:
    """Programs can be GBs: hardlink when the filesystem allows (DVC's cache is read-only anyway)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
