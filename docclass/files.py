"""Files written whole or not at all, and folders held by one run at a time."""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from typing import IO, Any

from docclass.errors import ConfigError

log = logging.getLogger(__name__)


def write_atomically(path: str | Path, data: bytes | str, durable: bool = False) -> None:
    """``data`` (text as UTF-8) into ``path`` through a hidden temporary file beside it and a
    rename: a process killed mid-write leaves the previous file, or none, never half of one
    (``os.replace`` within one folder is atomic on POSIX and Windows). ``durable`` also
    flushes it to disk before the rename, so that a power cut cannot leave it empty."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(partial, path)


RUN_LOCK = ".docclass-run.lock"


def lock_folder(folder: str | Path, flag: str) -> IO[str] | None:
    """Hold ``folder`` for this process's run, or raise ConfigError naming the one that does.

    Two runs writing into one folder interleave their checkpoints, records, metrics and
    report: each file would be one run's or the other's, with nothing to tell which. The lock
    is the operating system's (``flock``), so a killed run leaves nothing to clean up; it is
    released when the returned handle is closed, or with the process. ``flag`` names the
    setting that chooses the folder. Nothing is held (None) where ``flock`` is missing
    (Windows) or the filesystem refuses it (NFS without its lock daemon, Lustre mounted
    without ``flock``): a warning says so, and the run goes on as before the guard existed.
    """
    try:
        import fcntl
    except ImportError:
        return None
    folder = Path(folder).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / RUN_LOCK, "a+", encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            f"{folder}: cannot write into it ({error.strerror or error}); give {flag} a folder "
            "you can write"
        ) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ConfigError(
            f"{folder}: another docclass run is writing into it ({holder}); wait for it to "
            f"end, or give {flag} another folder"
        ) from None
    except OSError as error:
        handle.close()
        log.warning(
            "%s: its filesystem cannot lock files (%s): nothing stops a second run from "
            "writing into it at the same time",
            folder,
            error.strerror or error,
        )
        return None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    # A forked child (a DataLoader worker) would share the lock and hold the folder after the
    # run; its copy of the handle is closed at once (the parent's hold is untouched).
    os.register_at_fork(after_in_child=handle.close)
    return handle


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection:
# =HYPERLINK(…) in an input's id would leak the sheet when opened); a leading ' makes it text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


# A plain number ("-1", "+0.5", "-2e3") is a value, not a formula: a class named -1 stays -1.
PLAIN_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV text cell that a spreadsheet would run as a formula, with ``'`` in front; one
    that starts with ``'`` too, so that stripping one leading ``'`` always gives the value
    back (``=X`` and ``'=X`` were one cell); any other value, a plain number among them, as it
    is."""
    if isinstance(value, str) and value.startswith("'"):
        return f"'{value}"
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    return value if PLAIN_NUMBER.fullmatch(value) else f"'{value}"
