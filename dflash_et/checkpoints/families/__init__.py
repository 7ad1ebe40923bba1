"""The target families, one module each in this folder, found by listing it: a new family is one file that
defines `FAMILY` (a `base.Family`), and load, zlab, builtin and from_gguf serve it through this registry."""

import importlib
import pkgutil

from transformers import PretrainedConfig

from dflash_et.checkpoints.families.base import Family
from dflash_et.errors import CheckpointError

REGISTRY: dict[str, Family] = {}  # by family name, in the order of the folder's sorted file names


def register(family: Family) -> Family:
    """Add a family; a model_type two families claim is a programming error."""
    taken = sorted(set(family.model_types) & set(model_types()))
    if taken or family.name in REGISTRY:
        raise ValueError(f"family {family.name!r}: {taken or family.name} already registered")
    REGISTRY[family.name] = family
    return family


def model_types() -> tuple[str, ...]:
    """Every model_type some family claims (the supported targets)."""
    return tuple(t for family in REGISTRY.values() for t in family.model_types)


def claiming(model_type: str | None) -> Family | None:
    return next((f for f in REGISTRY.values() if model_type in f.model_types), None)


def family_of(config: PretrainedConfig, role: str = "target") -> Family:
    """The family of `config`, or the one-line refusal of a model_type no family claims."""
    family = claiming(config.model_type)
    if family is None:
        raise CheckpointError(f"{role} model_type {config.model_type!r} is not supported; use one of {model_types()}")
    return family


def builtins() -> dict[str, Family]:
    """The families with a built-in tiny target, by name."""
    return {name: f for name, f in REGISTRY.items() if f.builtin is not None}


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "base":
        register(importlib.import_module(f"{__name__}.{_module}").FAMILY)
