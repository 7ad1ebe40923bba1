"""fetch stage: `python -m stages.fetch target|draft` puts the checkpoint named in params.yaml in artifacts/weights/."""

import sys

from dflash_et.checkpoint import fetch
from dflash_et.train import TrainConfig
from stages.common import WEIGHTS, params, run


def main() -> None:
    role, p = sys.argv[1], params()
    fetch(role, str(p["model"][role]), WEIGHTS / role, target_dir=WEIGHTS / "target",
          train=TrainConfig(**p.get("train_draft", {})))


if __name__ == "__main__":
    run(main)
