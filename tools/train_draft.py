"""Train a DFlash draft for any target, outside the pipeline, on a GPU when there is one.

`python -m tools.train_draft TARGET OUT [--minutes M] [--device auto|cpu|cuda] [--set KEY=VALUE ...]`.

TARGET is fetched as the pipeline fetches model.target: a `.gguf` file, a Hugging Face checkpoint directory,
or a built-in name (`builtin`, `smollm2`, ...). The settings are params.yaml's train_draft section (with
export.max_seq_len, the positions it trains at), then each `--set` (`--set synthetic_prompts=20000`). It needs
only torch, transformers, safetensors, tokenizers and PyYAML (gguf and accelerate for a .gguf target): no ExecuTorch and no DVC,
which a bare GPU machine lacks. OUT gets the draft in z-lab's layout and its card, train_draft.json, with what
the pipeline's copy leaves out: seconds per phase, throughput, the device, the versions and this command. Ship
it as drafts/<name>/ and `model.draft: auto` takes it for that target. Under `torchrun --nproc_per_node=N -m
tools.train_draft ...` it trains data-parallel; only rank 0 writes.
"""

import argparse
import importlib.metadata
import os
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

from dflash_et.checkpoints.fetch import fetch
from dflash_et.files import staged_dir, write_json
from dflash_et.training.config import training_device
from dflash_et.training.train import train_draft
from stages.common import params, run
from stages.fetch_draft import train_config


def settings(target: str, sets: list[str], minutes: float | None, device: str | None):
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


def main(argv: list[str]) -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="a .gguf file, a checkpoint directory, or a built-in name (smollm2, builtin)")
    parser.add_argument("out", type=Path, help="the draft's folder (z-lab layout and its card), written whole or not at all")
    parser.add_argument("--minutes", type=float, help="wall clock of the whole command: training ends sooner to fit "
                        "(train_draft.minutes; default: none, train_draft.steps and compute_budget decide)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"),
                        help="train_draft.device (auto: CUDA when there is one; on a 2-core CPU the default settings "
                             "take ~25 minutes for SmolLM2, an H200 is meant to take --minutes 8.5)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a train_draft setting of params.yaml, repeatable: --set synthetic_prompts=12000")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the saved weights' (bf16: half the size, how a draft ships in drafts/)")
    parser.add_argument("--shard-mb", type=float, help="weights in files of at most this many MB, with an index "
                        "(a device machine returns files of at most 16 MiB; a DFlash2 draft's codebooks are larger)")
    args = parser.parse_args(argv)
    config = settings(args.target, args.set, args.minutes, args.device)
    training_device(config)  # refused before the target is fetched
    with tempfile.TemporaryDirectory(prefix="train-draft-target.") as scratch:
        target_dir = Path(scratch) / "target"
        fetch("target", args.target, target_dir)
        fetched = time.perf_counter() - started
        if config.minutes is not None:
            config = replace(config, minutes=config.minutes - fetched / 60)
        if int(os.environ.get("RANK", "0")) != 0:
            train_draft(target_dir, Path(scratch) / "draft", config)
            return
        with staged_dir(args.out) as tmp:
            card = train_draft(target_dir, tmp, config, live_dir=Path(scratch) / "dvclive")
            card["timings"]["seconds"] = {"fetching target": round(fetched, 2), **card["timings"]["seconds"],
                                          "total": round(time.perf_counter() - started, 2)}
            card["versions"] = {"python": sys.version.split()[0], **{
                name: importlib.metadata.version(name) for name in ("torch", "transformers")}}
            card["command"] = shlex.join(["python", "-m", "tools.train_draft", *argv])
            card["weights_dtype"] = args.dtype
            store_weights(tmp, args.dtype, args.shard_mb)
            write_json(tmp / "train_draft.json", card)


if __name__ == "__main__":
    run(main)
