"""What every stage command shares: params.yaml, and turning known failures into one line.

Paths are not here: dvc.yaml declares them once and passes them to each command.
"""

import sys
from collections.abc import Callable
from pathlib import Path

import yaml

PARAMS = Path("params.yaml")


def params() -> dict:
    return yaml.safe_load(PARAMS.read_text())


def run(main: Callable[[list[str]], None]) -> None:
    """Run a stage on its command-line arguments; a user error becomes `error: ...` on stderr and exit
    status 1, not a traceback."""
    try:
        main(sys.argv[1:])
    except ValueError as e:  # UserError and the library's own ValueErrors
        sys.exit(f"error: {e}")
