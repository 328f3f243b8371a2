"""Errors a user can fix. The command line prints their message as one line and exits 2."""


class UserError(ValueError):
    """A problem in the user's input or settings; its message says what is wrong and the fix."""


class DataError(UserError):
    """A problem with the documents or the data settings."""


class ConfigError(UserError):
    """An impossible model or training setting."""


class CheckpointError(UserError):
    """A checkpoint that is missing, damaged or from an incompatible version."""
