"""What every stage command shares: params.yaml, and turning known failures into one line.

Paths are not here: dvc.yaml declares them once and passes them to each command. Each section of params.yaml
becomes its dataclass through the one parser (dflash_et.params.parse) in the stage that reads it.
"""

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from dflash_et.params import check_keys, parse

PARAMS = Path("params.yaml")
SECTIONS = ("block_size", "model", "export", "validate", "bench", "peer_bench", "peers", "train_draft")


@dataclass(frozen=True)
class Model:
    """The `model` section of params.yaml (what each takes: its comments there)."""

    target: str = "builtin"
    draft: str = "auto"
    draft_embed_scale: float | None = None


def params(target: str | None = None) -> dict:
    """params.yaml, its sections those of `SECTIONS` (another is refused in one line), `model` parsed (a `Model`;
    `target`, when given, replaces model.target), and every prompt set left at `auto` resolved for model.target
    (see prompt_set)."""
    p = yaml.safe_load(PARAMS.read_text()) or {}
    check_keys(p, SECTIONS, "")
    p["model"] = parse(Model, p.get("model"), "model")
    if target:
        p["model"] = replace(p["model"], target=target)
    for section, key in (("train_draft", "prompts"), ("validate", "prompt_set"), ("bench", "prompts")):
        if (p.get(section) or {}).get(key) == "auto":
            p[section][key] = prompt_set(str(p["model"].target))
    return p


def prompt_set(target: str) -> str:
    """`auto`: the built-in targets know only the project's corpus (`builtin`); any other target is a real
    assistant and gets the assistant prompt set (dflash_et/data/assistant_prompts.jsonl)."""
    return "builtin" if target.startswith("builtin") else "assistant"


def show_progress() -> None:
    """The library reports progress through `logging` (a long export, llama.cpp's first build); a stage shows
    dflash_et's INFO lines on stdout, tagged with their module (`[lower] lowering target ...`), once: not also
    through the root logger, which a dependency configures on import (a second `INFO:dflash_et...` copy)."""
    log = logging.getLogger("dflash_et")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[%(module)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def run(main: Callable[[list[str]], None]) -> None:
    """Run a stage on its command-line arguments; a user error becomes `error: ...` on stderr and exit
    status 1, not a traceback."""
    show_progress()
    try:
        main(sys.argv[1:])
    except ValueError as e:  # UserError and the library's own ValueErrors
        sys.exit(f"error: {e}")
