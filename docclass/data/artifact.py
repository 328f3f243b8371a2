"""What a docclass checkpoint carries beyond the weights, and how to read it safely.

Lightning writes the checkpoint; the LightningModule adds an ``artifact`` entry of plain types
only (tokenizer JSON, label names, model config, max_tokens), so the whole file loads with
``torch.load(weights_only=True)``: no pickled code is ever executed. The DataModule reads it to
reuse a trained model's tokenizer and label order.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from docclass.errors import CheckpointError, one_line

ARTIFACT_KEY = "docclass"
FORMAT_VERSION = 1


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file without executing pickled code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"{path}: checkpoint not found; pass the .ckpt written by 'docclass fit'"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (
        RuntimeError,
        EOFError,
        OSError,
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        ValueError,
    ) as error:
        raise CheckpointError(
            f"{path}: not a loadable checkpoint (truncated, corrupted or unsafe: {one_line(error)})"
        ) from error


def read_artifact(path: str | Path) -> dict[str, Any]:
    """The ``artifact`` entry: tokenizer JSON, label names, model config, max_tokens."""
    return read_artifact_from(load_checkpoint(path), path)


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
