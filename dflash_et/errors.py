"""Errors a user can fix: each message is one line that names the problem and the fix.

Stages and the CLI turn these into `error: ...` and a non-zero exit instead of a traceback.
"""

from pathlib import Path

# How to get a missing or damaged shipped file back (the programs and what ships beside them, or the target's
# files), worded once for both runners: the C++ runner's build reads the same file (runner/CMakeLists.txt).
REBUILD = (Path(__file__).parent / "rebuild.txt").read_text().strip()


class UserError(ValueError):
    """Bad input or settings, said in one line with what to do."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used."""


class ExportError(UserError):
    """Export settings that cannot work."""


class ProgramError(UserError):
    """A program file that cannot be loaded or does not belong with the others."""
