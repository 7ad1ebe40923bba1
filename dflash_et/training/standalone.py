"""Training a draft for any target outside the pipeline (`dflash train-draft`), on a GPU when there is one.

What the pipeline's fetch_draft stage does with `model.draft: train`, as one command for a bare GPU machine: the
target is fetched as model.target is, the settings are params.yaml's train_draft section with overrides, and the
draft is written whole (z-lab's layout) with a card that adds what the pipeline's copy leaves out: seconds per
phase, throughput, the device, the versions and the command. It imports only torch, transformers, safetensors,
tokenizers and PyYAML (gguf and accelerate for a .gguf target): no ExecuTorch and no DVC, which such a machine
lacks (tests/test_train_tool.py runs it with them unimportable). Under torchrun it trains data-parallel; only
rank 0 writes.
"""

import importlib.metadata
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

from dflash_et.checkpoints.fetch import fetch
from dflash_et.files import staged_dir, write_json
from dflash_et.params import params
from dflash_et.training.config import TrainConfig, train_config, training_device
from dflash_et.training.train import train_draft


def settings(target: str, sets: list[str], minutes: float | None, device: str | None) -> TrainConfig:
    """params.yaml's train_draft section for `target` (prompt sets at `auto` follow it), each KEY=VALUE of `sets`
    over it (a YAML value; an unknown key is refused in one line by the section's parser)."""
    p = params(target)
    section = dict(p.get("train_draft") or {})
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--set {item!r} is not KEY=VALUE; for example --set synthetic_prompts=20000")
        section[key] = yaml.safe_load(value)
    section |= {k: v for k, v in (("minutes", minutes), ("device", device)) if v is not None}
    return train_config({**p, "train_draft": section})


def store_weights(draft_dir: Path, dtype: str, shard_mb: float | None) -> None:
    """The draft's model.safetensors as `dtype` (bf16: rounded from the fp32 it trained in; the card's held-out tau
    is the fp32 draft's) and, with `shard_mb`, split into files of at most that size with the index transformers
    and the pipeline read (huggingface_hub's split)."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import load_file, save_file

    path = draft_dir / "model.safetensors"
    weights = {k: v.bfloat16() if dtype == "bf16" else v for k, v in load_file(path).items()}
    split = split_torch_state_dict_into_shards(weights, max_shard_size=int((shard_mb or 1e9) * 1e6))
    path.unlink()
    for name, keys in split.filename_to_tensors.items():
        save_file({k: weights[k] for k in keys}, draft_dir / name, metadata={"format": "pt"})
    if split.is_sharded:
        write_json(draft_dir / "model.safetensors.index.json",
                   {"metadata": split.metadata, "weight_map": split.tensor_to_filename})


def train_outside(target: str, out: Path, config: TrainConfig, command: str, dtype: str = "fp32",
                  shard_mb: float | None = None, state_dir: Path | None = None) -> None:
    """Fetch `target`, train a draft for it with `config` (its `minutes` the whole command's: fetching counts)
    and write the draft at `out` with its card, train_draft.json (`command`: how it was made); with `state_dir`,
    as a campaign that continues the run there (training.state)."""
    started = time.perf_counter()
    training_device(config)  # refused before the target is fetched
    with tempfile.TemporaryDirectory(prefix="train-draft-target.") as scratch:
        target_dir = Path(scratch) / "target"
        fetch("target", target, target_dir)
        fetched = time.perf_counter() - started
        if config.minutes is not None:
            config = replace(config, minutes=config.minutes - fetched / 60)
        if int(os.environ.get("RANK", "0")) != 0:
            train_draft(target_dir, Path(scratch) / "draft", config)
            return
        with staged_dir(out) as tmp:
            card = train_draft(target_dir, tmp, config, live_dir=Path(scratch) / "dvclive", state_dir=state_dir,
                               last_draft=out)
            card["timings"]["seconds"] = {"fetching target": round(fetched, 2), **card["timings"]["seconds"],
                                          "total": round(time.perf_counter() - started, 2)}
            card["versions"] = {"python": sys.version.split()[0], **{
                name: importlib.metadata.version(name) for name in ("torch", "transformers")}}
            card["command"] = command
            card["weights_dtype"] = dtype
            store_weights(tmp, dtype, shard_mb)
            write_json(tmp / "train_draft.json", card)
