"""fetch stage: `python -m stages.fetch target|draft` puts the checkpoint named in params.yaml in artifacts/weights/."""

import sys

from dflash_et.checkpoint import fetch
from stages.common import WEIGHTS, params, run


def main() -> None:
    role = sys.argv[1]
    fetch(role, str(params()["model"][role]), WEIGHTS / role, target_dir=WEIGHTS / "target")


if __name__ == "__main__":
    run(main)
