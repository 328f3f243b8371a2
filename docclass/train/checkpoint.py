"""Checkpoints written atomically. They are read without Lightning by
:mod:`docclass.artifacts.load`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file beside it, then renames it into place.

    A process killed mid-write leaves the previous checkpoint intact. Lightning's own save goes
    through an fsspec transaction whose temporary file lives in the system temp folder; when
    that is another filesystem (a tmpfs ``/tmp``) the final move is a copy onto the target,
    which a kill can cut short. ``os.replace`` within one folder is atomic on POSIX and Windows.
    Remote URLs (``s3://`` …) keep Lightning's path.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        if "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        # A process killed mid-write (SIGKILL: no clean-up runs) leaves its partial file.
        for stale in target.parent.glob(f".{target.name}.*.partial"):
            if stale != partial:
                stale.unlink(missing_ok=True)
        try:
            with open(partial, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
