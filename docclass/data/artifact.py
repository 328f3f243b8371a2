"""What a trained docclass model carries beyond the weights, and how to read it safely.

A model is a Lightning checkpoint or a model folder (``docclass export``: ``config.json``,
``model.safetensors``, ``tokenizer.json``, ``README.md``), named by its path or, for a folder
on the Hugging Face hub, by its id (``owner/name``, ``owner/name@revision`` to pin a commit).
Lightning writes the checkpoint; the LightningModule adds an ``artifact`` entry of plain types
only (tokenizer JSON, label names, model config, max_tokens), so the whole file loads with
``torch.load(weights_only=True)``: no pickled code is ever executed. A folder's ``config.json``
and ``tokenizer.json`` give the same entries. The DataModule reads them to reuse a trained
model's tokenizer and label order.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from docclass.errors import CheckpointError, one_line

ARTIFACT_KEY = "docclass"
FORMAT_VERSION = 1
MODEL_TYPE = "docclass"  # config.json's model_type in a model folder
FOLDER_FORMAT_VERSION = 1
MODEL_FOLDER_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# owner/name or owner/name@revision, as the hub spells repository ids.
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w.-]+)?$")


def resolve_model(path: str | Path) -> Path:
    """The local file or folder of a model: ``path`` itself when it exists, else a hub
    repository id downloaded (the folder's files only; ``@revision`` pins a commit)."""
    local = Path(path).expanduser()
    if local.exists():
        return local
    if not HUB_ID.match(str(path)) or str(path).endswith(".ckpt"):
        raise CheckpointError(
            f"{path}: checkpoint not found; pass the .ckpt written by 'docclass fit', a folder "
            "written by 'docclass export', or a hub id (owner/name[@revision])"
        )
    repo_id, _, revision = str(path).partition("@")
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id,
            revision=revision or None,
            allow_patterns=[*MODEL_FOLDER_FILES, "README.md"],
        )
    except Exception as error:  # the hub's errors vary: offline, missing repo, gated model
        raise CheckpointError(
            f"{path}: no local file or folder of that name, and the hub download failed "
            f"({one_line(error)}); check the id, or download the folder and pass its path"
        ) from error
    return Path(folder)


def read_folder_config(folder: str | Path) -> dict[str, Any]:
    """A model folder's ``config.json``, checked to be one docclass wrote and can read."""
    folder = Path(folder)
    missing = [name for name in MODEL_FOLDER_FILES if not (folder / name).is_file()]
    if missing:
        run_checkpoint = folder / "checkpoints" / "last.ckpt"
        hint = (
            f"; this is a training run: pass {run_checkpoint}"
            if run_checkpoint.is_file()
            else " (written by 'docclass export')"
        )
        raise CheckpointError(
            f"{folder}: lacks {', '.join(missing)}; a model folder holds "
            f"{', '.join(MODEL_FOLDER_FILES)}{hint}"
        )
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"{path}: not a readable JSON config ({one_line(error)}); export the model again "
            "with 'docclass export'"
        ) from error
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE:
        found = config.get("model_type") if isinstance(config, dict) else None
        raise CheckpointError(
            f"{path}: model_type {found!r} is not {MODEL_TYPE!r}; a docclass model folder is "
            "written by 'docclass export' (a pre-trained encoder goes in model.encoder instead)"
        )
    if config.get("format_version") != FOLDER_FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: model folder format {config.get('format_version')!r}, this docclass reads "
            f"{FOLDER_FORMAT_VERSION}; export it again with this release"
        )
    return config


def folder_label_names(config: dict[str, Any], path: Path) -> list[str]:
    """Label names in class order, refusing maps that disagree: a label mapped to the wrong
    class would make every prediction silently wrong."""
    try:
        id2label = {int(i): str(name) for i, name in config["id2label"].items()}
        label2id = {str(name): int(i) for name, i in config["label2id"].items()}
        count = int(config["num_labels"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(
            f"{path}: id2label, label2id and num_labels are required ({one_line(error)})"
        ) from error
    if sorted(id2label) != list(range(count)):
        raise CheckpointError(f"{path}: id2label must number the classes 0 to {count - 1}")
    if {name: i for i, name in id2label.items()} != label2id:
        raise CheckpointError(
            f"{path}: id2label and label2id disagree, so a class would be reported under "
            "another's name; export the model again"
        )
    return [id2label[i] for i in range(count)]


def folder_artifact(folder: str | Path) -> dict[str, Any]:
    """A model folder's entries in the checkpoint artifact's shape."""
    folder = Path(folder)
    config = read_folder_config(folder)
    path = folder / "tokenizer.json"
    try:
        tokenizer = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"{path}: not a readable tokenizer ({one_line(error)}); export the model again"
        ) from error
    return {
        "format_version": FORMAT_VERSION,
        "model_config": config.get("model_config"),
        "tokenizer": tokenizer,
        "label_names": folder_label_names(config, folder / "config.json"),
        "max_tokens": config.get("max_tokens"),
    }


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
    """The ``artifact`` entry of a checkpoint, or a model folder's (local or hub): tokenizer
    JSON, label names, model config, max_tokens."""
    local = resolve_model(path)
    if local.is_dir():
        return folder_artifact(local)
    return read_artifact_from(load_checkpoint(local), path)


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
