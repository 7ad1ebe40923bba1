"""Train a DFlash draft for a target: `python -m stages.train_draft TARGET_DIR OUT_DIR`.

The pipeline runs it through `fetch_draft` when `model.draft: train` (settings from the
`train_draft` section of params.yaml); run directly, it trains a draft for any local target
checkpoint. Under `torchrun --nproc_per_node=N` it trains data-parallel.
"""

import os
import sys
import tempfile
from pathlib import Path

from dflash_et.files import staged_dir
from dflash_et.train import TrainConfig, train_draft
from stages.common import params, run


def train(target_dir: Path, out_dir: Path) -> None:
    config = TrainConfig(**params().get("train_draft", {}))
    if int(os.environ.get("RANK", "0")) != 0:  # torchrun: only rank 0 writes
        train_draft(target_dir, Path(tempfile.mkdtemp()), config)
        return
    with staged_dir(out_dir) as tmp:
        train_draft(target_dir, tmp, config)


def main() -> None:
    train(Path(sys.argv[1]), Path(sys.argv[2]))


if __name__ == "__main__":
    run(main)
