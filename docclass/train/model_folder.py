"""Model folders: a trained classifier in the layout the Hugging Face hub hosts.

A folder holds ``config.json`` (the model config, label names in ``id2label`` order, the token
limit, the SHA-256 of the weights, and the facts the exporter adds), ``model.safetensors`` (the
network's tensors: no pickle anywhere), ``tokenizer.json`` and a ``README.md`` model card
(written by :mod:`docclass.inference.export`). Before a prediction is made, loading checks that
the pieces agree: weights whose hash is not the config's, label maps that disagree, or tensors
that do not fit the model config are refused with one line naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from docclass.data.artifact import (
    FOLDER_FORMAT_VERSION,
    MODEL_TYPE,
    folder_label_names,
    read_folder_config,
)
from docclass.data.pretrained import sha256_of
from docclass.errors import CheckpointError, one_line
from docclass.nn.model import DocumentClassifier, ModelConfig


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def write_model_folder(
    model: DocumentClassifier,
    tokenizer: Tokenizer,
    label_names: list[str],
    max_tokens: int | None,
    out: str | Path,
    facts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``config.json``, ``model.safetensors`` and ``tokenizer.json`` into ``out``.

    ``facts`` (JSON types) join the config: where the model started, how it scored, its default
    word-score method. Returns the config written.
    """
    from safetensors.torch import save

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # Contiguous copies: safetensors stores raw buffers and refuses tensors sharing memory.
    tensors = {
        name: tensor.detach().cpu().contiguous().clone()
        for name, tensor in model.state_dict().items()
    }
    weights = save(tensors, metadata={"format": "pt", "model_type": MODEL_TYPE})
    _write_atomically(out / "model.safetensors", weights)
    _write_atomically(out / "tokenizer.json", tokenizer.to_str(pretty=True).encode())
    names = list(label_names)
    config = {
        "model_type": MODEL_TYPE,
        "architectures": ["DocumentClassifier"],
        "format_version": FOLDER_FORMAT_VERSION,
        "num_labels": len(names),
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
        "max_tokens": max_tokens,
        "model_config": model.config.to_dict(),
        "weights_sha256": sha256_of(out / "model.safetensors"),
        **(facts or {}),
    }
    _write_atomically(out / "config.json", (json.dumps(config, indent=2) + "\n").encode())
    return config


def load_model_folder(
    folder: str | Path,
) -> tuple[DocumentClassifier, Tokenizer, list[str], dict[str, Any]]:
    """A model folder's network (eval mode), tokenizer, label names and config; no pickle."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    config = read_folder_config(folder)  # also checks that the three files are there
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    recorded = config.get("weights_sha256")
    if recorded is not None and sha256_of(weights_path) != recorded:
        raise CheckpointError(
            f"{weights_path}: its SHA-256 is not the {str(recorded)[:12]}… that config.json "
            "records (replaced or damaged); export the model again"
        )
    labels = folder_label_names(config, config_path)
    try:
        model_config = ModelConfig(**config["model_config"])
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"{config_path}: model_config unusable ({one_line(error)})"
        ) from error
    if model_config.num_classes != len(labels):
        raise CheckpointError(
            f"{config_path}: model_config has {model_config.num_classes} classes but id2label "
            f"names {len(labels)}; export the model again"
        )
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(
            f"{weights_path}: not a readable safetensors file ({one_line(error)})"
        ) from error
    model = DocumentClassifier(model_config)
    try:
        model.load_state_dict(tensors)
    except RuntimeError as error:
        raise CheckpointError(
            f"{weights_path}: tensors do not fit config.json's model_config ({one_line(error)})"
        ) from error
    tokenizer_path = folder / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as error:  # the Rust side raises a plain Exception for a bad file
        raise CheckpointError(
            f"{tokenizer_path}: not a readable tokenizer ({one_line(error)})"
        ) from error
    if tokenizer.get_vocab_size() > model_config.vocab_size:
        raise CheckpointError(
            f"{tokenizer_path}: {tokenizer.get_vocab_size()} tokens, more than the model's "
            f"{model_config.vocab_size} embedding rows; it belongs to another model"
        )
    return model.eval(), tokenizer, labels, config
