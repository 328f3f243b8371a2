"""Errors a user can fix. The command line prints their message as one line and exits 2."""


def one_line(error: BaseException) -> str:
    """An exception as ``Type: first line of its message`` (at most 300 characters)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__


class UserError(ValueError):
    """A problem in the user's input or settings; its message says what is wrong and the fix."""


class DataError(UserError):
    """A problem with the documents or the data settings."""


class ConfigError(UserError):
    """An impossible model or training setting."""


class CheckpointError(UserError):
    """A checkpoint that is missing, damaged or from an incompatible version."""


class RunStopped(UserError):
    """A bulk run that stopped part-way; the message says how far it got and how to resume."""


class TrainingDiverged(UserError):
    """The loss stopped being a finite number; the message names the last good checkpoint."""
