"""What every stage command shares: the library's progress lines, and turning known failures into one line.
(params.yaml is read by dflash_et.params, in each stage as in the `dflash` commands that train drafts.)

Paths are not here: dvc.yaml declares them once and passes them to each command. Each section of params.yaml
becomes its dataclass through the one parser (dflash_et.params.parse) in the stage that reads it.
"""

import sys
from collections.abc import Callable

from dflash_et import show_progress


def run(main: Callable[[list[str]], None]) -> None:
    """Run a stage on its command-line arguments; a user error becomes `error: ...` on stderr and exit
    status 1, not a traceback."""
    show_progress()
    try:
        main(sys.argv[1:])
    except ValueError as e:  # UserError and the library's own ValueErrors
        sys.exit(f"error: {e}")
