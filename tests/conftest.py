"""Shared fixtures. Tests never touch the network: the hub is set offline before anything loads."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Under pytest-xdist (make test) every worker, and every process a test starts, computes on one
# thread: two workers on two cores each spinning two threads ran the suite 1.3x slower than
# this (docs/architecture.md#tests). Set before torch is imported, which reads it once.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import CONFIGS  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def fitted(tmp_path_factory) -> Path:
    """A run folder of ``docclass fit`` on the tiny config (checkpoints, metrics, report)."""
    from docclass.cli import main

    run_dir = tmp_path_factory.mktemp("tiny")
    main(
        ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.default_root_dir", str(run_dir)]
    )
    return run_dir
