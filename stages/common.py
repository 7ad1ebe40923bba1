"""What every stage command shares: params.yaml (read by dflash_et.params, as the `dflash` commands that train
drafts read it), the library's progress lines, and turning known failures into one line.

Paths are not here: dvc.yaml declares them once and passes them to each command. Each section of params.yaml
becomes its dataclass through the one parser (dflash_et.params.parse) in the stage that reads it.
"""

import sys
from collections.abc import Callable

from dflash_et import show_progress
from dflash_et.params import params  # noqa: F401  (each stage's `from stages.common import params`)


def run(main: Callable[[list[str]], None]) -> None:
    """Run a stage on its command-line arguments; a user error becomes `error: ...` on stderr and exit
    status 1, not a traceback."""
    show_progress()
    try:
        main(sys.argv[1:])
    except ValueError as e:  # UserError and the library's own ValueErrors
        sys.exit(f"error: {e}")
