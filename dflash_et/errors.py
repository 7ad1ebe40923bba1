"""Errors a user can fix: each message is one line that names the problem and the fix.

Stages and the CLI turn these into `error: ...` and a non-zero exit instead of a traceback.
"""


class UserError(ValueError):
    """Bad input or settings, said in one line with what to do."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used."""


class ExportError(UserError):
    """Export settings that cannot work."""


class ProgramError(UserError):
    """A program file that cannot be loaded or does not belong with the others."""
