"""Shared fixtures. Anything slow (generating the pair, loading models, lowering) happens once per session."""

import os
from pathlib import Path

import pytest

from dflash_et.checkpoint import fetch

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The built-in (target, draft) checkpoint directories, fetched as the pipeline does."""
    root = tmp_path_factory.mktemp("weights")
    fetch("target", "builtin", root / "target")
    fetch("draft", "builtin", root / "draft", target_dir=root / "target")
    return root / "target", root / "draft"
