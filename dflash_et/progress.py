"""The library reports progress through `logging` (a long export, a first llama.cpp build); the entry points
(the DVC stages, `dflash generate`) show it on stdout, as the pipeline's log a user watches."""

import logging
import sys


def show_progress() -> None:
    """dflash_et's INFO lines on stdout, tagged with their module (`[lower] lowering target ...`); once."""
    log = logging.getLogger("dflash_et")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[%(module)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
