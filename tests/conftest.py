"""Shared fixtures. Tests never touch the network: the hub is set offline before anything loads."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


def padded_batch(
    lengths: list[int], vocab: int = 50, extra_padding: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids with the given real lengths, padded with id 0 to the longest (+ extra)."""
    width = max(lengths) + extra_padding
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(2, vocab, (length,))
    return ids, ids != 0


@pytest.fixture(scope="session")
def fitted(tmp_path_factory) -> Path:
    """A run folder of ``docclass fit`` on the tiny config (checkpoints, metrics, report)."""
    from docclass.cli import main

    run_dir = tmp_path_factory.mktemp("tiny")
    main(
        ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.default_root_dir", str(run_dir)]
    )
    return run_dir
