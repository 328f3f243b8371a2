"""Files written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


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
