"""The test suite; REPO: the checkout it tests."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
