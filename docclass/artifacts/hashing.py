"""SHA-256s of model files, a model folder's manifest, and a fingerprint of a network's weights.

The manifest (``manifest.json``) lists the hash of every file an exported folder holds, itself
excepted. It catches a damaged download, a file swapped in from another export, and an edited
``config.json`` (a relabelled ``id2label`` included); it is not a signature: whoever can rewrite
the folder can rewrite the manifest too.

The fingerprint names a set of weights independently of the file they were saved in, so a
figure measured on one checkpoint (a test score, a faithfulness table) can be told apart from
another checkpoint of the same run.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import torch

from docclass.errors import CheckpointError
from docclass.files import write_atomically

MANIFEST = "manifest.json"
T = TypeVar("T")

log = logging.getLogger(__name__)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# Beside every checkpoint docclass writes: ``last.ckpt.sha256`` in ``sha256sum``'s format.
CHECKPOINT_HASH_SUFFIX = ".sha256"


def checkpoint_hash_path(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + CHECKPOINT_HASH_SUFFIX)


def recorded_checkpoint_hashes(checkpoint: Path) -> list[str] | None:
    """The SHA-256s the checkpoint may have (one; two while a save replaces it), or None when
    nothing is recorded beside it (written elsewhere, or by an earlier docclass)."""
    record = checkpoint_hash_path(checkpoint)
    if not record.is_file():
        return None
    lines = record.read_text(encoding="utf-8", errors="replace").splitlines()
    hashes = [line.split()[0] for line in lines if line.strip()]
    if not hashes or not all(len(h) == 64 and set(h) <= set("0123456789abcdef") for h in hashes):
        raise CheckpointError(
            f"{record}: not a SHA-256 record of {checkpoint.name}; delete it only if you trust "
            "the checkpoint"
        )
    return hashes


def write_checkpoint_hashes(checkpoint: Path, hashes: list[str]) -> None:
    """Record ``hashes`` as the ones ``checkpoint`` may have: through a temporary file and a
    rename, flushed to disk first, so that a crash leaves the old record or the new one."""
    lines = "".join(f"{h}  {checkpoint.name}\n" for h in hashes)
    write_atomically(checkpoint_hash_path(checkpoint), lines, durable=True)


def _handle_key(handle: BinaryIO, hashes: list[str] | None) -> tuple:
    """What changes whenever an open file's bytes do: the change time cannot be set back."""
    stat = os.fstat(handle.fileno())
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns,
            tuple(hashes or ()))  # fmt: skip


def load_checked_checkpoint(
    checkpoint: Path, load: Callable[[BinaryIO], T], may_run_code: bool = False
) -> T:
    """``load`` of a checkpoint's open file, once its bytes are checked against the SHA-256
    docclass recorded beside it when it wrote them.

    Hashed and unpickled through one open handle: a file renamed into its place meanwhile is
    not read, and one written in place is refused (its change time moves). Streamed, so a
    checkpoint is never held twice in memory; but a ``load`` that ``may_run_code``
    (``weights_only`` off) gets the very bytes that were hashed, read whole first, since a
    write in place between the hash and the load would run before it was noticed. A link is
    checked by the record beside the file it names (Lightning's ``save_last="link"`` leaves
    the link's own record stale), else by the link's own. A checkpoint without a record
    (written by Lightning alone, copied without it, an earlier docclass) loads with a warning:
    ``weights_only`` still keeps its code from running.
    """
    named = Path(checkpoint).expanduser()
    real = named.resolve()
    owner, hashes = _record_for(named, real)
    with open(real, "rb") as handle:
        key = _handle_key(handle, hashes)
        whole = handle.read() if may_run_code else None
        # A command reads its checkpoint several times (sizes, artifact, weights): hashed
        # once, for as long as the file is the one hashed.
        if key not in _VERIFIED:
            if hashes is None:
                log.warning(
                    "%s: no SHA-256 recorded beside it (%s), so it is loaded unchecked",
                    checkpoint,
                    checkpoint_hash_path(real).name,
                )
            elif (digest := _sha256_of_handle(handle, whole)) not in hashes:
                # A save may have renamed a new file into place, and recorded it, between the
                # record's read and the open: the record as it is now holds the bytes hashed.
                owner, hashes = _record_for(named, real)
                if hashes is None or digest not in hashes:
                    raise CheckpointError(
                        f"{checkpoint}: its SHA-256 is not the one recorded in "
                        f"{checkpoint_hash_path(owner).name} when docclass wrote it (changed or "
                        "damaged since); use another checkpoint, or delete the record only if "
                        "you trust it"
                    )
                key = _handle_key(handle, hashes)
        handle.seek(0)
        loaded = load(io.BytesIO(whole) if whole is not None else handle)
        if _handle_key(handle, hashes) != key:
            raise CheckpointError(
                f"{checkpoint}: changed while it was read; load it once nothing writes it"
            )
    _VERIFIED.add(key)
    return loaded


def has_recorded_hash(checkpoint: str | Path) -> bool:
    """Whether a SHA-256 record beside the checkpoint (or beside a link to it) checks it."""
    named = Path(checkpoint).expanduser()
    return _record_for(named, named.resolve())[1] is not None


def _record_for(named: Path, real: Path) -> tuple[Path, list[str] | None]:
    """Whose record checks a checkpoint, and its hashes: the file's, else a link's own."""
    hashes = recorded_checkpoint_hashes(real)
    if hashes is None and named.is_symlink():
        return named, recorded_checkpoint_hashes(named)
    return real, hashes


def _sha256_of_handle(handle: BinaryIO, whole: bytes | None) -> str:
    """The SHA-256 of ``whole`` when read already, else of the handle's bytes, streamed."""
    digest = hashlib.sha256(whole or b"")
    if whole is None:
        handle.seek(0)
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_VERIFIED: set[tuple] = set()


def weights_fingerprint(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, shape and values, in name order.

    Floating tensors are hashed as float32 values, whatever their dtype: a model trained in
    ``bf16-true`` is tested (and its report made) with bfloat16 weights but rebuilt from its
    checkpoint in float32, and the same weights must give the same fingerprint either way
    (bfloat16 and float16 widen to float32 exactly)."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu()
        if tensor.is_floating_point():
            tensor = tensor.float()
        digest.update(f"{name}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_manifest(folder: Path, files: list[str]) -> dict[str, Any]:
    manifest = {"sha256": {name: sha256_of(folder / name) for name in sorted(files)}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def verify_manifest(folder: Path, required: tuple[str, ...]) -> None:
    """Refuse a folder whose files are not the ones its manifest lists, byte for byte."""
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"{path}: missing, so the folder's files cannot be checked; export the model again "
            "with this docclass"
        )
    try:
        listed = json.loads(path.read_text(encoding="utf-8"))["sha256"]
        listed = {str(name): str(value) for name, value in listed.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path}: not a docclass manifest ({error}); export again") from error
    unlisted = [name for name in required if name not in listed]
    if unlisted:
        raise CheckpointError(f"{path}: does not cover {', '.join(unlisted)}; export again")
    for name, expected in listed.items():
        file = folder / name
        if Path(name).name != name or not file.is_file():
            raise CheckpointError(f"{path}: lists {name!r}, which the folder lacks; export again")
        found = sha256_of(file)
        if found != expected:
            raise CheckpointError(
                f"{file}: its SHA-256 {found[:12]}… is not the {expected[:12]}… that "
                f"{MANIFEST} records (edited, replaced or damaged); export the model again"
            )
