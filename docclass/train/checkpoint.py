"""A trained classifier rebuilt from a checkpoint or a model folder, and checkpoints written
atomically.

The checkpoint's artifact (:mod:`docclass.data.artifact`) holds plain types only and a model
folder (:mod:`docclass.train.model_folder`) holds safetensors and JSON, so loading runs no
training code and executes no pickle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from tokenizers import Tokenizer

from docclass.data.artifact import load_checkpoint, read_artifact_from, resolve_model
from docclass.data.tokenizer import load_tokenizer
from docclass.errors import CheckpointError, one_line
from docclass.nn.model import DocumentClassifier, ModelConfig
from docclass.train.model_folder import load_model_folder


@dataclass
class TrainedClassifier:
    """A checkpoint's network (in eval mode), tokenizer, label names and token limit."""

    model: DocumentClassifier
    tokenizer: Tokenizer
    label_names: list[str]
    max_tokens: int | None
    # A model folder's config.json (its facts: default word-score method, scores, origin);
    # empty for a checkpoint.
    folder_config: dict[str, Any] = field(default_factory=dict)


def load_classifier(path: str | Path) -> TrainedClassifier:
    """Rebuild a trained classifier from a checkpoint, a model folder or a hub id: no training
    code, no pickle executed."""
    local = resolve_model(path)
    if local.is_dir():
        model, tokenizer, labels, config = load_model_folder(local)
        return TrainedClassifier(model, tokenizer, labels, config.get("max_tokens"), config)
    checkpoint = load_checkpoint(local)
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
