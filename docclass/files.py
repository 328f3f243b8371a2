"""Files written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | Path, data: bytes | str) -> None:
    """``data`` (text as UTF-8) into ``path`` through a hidden temporary file beside it and a
    rename: a process killed mid-write leaves the previous file, or none, never half of one
    (``os.replace`` within one folder is atomic on POSIX and Windows)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(partial, path)
