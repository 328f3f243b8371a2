"""Checkpoints written atomically, each with its SHA-256 recorded beside it
(``last.ckpt.sha256``). They are read, and checked, without Lightning by
:mod:`docclass.artifacts.load`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from docclass.artifacts.hashing import (
    checkpoint_hash_path,
    load_checked_checkpoint,
    recorded_checkpoint_hashes,
    sha256_of,
    write_checkpoint_hashes,
)
from docclass.errors import CheckpointError


def _as_saved(storage: Any, location: str) -> Any:
    """Lightning's default placement: every tensor stays where loading puts it (the CPU)."""
    return storage


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
        target = Path(path).expanduser()
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
            new = sha256_of(partial)
            # The record names both files while one replaces the other, so that a kill at any
            # point leaves a checkpoint its record accepts.
            try:
                old = recorded_checkpoint_hashes(target) if target.exists() else []
            except CheckpointError:  # a damaged record must not stop training
                old = None
            if old is None:
                # The file in place was never checked: no record is written for it, so that
                # a kill before the rename leaves it unchecked, not vouched for.
                checkpoint_hash_path(target).unlink(missing_ok=True)
            else:
                write_checkpoint_hashes(target, [*old, new])
            os.replace(partial, target)
            write_checkpoint_hashes(target, [new])
        finally:
            partial.unlink(missing_ok=True)

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        if "://" not in str(path):
            checkpoint_hash_path(Path(path).expanduser()).unlink(missing_ok=True)

    def load_checkpoint(
        self, path: Any, map_location: Any = _as_saved, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Lightning's own read (a resume, whatever alias named the file): the bytes checked
        against the file's record are the ones unpickled."""
        if "://" in str(path):
            return super().load_checkpoint(path, map_location, weights_only)
        return load_checked_checkpoint(
            Path(path),
            lambda handle: torch.load(handle, map_location=map_location, weights_only=weights_only),
            # None is torch's default, which an environment variable can turn off.
            may_run_code=weights_only is not True,
        )


def link_with_record(trainer: Any, filepath: str, linkpath: str) -> None:
    """Lightning's ``save_last="link"`` with the link's record kept true.

    Lightning replaces ``last.ckpt`` with a link to the newest checkpoint, or with a copy of it
    where links cannot be made (Windows without the right). Either way the record beside
    ``last.ckpt`` was the old file's: a link whose target has no record would be checked by it,
    and a copy always is, so a good file was refused. The old record goes first (a kill
    mid-copy leaves the copy unchecked, not refused); a copy then gets the hashes recorded for
    the file it copies, never a hash of its own bytes, so it is vouched for only as far as that
    file was.
    """
    link, source = Path(linkpath), Path(filepath)
    ours = trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath)
    if ours:
        checkpoint_hash_path(link).unlink(missing_ok=True)
    ModelCheckpoint._link_checkpoint(trainer, filepath, linkpath)
    if ours and not link.is_symlink() and link.is_file():
        try:
            hashes = recorded_checkpoint_hashes(source)
        except CheckpointError:  # a damaged record vouches for nothing, here as on loading
            hashes = None
        if hashes:
            write_checkpoint_hashes(link, hashes)


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt``, written at every epoch's end, validated or not, and after every
    validation pass inside an epoch.

    Lightning's default writes it after validation only where validation is not every epoch's
    end: with ``check_val_every_n_epoch 2`` an unvalidated last epoch was never saved, and the
    after-fit test scored weights no file held. Saved at epoch ends alone, a run validating
    twice an epoch (``val_check_interval 0.5``) lost the mid-epoch resume point it had.
    """

    def __init__(self, dirpath: str | Path) -> None:
        super().__init__(
            dirpath=dirpath,
            filename="last",
            save_top_k=1,
            enable_version_counter=False,
            save_on_train_epoch_end=True,
        )

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        # At an epoch's last batch the epoch's end saves next, with the loop counters a
        # resume into the next epoch reads (EpochEndResume).
        epoch_loop = trainer.fit_loop.epoch_loop
        if epoch_loop.batch_progress.is_last_batch:
            return
        if epoch_loop._should_accumulate():
            # Inside a gradient-accumulation window the pending gradients are in no file: a
            # resume from here trained to other weights (0.0136 away in the review's run).
            return
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))
