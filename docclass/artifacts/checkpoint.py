"""Training checkpoints (``.ckpt``) read without Lightning and without executing pickled code,
and checked against the SHA-256 docclass recorded beside them when it wrote them.

Lightning writes the checkpoint; the LightningModule adds an artifact entry of plain types only
(tokenizer JSON, label names, model config, max_tokens), so the whole file loads with
``torch.load(weights_only=True)``. Reading one imports neither Lightning nor any training code.
"""

from __future__ import annotations

import errno
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from docclass.artifacts.hashing import load_checked_checkpoint
from docclass.errors import CheckpointError, one_line

ARTIFACT_KEY = "docclass"
FORMAT_VERSION = 1
MODEL_PREFIX = "model."  # the LightningModule keeps the network under .model
UNREADABLE = {errno.EACCES, errno.EPERM, errno.EIO, errno.EISDIR, errno.ENOENT}


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file without executing pickled code."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(
            f"{path}: checkpoint not found; pass the .ckpt written by 'docclass fit'"
        )
    try:
        return load_checked_checkpoint(
            path, lambda handle: torch.load(handle, map_location="cpu", weights_only=True)
        )
    except CheckpointError:
        raise
    except OSError as error:
        # torch.load says "Invalid argument" (EINVAL) of many damaged files: only these
        # numbers mean the file could not be read at all, whatever its bytes.
        if error.errno in UNREADABLE:
            raise CheckpointError(
                f"{error.filename or path}: cannot be read ({error.strerror}); check its "
                "permissions and the disk, or use another checkpoint"
            ) from error
        raise _not_loadable(path, error) from error
    except (
        RuntimeError,
        EOFError,
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        ValueError,
    ) as error:
        raise _not_loadable(path, error) from error


def _not_loadable(path: Path, error: BaseException) -> CheckpointError:
    return CheckpointError(
        f"{path}: not a loadable checkpoint (truncated, corrupted or unsafe: {one_line(error)})"
    )


def read_artifact_from(checkpoint: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """The artifact of an already loaded checkpoint; ``path`` names it in errors."""
    artifact = checkpoint.get(ARTIFACT_KEY)
    if not isinstance(artifact, dict):
        raise CheckpointError(f"{path}: has no docclass artifact; it was not written by docclass")
    version = artifact.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written in docclass checkpoint format {version}, this version reads "
            f"{FORMAT_VERSION}; retrain or use the docclass release that wrote it"
        )
    return artifact


def network_weights(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The network's tensors from a checkpoint's state dict, under the network's own names."""
    return {
        key.removeprefix(MODEL_PREFIX): value
        for key, value in checkpoint.get("state_dict", {}).items()
        if key.startswith(MODEL_PREFIX) and isinstance(value, torch.Tensor)
    }
