"""What a docclass checkpoint carries beyond the weights, and how to read it safely.

Lightning writes the checkpoint; :class:`docclass.lit_module.DocClassifierModule` adds an
``artifact`` entry of plain types only (strings, numbers, lists, dicts), so the whole file
loads with ``torch.load(weights_only=True)``: no pickled code is ever executed.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from tokenizers import Tokenizer

from docclass.errors import CheckpointError, one_line
from docclass.model import DocumentClassifier, ModelConfig
from docclass.tokenizer import load_tokenizer

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


@dataclass
class TrainedClassifier:
    """A checkpoint's network (in eval mode), tokenizer, label names and token limit."""

    model: DocumentClassifier
    tokenizer: Tokenizer
    label_names: list[str]
    max_tokens: int | None


def load_classifier(path: str | Path) -> TrainedClassifier:
    """Rebuild a trained classifier from a checkpoint: no training code, no pickle executed."""
    checkpoint = load_checkpoint(path)
    artifact = read_artifact_from(checkpoint, path)
    if not artifact.get("tokenizer"):
        raise CheckpointError(f"{path}: carries no tokenizer; it was saved before training began")
    model = DocumentClassifier(ModelConfig(**artifact["model_config"]))
    prefix = "model."
    weights = {
        key[len(prefix) :]: value
        for key, value in checkpoint.get("state_dict", {}).items()
        if key.startswith(prefix)
    }
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        raise CheckpointError(
            f"{path}: weights do not fit the stored model config ({one_line(error)})"
        ) from error
    return TrainedClassifier(
        model=model.eval(),
        tokenizer=load_tokenizer(artifact["tokenizer"]),
        label_names=list(artifact["label_names"]),
        max_tokens=artifact.get("max_tokens"),
    )


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
        try:
            with open(partial, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
