"""fetch_target stage: `python -m stages.fetch OUT` puts the checkpoint named by model.target at OUT."""

from pathlib import Path

from dflash_et.checkpoints.fetch import fetch
from dflash_et.params import params
from stages.common import run


def main(argv: list[str]) -> None:
    (out,) = argv
    fetch("target", str(params()["model"].target), Path(out))


if __name__ == "__main__":
    run(main)
