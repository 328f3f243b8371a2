"""train_tokens: the epoch count follows the corpus (tokens per epoch), capped by max_epochs."""

import json
import math

import pytest
from helpers import CONFIGS

from docclass.cli import main
from docclass.train.lightning_cli import datamodule_from_config

TINY = str(CONFIGS / "tiny.yaml")
QUICK = ["--report_after_fit", "false", "--trainer.callbacks", "[]"]


def tokens_per_epoch() -> int:
    """Counted from the truncated ids themselves, not from the count the budget reads."""
    datamodule = datamodule_from_config(TINY, [])
    datamodule.setup("fit")
    return sum(len(ids) for ids in datamodule.tokenized("train")["input_ids"])


def test_epochs_follow_the_token_budget_and_stop_at_max_epochs(tmp_path):
    per_epoch = tokens_per_epoch()
    budget = int(2.5 * per_epoch)
    runs = (("free", 10, math.ceil(budget / per_epoch)), ("capped", 2, 2))
    for run, max_epochs, expected in runs:
        main([
            "fit", "--config", TINY, "--train_tokens", str(budget),
            "--trainer.max_epochs", str(max_epochs),
            "--trainer.default_root_dir", str(tmp_path / run), *QUICK,
        ])  # fmt: skip
        metrics = json.loads((tmp_path / run / "metrics.json").read_text())
        assert metrics["epochs_trained"] == expected
        assert metrics["token_budget"] == {
            "train_tokens": budget,
            "tokens_per_epoch": per_epoch,
            "epochs": expected,
        }
    assert expected == 2 and math.ceil(budget / per_epoch) == 3


def test_token_budget_and_max_steps_together_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([
            "fit", "--config", TINY, "--train_tokens", "1000", "--trainer.max_steps", "5",
            "--trainer.default_root_dir", str(tmp_path), *QUICK,
        ])  # fmt: skip
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "train_tokens and trainer.max_steps (5) both set the length of training" in line


def test_a_floor_above_the_cap_is_one_line_not_a_silent_override(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([
            "fit", "--config", TINY, "--train_tokens", "1000", "--trainer.min_epochs", "4",
            "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path), *QUICK,
        ])  # fmt: skip
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "trainer.min_epochs (4) is above trainer.max_epochs (1)" in line


def test_a_gpu_config_is_read_for_its_data_on_a_machine_without_one(tmp_path):
    # report, faithfulness and calibrate read a config for its data; the trainer it names is
    # never run, so a GPU one (the hub configs) must not stop them on a CPU.
    config = tmp_path / "gpu.yaml"
    text = (CONFIGS / "tiny.yaml").read_text()
    config.write_text(text.replace("accelerator: cpu", "accelerator: gpu\n  precision: bf16-mixed"))
    assert "accelerator: gpu" in config.read_text()
    assert datamodule_from_config(config, []).source_spec.source == "bbc"
