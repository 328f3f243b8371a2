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
import json
from pathlib import Path
from typing import Any

import torch

from docclass.errors import CheckpointError

MANIFEST = "manifest.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
