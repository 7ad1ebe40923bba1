"""Train a DFlash draft for a local target outside the pipeline: `python -m tools.train_draft TARGET_DIR OUT_DIR`.

The pipeline trains one in its `fetch_draft` stage when `model.draft: train`; this takes the same settings (the
`train_draft` section of params.yaml) for any target checkpoint on disk. Under `torchrun --nproc_per_node=N -m
tools.train_draft ...` it trains data-parallel; only rank 0 writes.
"""

import os
import tempfile
from pathlib import Path

from dflash_et.files import staged_dir
from dflash_et.training.train import train_draft
from stages.common import params, run
from stages.fetch_draft import train_config

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
