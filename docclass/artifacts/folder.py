"""Model folders: a trained classifier in the layout the Hugging Face hub hosts.

A folder holds ``config.json`` (the model config, label names in ``id2label`` order, the token
limit, and the facts the exporter adds), ``model.safetensors`` (the network's tensors: no
pickle anywhere), ``tokenizer.json``, a ``README.md`` model card (written by
:mod:`docclass.inference.export`) and ``manifest.json``, the SHA-256 of every other file.
Before a prediction is made, loading checks the manifest, that the label maps agree, and that
the tensors fit the model config (before anything is allocated); each refusal is one line
naming the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from docclass.artifacts.building import build_classifier, model_config_from
from docclass.artifacts.checkpoint import FORMAT_VERSION
from docclass.artifacts.hashing import MANIFEST, verify_manifest, write_manifest
from docclass.errors import CheckpointError, ConfigError, one_line
from docclass.files import write_atomically
from docclass.nn.model import DocumentClassifier

MODEL_TYPE = "docclass"  # config.json's model_type in a model folder
# 2: every file covered by manifest.json (format 1 hashed the weights only, and optionally).
FOLDER_FORMAT_VERSION = 2
MODEL_FOLDER_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# config.json's split.sha256: the fingerprint of the split the exported checkpoint trained on,
# so a report of the folder from a config refuses held-out documents of another split.
SPLIT_SHA256 = "sha256"
# config.json's data.source_path_sha256: a local source is kept by its last part alone (the
# training machine's folders are not shared), and its resolved path by this digest, so that a
# report of the folder from a config reading the same path is held to the folder's split.
SOURCE_PATH_SHA256 = "source_path_sha256"


def path_digest(path: str | Path) -> str:
    """SHA-256 of a resolved path's text (which file, without saying where)."""
    return hashlib.sha256(str(Path(path).resolve()).encode("utf-8", "surrogateescape")).hexdigest()


CARD = "README.md"
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}  # safetensors' names


def write_model_folder(
    model: DocumentClassifier,
    tokenizer: Tokenizer,
    label_names: list[str],
    max_tokens: int | None,
    out: str | Path,
    facts: dict[str, Any] | None = None,
    card: str | None = None,
) -> dict[str, Any]:
    """Write ``config.json``, ``model.safetensors``, ``tokenizer.json``, the card (when given)
    and last the manifest that covers them all into ``out``.

    ``facts`` (JSON types) join the config: where the model started, how it scored, its default
    word-score method. Returns the config written.
    """
    from safetensors.torch import save

    out = Path(out)
    _refuse_a_folder_export_did_not_write(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"{out}: cannot be made ({error.strerror or error}); give export a folder path you "
            "can write to"
        ) from None
    # A folder exported again must not keep a manifest that vouches for the old files while
    # the new ones are half written.
    (out / MANIFEST).unlink(missing_ok=True)
    # Contiguous copies: safetensors stores raw buffers and refuses tensors sharing memory.
    tensors = {
        name: tensor.detach().cpu().contiguous().clone()
        for name, tensor in model.state_dict().items()
    }
    weights = save(tensors, metadata={"format": "pt", "model_type": MODEL_TYPE})
    write_atomically(out / "model.safetensors", weights)
    write_atomically(out / "tokenizer.json", tokenizer.to_str(pretty=True).encode())
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
        **(facts or {}),
    }
    write_atomically(out / "config.json", (json.dumps(config, indent=2) + "\n").encode())
    files = list(MODEL_FOLDER_FILES)
    if card is not None:
        write_atomically(out / CARD, card.encode())
        files.append(CARD)
    write_manifest(out, files)
    return config


