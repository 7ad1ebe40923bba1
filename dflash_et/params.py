"""params.yaml: the file read whole (`params`: its sections checked, `model` parsed, prompt sets at `auto`
resolved), as the stages and the `dflash` commands that train drafts read it from the project's root, and the one
parser of its sections: each becomes its dataclass (`ExportConfig`, `ValidateConfig`, `BenchConfig`, `PeerConfig`,
`TrainConfig`, `Model`) through `parse`, strictly, in the command that reads it.

params.yaml holds every setting's default and its one description (its comment there; the dataclasses' fields
carry none, so the two cannot disagree); a dataclass default stands for a key a library caller (a test, a tool)
leaves out, and tests/test_params.py holds each equal to params.yaml's, so the two cannot drift.
"""

from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import TypeVar, get_origin, get_type_hints

import yaml

from dflash_et.errors import UserError

T = TypeVar("T")
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
    if not PARAMS.is_file():
        raise UserError(f"no {PARAMS} in {Path.cwd()}; run this from the project's root (where dvc.yaml is)")
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


def parse(cls: type[T], values: dict | None, name: str, *, outside: dict | None = None,
          error: type[UserError] = UserError) -> T:
    """The dataclass `cls` of params.yaml's section `name` (`bench`, `validate.sampling`). A key that is not
    one of its fields, or a field left out that has no default, is `error`, one line that names the key and
    what the section takes. A field whose type is a dataclass is parsed as a section of its own; a tuple's
    value comes from a list. `outside`: fields set from elsewhere than this section (not settings of it)."""
    outside = outside or {}
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise error(f"{name} must be a section of settings (key: value), got {values!r}")
    known = [f.name for f in fields(cls) if f.name not in outside]
    check_keys(values, known, name, error)
    for f in fields(cls):
        if f.name in known and f.name not in values and f.default is MISSING and f.default_factory is MISSING:
            raise error(f"{name}.{f.name} is missing; the {name} section takes {', '.join(known)}")
    hints = get_type_hints(cls)
    parsed = {key: _value(hints[key], value, f"{name}.{key}", error) for key, value in values.items()}
    return cls(**parsed, **outside)


def check_keys(values: dict, known: Iterable[str], name: str, error: type[UserError] = UserError) -> None:
    """Refuse, in one line, a key of `values` (section `name`; "" for params.yaml's top level) not in `known`."""
    known = list(known)
    unknown = [key for key in values if key not in known]
    if not unknown:
        return
    if name:
        raise error(f"{name}.{unknown[0]} is not a setting; the {name} section takes {', '.join(known)}")
    raise error(f"{unknown[0]} is not a section of params.yaml; it has {', '.join(known)}")


def _value(hint, value, name: str, error: type[UserError]):
    if isinstance(hint, type) and is_dataclass(hint) and not isinstance(value, hint):
        return parse(hint, value, name, error=error)
    if get_origin(hint) is tuple and isinstance(value, list):
        return tuple(value)
    return value
