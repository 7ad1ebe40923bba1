"""What every stage command shares: paths, params.yaml, and turning known failures into one line."""

import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from dflash_et.model import CheckpointError

PARAMS = Path("params.yaml")
WEIGHTS = Path("artifacts/weights")
BUILD = Path("artifacts/build")
PROGRAMS = Path("artifacts/programs")
REPORTS = Path("artifacts/reports")


def params() -> dict:
    return yaml.safe_load(PARAMS.read_text())


def run(main: Callable[[], None]) -> None:
    """Run a stage; a user error becomes `error: ...` on stderr and exit status 1, not a traceback."""
    try:
        main()
    except (CheckpointError, ValueError) as e:
        sys.exit(f"error: {e}")
