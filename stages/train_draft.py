"""Train a DFlash draft for a target: `python -m stages.train_draft TARGET_DIR OUT_DIR`.

The pipeline runs it through `fetch_draft` when `model.draft: train` (settings from the
`train_draft` section of params.yaml); run directly, it trains a draft for any local target
checkpoint. Under `torchrun --nproc_per_node=N` it trains data-parallel; only rank 0 writes.
"""

import os
import tempfile
from pathlib import Path

from dflash_et.files import staged_dir
from dflash_et.params import parse
from dflash_et.training.train import TrainConfig, train_draft
from stages.common import params, run


def train_config(p: dict) -> TrainConfig:
    """The train_draft section, with the draft's embedding scale from model.draft_embed_scale."""
    return parse(TrainConfig, p.get("train_draft"), "train_draft", outside={"embed_scale": p["model"].draft_embed_scale})


def main(argv: list[str]) -> None:
    target_dir, out_dir = map(Path, argv)
    p = params()
    config = train_config(p)
    if int(os.environ.get("RANK", "0")) != 0:
        with tempfile.TemporaryDirectory() as scratch:
            train_draft(target_dir, Path(scratch), config)
        return
    with staged_dir(out_dir) as tmp:
        train_draft(target_dir, tmp, config)


if __name__ == "__main__":
    run(main)
