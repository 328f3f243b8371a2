"""Where a model's files are: the one policy every model path and hub id goes through.

- A path is a path. One that does not exist is an error naming it, never a download: a typo or
  the wrong working folder must not load a stranger's model that happens to have that name.
- A hub model is only fetched when written as one, ``hub:owner/name@<commit>``, and only at a
  pinned commit (40 hex digits), so the files cannot change under the same name. An unpinned
  revision (``hub:owner/name`` or ``@main``) is refused unless the user says so out loud with
  ``DOCCLASS_ALLOW_UNPINNED_HUB=1``.
- Whatever the files' origin, the model folder's manifest of hashes is checked when the folder
  is read (:mod:`docclass.artifacts.folder`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from docclass.errors import CheckpointError, one_line

HUB_PREFIX = "hub:"
# owner/name, then an optional @revision, as the hub spells repository ids.
HUB_ID = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(@(?P<revision>[\w./-]+))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
ALLOW_UNPINNED = "DOCCLASS_ALLOW_UNPINNED_HUB"
# What a model folder on the hub holds; nothing else is downloaded.
HUB_FILES = ("config.json", "model.safetensors", "tokenizer.json", "manifest.json", "README.md")


def resolve_model(spec: str | Path) -> Path:
    """The local checkpoint file or model folder that ``spec`` names.

    ``spec`` is a path (which must exist) or ``hub:owner/name@<commit>``.
    """
    text = str(spec)
    if text.startswith(HUB_PREFIX):
        return download_hub_model(text.removeprefix(HUB_PREFIX))
    local = Path(text).expanduser()
    if local.exists():
        return local
    hint = (
        f"; for a model on the Hugging Face hub write hub:{text}@<commit>"
        if HUB_ID.match(text) and not text.endswith(".ckpt")
        else ""
    )
    raise CheckpointError(
        f"{text}: no such file or folder; pass the .ckpt written by 'docclass fit' or a folder "
        f"written by 'docclass export'{hint}"
    )


def download_hub_model(hub_id: str) -> Path:
    """A hub model folder's files at a pinned commit (or the hub cache's copy of them)."""
    match = HUB_ID.match(hub_id)
    if match is None:
        raise CheckpointError(
            f"hub:{hub_id}: not a hub id; write hub:owner/name@<commit> (the 40-digit commit "
            "from the repository's history)"
        )
    repo, revision = match["repo"], match["revision"]
    if revision is not None and COMMIT.match(revision.lower()):
        # A commit copied in upper case is the same commit; the hub knows it in lower case.
        revision = revision.lower()
    pinned = revision is not None and COMMIT.match(revision) is not None
    if not pinned and os.environ.get(ALLOW_UNPINNED) != "1":
        raise CheckpointError(
            f"hub:{hub_id}: not pinned to a commit, so its files could change under the same "
            f"name; write hub:{repo}@<40-digit commit>, or set {ALLOW_UNPINNED}=1 to take "
            "whatever the branch holds now"
        )
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo, revision=revision, allow_patterns=list(HUB_FILES))
    except Exception as error:  # the hub's errors vary: offline, missing repo, gated model
        raise CheckpointError(
            f"hub:{hub_id}: the hub download failed ({one_line(error)}); check the id and "
            "commit, or download the folder and pass its path"
        ) from error
    return Path(folder)