def _refuse_a_folder_export_did_not_write(out: Path) -> None:
    """An export replaces config.json and README.md: into a project's own folder (``--out .``)
    it overwrote the project's README without a word. Only a new folder, one holding nothing
    but hidden files, or one an export wrote takes one: its config.json is docclass's, or (an
    export stopped before writing it) it holds only the weights and the tokenizer. A file
    named like the manifest proves nothing (web projects have a manifest.json)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: is a file; give export a folder to write the model into")
    if not out.is_dir():
        return
    try:
        shown = {entry.name for entry in out.iterdir() if not entry.name.startswith(".")}
    except OSError as error:
        raise ConfigError(f"{out}: cannot be read ({error.strerror or error})") from None
    try:
        exported = json.loads((out / "config.json").read_text())["model_type"] == MODEL_TYPE
    except (OSError, ValueError, KeyError, TypeError):
        exported = False
    if shown and not exported and not shown <= {"model.safetensors", "tokenizer.json"}:
        raise ConfigError(
            f"{out}: holds files no docclass export wrote (its config.json or README.md would "
            "be replaced); export into a new or empty folder"
        )


def read_folder_config(folder: str | Path) -> dict[str, Any]:
    """A model folder's ``config.json``, checked to be one docclass wrote and can read."""
    folder = Path(folder)
    if folder.is_file():
        raise CheckpointError(
            f"{folder}: a file, not a model folder; 'docclass export --ckpt {folder} --out "
            "<folder>' writes one"
        )
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such folder; give a folder 'docclass export' wrote")
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
            f"{FOLDER_FORMAT_VERSION}; export it again with this release from the training "
            "checkpoint"
        )
    # Before any of the config is used: an edited config.json (labels swapped together in
    # id2label and label2id) is as wrong as swapped weights.
    verify_manifest(folder, MODEL_FOLDER_FILES)
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
    if len(set(id2label.values())) < count:
        raise CheckpointError(
            f"{path}: a label name is given to two classes, so one class's probability would be "
            "reported under the other's; export the model again"
        )
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


def load_model_folder(
    folder: str | Path,
) -> tuple[DocumentClassifier, Tokenizer, list[str], dict[str, Any]]:
    """A model folder's network (eval mode), tokenizer, label names and config; no pickle."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    folder = Path(folder)
    config = read_folder_config(folder)  # also checks the manifest and the files it covers
    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    labels = folder_label_names(config, config_path)
    model_config = model_config_from(config.get("model_config"), config_path)
    if model_config.num_classes != len(labels):
        raise CheckpointError(
            f"{config_path}: model_config has {model_config.num_classes} classes but id2label "
            f"names {len(labels)}; export the model again"
        )
    try:
        # The header alone: shapes are compared before a single tensor is read or allocated.
        with safe_open(str(weights_path), framework="pt") as handle:
            slices = {name: handle.get_slice(name) for name in handle.keys()}
            shapes = {name: tuple(piece.get_shape()) for name, piece in slices.items()}
            dtypes = {piece.get_dtype() for piece in slices.values()}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(
            f"{weights_path}: not a readable safetensors file ({one_line(error)})"
        ) from error
    if not dtypes <= FLOAT_DTYPES:
        # Integer tensors would be cast into the float parameters without a word: not weights.
        raise CheckpointError(
            f"{weights_path}: tensors of type {', '.join(sorted(dtypes - FLOAT_DTYPES))}, not "
            "floating-point weights; export the model again"
        )
    model = build_classifier(model_config, shapes, weights_path)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(
            f"{weights_path}: not a readable safetensors file ({one_line(error)})"
        ) from error
    model.load_state_dict(tensors)
    tokenizer_path = folder / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as error:  # the Rust side raises a plain Exception for a bad file
        raise CheckpointError(
            f"{tokenizer_path}: not a readable tokenizer ({one_line(error)})"
        ) from error
    refuse_larger_tokenizer(tokenizer, model_config.vocab_size, tokenizer_path)
    return model.eval(), tokenizer, labels, config


def refuse_larger_tokenizer(tokenizer: Tokenizer, vocab_size: int, origin: str | Path) -> None:
    """A tokenizer with ids past the model's embedding rows belongs to another model: its
    first text with such a token would fail inside the model, mid-batch."""
    if tokenizer.get_vocab_size() > vocab_size:
        raise CheckpointError(
            f"{origin}: {tokenizer.get_vocab_size()} tokens, more than the model's "
            f"{vocab_size} embedding rows; it belongs to another model"
        )
