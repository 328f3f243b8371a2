"""A training run killed with SIGKILL resumes from its last checkpoint and ends where an
uninterrupted run ends (CPU, fixed seed): same weights path, same metrics."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import CONFIGS, REPO
from lightning.pytorch import Callback

from docclass.artifacts.checkpoint import load_checkpoint

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def fit_command(run_dir, *extra):
    return [
        sys.executable, "-m", "docclass.cli", "fit", "--config", str(CONFIGS / "tiny.yaml"),
        "--trainer.max_epochs", "4", "--report_after_fit", "false",
        "--trainer.default_root_dir", str(run_dir), *extra,
    ]  # fmt: skip


@pytest.mark.fault(
    "training killed with SIGKILL mid-run",
    "resumes with `--ckpt_path …/last.ckpt`; same steps, weights and test metrics as "
    "an uninterrupted run",
)
def test_killed_run_resumes_and_matches_an_uninterrupted_run(tmp_path):
    # With a worker the loader fetches its first batches before Lightning restores the epoch
    # counter (and does not fetch them again): the resumed epoch must not take epoch 0's order.
    # Without workers the same saved position is read (the mid-epoch test runs both).
    options = ["--data.num_workers", "1"]
    whole = tmp_path / "whole"
    done = subprocess.run(
        fit_command(whole, *options), cwd=REPO, env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]

    killed = tmp_path / "killed"
    last = killed / "checkpoints" / "last.ckpt"
    process = subprocess.Popen(
        fit_command(killed, *options), cwd=REPO, env=ENV,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not last.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)  # no clean-up, no final checkpoint
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (killed / "metrics.json").exists()  # it really was cut short
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["epoch"] < 3

    resumed = subprocess.run(
        fit_command(killed, *options, "--ckpt_path", str(last)),
        cwd=REPO, env=ENV, capture_output=True, text=True,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = json.loads((whole / "metrics.json").read_text())
    b = json.loads((killed / "metrics.json").read_text())
    assert b["global_steps"] == a["global_steps"]
    assert b["test"]["confusion_matrix"] == a["test"]["confusion_matrix"]
    assert b["val"] == a["val"]
    weights_a = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    weights_b = torch.load(last, weights_only=True)["state_dict"]
    for name, tensor in weights_a.items():
        torch.testing.assert_close(weights_b[name], tensor, rtol=0, atol=0, msg=name)
    # The epoch-end checkpoint named the next epoch: how the resumed loader got its order.
    assert position(checkpoint) == (checkpoint["epoch"] + 1, 0)


def position(checkpoint: dict) -> tuple[int, int] | None:
    """Where a checkpoint says training resumes: (epoch, batches of it done)."""
    state = checkpoint.get("DocDataModule") or {}
    return (state["epoch"], state["batches_done"]) if state else None


def test_an_extended_run_counts_its_epochs_from_where_it_resumed(tmp_path):
    """A run extended with other epochs (here: limit_train_batches dropped) places its epoch's
    end at the next epoch's start, not the total divided by its own epoch's batches."""
    from docclass.cli import main

    settings = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--report_after_fit", "false",
        "--test_after_fit", "false", "--trainer.default_root_dir", str(tmp_path),
    ]  # fmt: skip
    last = tmp_path / "checkpoints" / "last.ckpt"
    main([*settings, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "5"])
    assert position(torch.load(last, weights_only=True)) == (1, 0)
    main([*settings, "--trainer.max_epochs", "2", "--ckpt_path", str(last)])
    extended = torch.load(last, weights_only=True)
    assert extended["global_step"] == 5 + 7  # tiny.yaml: 7 batches an epoch
    assert position(extended) == (2, 0)


class BatchLog(Callback):
    """Appends every training batch's document rows and step to ``batches.jsonl``."""

    column = "index"  # the batch's rows in their split

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        record = {"step": trainer.global_step, "rows": batch[self.column].tolist()}
        with open(os.path.join(trainer.default_root_dir, "batches.jsonl"), "a") as log:
            log.write(json.dumps(record) + "\n")


class DieAtStep(Callback):
    """Fault injection: the process dies (no clean-up, no checkpoint) as step ``at`` starts."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.at:
            os._exit(9)


class StreamBatchLog(BatchLog):
    """:class:`BatchLog` for a stream, whose documents have no row index: the token ids."""

    column = "input_ids"


class DieInValidation(Callback):
    """Fault injection: the process dies in the validation run after step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.global_step == self.at:
            os._exit(9)


def logged_rows(logs):
    """Each metrics.csv under ``logs`` (one per run into the folder), oldest first: its rows."""
    files = sorted(logs.glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:]))
    return [list(csv.DictReader(path.open())) for path in files]


def write_stream(tmp_path, documents):
    """A planted-keyword training stream in two shards and a held-out file in ``tmp_path``;
    the environment a fit that logs with this module's callbacks runs in."""
    from helpers import KEYWORDS, write_jsonl

    from docclass.data.synthetic import planted_keyword_corpus

    rows = planted_keyword_corpus(documents, KEYWORDS, seed=7)
    for shard in range(2):
        write_jsonl(tmp_path / f"train-{shard}.jsonl", rows[shard::2])
    write_jsonl(tmp_path / "held_out.jsonl", planted_keyword_corpus(20, KEYWORDS, seed=8))
    paths = [REPO, REPO / "tests", REPO / "tests" / "train"]
    return {**ENV, "PYTHONPATH": os.pathsep.join(map(str, paths))}


def read_batches(run_dir):
    lines = (run_dir / "batches.jsonl").read_text().splitlines()
    return {record["step"]: record["rows"] for record in map(json.loads, lines)}


@pytest.mark.fault(
    "training killed inside an epoch (`--checkpoint_every_n_steps`)",
    "resumes at the next batch of that epoch: the same batches in the same order, no batch "
    "replayed or skipped, the same final weights as an uninterrupted run",
)
@pytest.mark.parametrize("workers", [0, 1])
def test_run_killed_mid_epoch_resumes_at_the_next_batch(tmp_path, workers):
    paths = [REPO, REPO / "tests", REPO / "tests" / "train"]
    env = {**ENV, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    # tiny.yaml gives 7 batches per epoch. Killed twice: first in the validation at epoch 0's
    # end, checkpointing every 7 steps (last.ckpt: the step checkpoint on the epoch's last
    # batch); then, resumed from there with a checkpoint every 3 steps, at step 11 (last.ckpt
    # at step 9, two batches into epoch 1, written by the restarted run). Restarted from a
    # last batch, Lightning skips the next epoch's start, so its per-epoch counters read step
    # 9 as that epoch's first batch; the position comes from the total of batches trained.
    # With workers the loader's first batches are fetched before Lightning restores the epoch.
    steps = ["--trainer.max_epochs", "2", "--checkpoint_every_n_steps", "3",
             "--data.num_workers", str(workers), "--test_after_fit", "false",
             "--trainer.callbacks+=test_resume.BatchLog"]  # fmt: skip
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = subprocess.run(
        fit_command(whole, *steps), cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    last = killed / "checkpoints" / "last.ckpt"
    for death, resume in (
        (["--checkpoint_every_n_steps", "7", "--trainer.callbacks+=test_resume.DieInValidation"],
         []),
        (["--trainer.callbacks+=test_resume.DieAtStep"], ["--ckpt_path", str(last)]),
    ):  # fmt: skip
        died = subprocess.run(
            fit_command(killed, *steps, *resume, *death, "--trainer.callbacks.at", "7" if not
                        resume else "11"),
            cwd=REPO, env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert died.returncode == 9, died.stderr[-2000:]
        if not resume:
            first = torch.load(last, weights_only=True)
            assert first["global_step"] == 7 and position(first) == (1, 0)
    checkpoint = torch.load(last, weights_only=True)
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert checkpoint["global_step"] == 9 and checkpoint["epoch"] == 1
    assert not progress["is_last_batch"], "not a mid-epoch checkpoint"
    assert position(checkpoint) == (1, 2)
    assert checkpoint["DocDataModule"]["world_size"] == 1  # whose turns the 2 batches were

    resumed = subprocess.run(
        fit_command(killed, *steps, "--ckpt_path", str(last)),
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    expected, seen = read_batches(whole), read_batches(killed)
    assert sorted(seen) == sorted(expected)  # every step once: none replayed, none skipped
    assert seen == expected
    weights_a = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    weights_b = torch.load(last, weights_only=True)["state_dict"]
    for name, tensor in weights_a.items():
        torch.testing.assert_close(weights_b[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.fault(
    "a run with `trainer.max_steps` killed after an epoch's end",
    "resumes into the next epoch: the batches and final weights of an uninterrupted run "
    "(Lightning alone finished the checkpoint's epoch again and trained nothing)",
)
def test_a_step_limited_run_resumes_from_an_epoch_end_into_the_next_epoch(tmp_path):
    paths = [REPO, REPO / "tests", REPO / "tests" / "train"]
    env = {**ENV, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    steps = ["--trainer.max_epochs", "2", "--trainer.max_steps", "100", "--test_after_fit",
             "false", "--trainer.callbacks+=test_resume.BatchLog"]  # fmt: skip
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    last = killed / "checkpoints" / "last.ckpt"
    for run_dir, extra, code in (
        (whole, [], 0),
        # Dies as step 8 starts: last.ckpt is epoch 0's end (7 batches an epoch in tiny.yaml).
        (killed, ["--trainer.callbacks+=test_resume.DieAtStep", "--trainer.callbacks.at", "8"],
         9),
        (killed, ["--ckpt_path", str(last)], 0),
    ):  # fmt: skip
        ran = subprocess.run(
            fit_command(run_dir, *steps, *extra), cwd=REPO, env=env, capture_output=True,
            text=True,
        )  # fmt: skip
        assert ran.returncode == code, ran.stderr[-2000:]
        if code:
            assert torch.load(last, weights_only=True)["global_step"] == 7
    assert read_batches(killed) == read_batches(whole)
    # What the resumed run logged (its own metrics.csv) is epoch 1 of the uninterrupted run's,
    # at the same steps: the figures and curves read these.
    logged = [logged_rows(run / "logs") for run in (whole, killed)]
    assert logged[1][-1] == [row for row in logged[0][0] if row["epoch"] == "1"]
    weights_a = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=True)
    weights_b = torch.load(last, weights_only=True)
    assert weights_b["global_step"] == weights_a["global_step"] == 14
    for name, tensor in weights_a["state_dict"].items():
        torch.testing.assert_close(weights_b["state_dict"][name], tensor, rtol=0, atol=0)


@pytest.mark.fault(
    "a streamed training run (`data.stream`) killed at an epoch's end or inside one",
    "resumes in that epoch's shuffle at the next batch: the batches of an uninterrupted run, "
    "none replayed or skipped",
)
# Two workers: the resumed epoch's batches must keep the order the workers take turns in; the
# epoch and the batches dropped are the same without workers.
@pytest.mark.parametrize("workers", [2])
def test_killed_streamed_run_resumes_with_the_batches_of_an_uninterrupted_run(tmp_path, workers):
    env = write_stream(tmp_path, 60)
    # 5 steps an epoch and a checkpoint every 3: death at step 8 leaves last.ckpt at step 6,
    # one batch into epoch 1 (odd: two workers' batches alternate), and best.ckpt at the end
    # of epoch 0. The loader is built, and a worker starts reading, before Lightning restores
    # its epoch counter.
    steps = ["--trainer.max_epochs", "2", "--data.source", str(tmp_path / "held_out.jsonl"),
             "--data.max_docs_per_class", "null", "--data.stream", str(tmp_path / "train-*.jsonl"),
             "--data.steps_per_epoch", "5", "--data.batch_size", "8",
             "--data.num_workers", str(workers), "--checkpoint_every_n_steps", "3",
             "--test_after_fit", "false", "--trainer.callbacks=[]",
             "--trainer.callbacks+=test_resume.StreamBatchLog"]  # fmt: skip

    def fit(run_dir, *extra):
        return subprocess.run(
            fit_command(run_dir, *steps, *extra), cwd=REPO, env=env, capture_output=True, text=True
        )

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = fit(whole)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = read_batches(whole)
    assert sorted(expected) == list(range(10))
    died = fit(killed, "--trainer.callbacks+=test_resume.DieAtStep", "--trainer.callbacks.at", "8")
    assert died.returncode == 9, died.stderr[-2000:]
    checkpoints = {
        "epoch end": (killed / "checkpoints" / "best.ckpt", 5, 0),
        "mid-epoch": (killed / "checkpoints" / "last.ckpt", 6, 1),
    }
    for where, (path, step, _) in checkpoints.items():
        checkpoint = torch.load(path, weights_only=True)
        assert checkpoint["global_step"] == step, where
        # Each resumed run logs into its own folder: exactly the steps it trained.
        resumed_dir = tmp_path / where.replace(" ", "-")
        resumed = fit(resumed_dir, "--ckpt_path", str(path))
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        lines = (resumed_dir / "batches.jsonl").read_text().splitlines()
        seen = [(record["step"], record["rows"]) for record in map(json.loads, lines)]
        assert [s for s, _ in seen] == list(range(step, 10)), where  # none replayed or skipped
        differing = [s for s, rows in seen if rows != expected[s]]
        assert not differing, f"{where}: steps {differing} differ from the uninterrupted run"
    # What carried the position (checked last, so an older run's failure shows the batches).
    for where, (path, _, batches_done) in checkpoints.items():
        assert position(torch.load(path, weights_only=True)) == (1, batches_done), where


@pytest.mark.fault(
    "a streamed training run of unknown length (`trainer.max_steps`, no "
    "`data.steps_per_epoch`) killed after an epoch's end",
    "resumes in the next epoch's shuffle, with the batches of an uninterrupted run",
)
def test_a_stream_of_unknown_length_resumes_from_an_epoch_end_in_the_next_epoch(tmp_path):
    env = write_stream(tmp_path, 30)
    steps = ["--trainer.max_epochs", "2", "--trainer.max_steps", "100",
             "--data.source", str(tmp_path / "held_out.jsonl"), "--data.max_docs_per_class",
             "null", "--data.stream", str(tmp_path / "train-*.jsonl"), "--data.batch_size", "8",
             "--test_after_fit", "false", "--trainer.callbacks=[]",
             "--trainer.callbacks+=test_resume.StreamBatchLog"]  # fmt: skip

    def fit(run_dir, *extra):
        done = subprocess.run(
            fit_command(run_dir, *steps, *extra), cwd=REPO, env=env, capture_output=True, text=True
        )
        return done.returncode, done.stderr[-2000:]

    whole, killed, resumed = tmp_path / "whole", tmp_path / "killed", tmp_path / "resumed"
    code, error = fit(whole)
    assert code == 0, error
    expected = read_batches(whole)
    per_epoch = len(expected) // 2
    code, error = fit(
        killed, "--trainer.callbacks+=test_resume.DieAtStep", "--trainer.callbacks.at",
        str(per_epoch + 1),
    )  # fmt: skip
    assert code == 9, error
    last = killed / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == per_epoch  # epoch 0's end
    code, error = fit(resumed, "--ckpt_path", str(last))
    assert code == 0, error
    seen = read_batches(resumed)
    assert sorted(seen) == list(range(per_epoch, 2 * per_epoch))
    assert all(seen[step] == expected[step] for step in seen), "not epoch 1's shuffle"
    assert position(checkpoint) == (1, 0)

    # Killed twice: in the validation after a step checkpoint on epoch 0's last batch, then,
    # resumed from that one, three steps into epoch 1. Lightning cannot tell a stream's epoch
    # ended there, and counted epoch 1's batches on from epoch 0's length.
    twice = tmp_path / "twice"
    last = twice / "checkpoints" / "last.ckpt"
    died, error = fit(
        twice, "--checkpoint_every_n_steps", str(per_epoch),
        "--trainer.callbacks+=test_resume.DieInValidation", "--trainer.callbacks.at",
        str(per_epoch),
    )  # fmt: skip
    assert died == 9, error
    assert position(torch.load(last, weights_only=True)) == (1, 0)
    died, error = fit(
        twice, "--checkpoint_every_n_steps", "1", "--ckpt_path", str(last),
        "--trainer.callbacks+=test_resume.DieAtStep", "--trainer.callbacks.at",
        str(per_epoch + 3),
    )  # fmt: skip
    assert died == 9, error
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == per_epoch + 3
    assert position(checkpoint) == (1, 3)
    code, error = fit(tmp_path / "after-twice", "--ckpt_path", str(last))
    assert code == 0, error
    seen = read_batches(tmp_path / "after-twice")
    assert sorted(seen) == list(range(per_epoch + 3, 2 * per_epoch))
    assert all(seen[step] == expected[step] for step in seen)


class PoisonWeights(Callback):
    """Fault injection: at the start of ``at_epoch`` one weight becomes NaN, as an overflow
    would leave it (a real run gets there by chance; a test needs it on cue)."""

    def __init__(self, at_epoch: int = 1) -> None:
        self.at_epoch = at_epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.at_epoch:
            with torch.no_grad():
                pl_module.model.head.weight[0, 0] = float("nan")


@pytest.mark.fault(
    "a run resumed with `--ckpt_path last` (WordPiece tokenizer)",
    "the checkpoint's tokenizer and labels are read, never trained again",
)
def test_resume_from_last_reads_the_checkpoints_tokenizer(tmp_path, monkeypatch):
    from docclass.cli import main

    settings = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.tokenizer.kind", "wordpiece",
        "--report_after_fit", "false", "--trainer.default_root_dir", str(tmp_path),
    ]  # fmt: skip
    main([*settings, "--trainer.max_epochs", "1"])
    first = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)

    def trained_again(*args, **kwargs):
        raise AssertionError("resuming trained a new tokenizer")

    monkeypatch.setattr("docclass.train.datamodule.train_tokenizer", trained_again)
    main([*settings, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    resumed = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["epoch"] == first["epoch"] + 1
    assert resumed["docclass"]["tokenizer"] == first["docclass"]["tokenizer"]


@pytest.mark.fault(
    "NaN training loss (a weight poisoned on cue)",
    "stops at once, one line naming the last good checkpoint, which predates the fault",
)
def test_nan_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    from docclass.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([
            "fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.max_epochs", "3",
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.callbacks+=test_resume.PoisonWeights",
        ])  # fmt: skip
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert error.startswith("docclass: error: training loss became nan at epoch 1")
    assert f"the last good checkpoint is {last}" in error
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["epoch"] == 0  # written before the fault, never after it
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    assert not (tmp_path / "metrics.json").exists()  # no test of a broken model


@pytest.mark.fault(
    "kill during a checkpoint write",
    "the previous checkpoint stays whole; no partial file left",
)
def test_checkpoint_write_killed_midway_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    from docclass.train.checkpoint import AtomicCheckpointIO

    path = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"epoch": 1, "w": torch.ones(3)}, path)
    real_save = torch.save

    def dies_halfway(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04 half a zip archive")  # bytes reach the disk, then death
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"epoch": 2, "w": torch.zeros(3)}, path)
    monkeypatch.setattr(torch, "save", real_save)
    kept = load_checkpoint(path)  # and its recorded hash still accepts it
    assert kept["epoch"] == 1 and torch.equal(kept["w"], torch.ones(3))
    assert sorted(p.name for p in path.parent.iterdir()) == WRITTEN  # nothing half-written


KILLED_WRITER = """
import sys, torch
from docclass.train.checkpoint import AtomicCheckpointIO
io = AtomicCheckpointIO()
io.save_checkpoint({"epoch": 1, "w": torch.ones(3)}, sys.argv[1])
print("first saved", flush=True)
io.save_checkpoint({"epoch": 2, "w": torch.zeros(200_000_000)}, sys.argv[1])  # 800 MB
"""


def test_a_resumed_run_names_the_precision_its_steps_computed_in_before_and_after(tmp_path):
    from docclass.cli import main

    # trainer.precision, as a resumed fit takes the model's settings from its checkpoint.
    def fit(run, precision, epochs, resume=None):
        main(
            ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.callbacks=[]",
             "--report_after_fit", "false", "--trainer.precision", precision,
             "--trainer.max_epochs", str(epochs), "--trainer.default_root_dir", str(tmp_path / run),
             *(["--ckpt_path", str(tmp_path / resume / "checkpoints" / "last.ckpt")] if resume
               else [])]
        )  # fmt: skip
        return json.loads((tmp_path / run / "metrics.json").read_text())["training_steps_precision"]

    assert fit("bf16", "bf16-mixed", 1) == "bfloat16 autocast"
    both = "bfloat16 autocast, then float32 after resuming"
    assert fit("then-32", "32-true", 2, resume="bf16") == both
    assert fit("same-again", "32-true", 3, resume="then-32") == both  # float32 goes on: once
    assert fit("nothing-left", "bf16-mixed", 2, resume="then-32") == both  # no step ran here
    assert fit("as-before", "bf16-mixed", 2, resume="bf16") == "bfloat16 autocast"
    # Loaded without a trainer, the hook must not ask for one (Lightning's property raises).
    from docclass.train.lit_module import DocClassifierModule

    loaded = DocClassifierModule.load_from_checkpoint(
        tmp_path / "bf16" / "checkpoints" / "last.ckpt"
    )
    assert loaded.label_names


@pytest.mark.fault(
    "a fit resumed with `--ckpt_path` and model settings other than its checkpoint's "
    "(`--model.lr 0.5`)",
    "a warning naming each setting not used and the checkpoint's value (Lightning's CLI "
    "replaces them with the checkpoint's without a word)",
)
def test_a_resumed_fit_names_the_given_model_settings_it_does_not_use(tmp_path, caplog):
    from docclass.cli import main

    def fit(run, *extra):
        caplog.clear()
        main(
            ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.callbacks=[]",
             "--report_after_fit", "false", "--trainer.default_root_dir", str(tmp_path / run),
             *extra]
        )  # fmt: skip
        return [r.getMessage() for r in caplog.records if "resumed fit" in r.getMessage()]

    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    assert fit("first", "--trainer.max_epochs", "1", "--model.lr", "0.5") == []
    resumed = ["--trainer.max_epochs", "2", "--ckpt_path", str(last)]
    said = fit("other-lr", *resumed, "--model.lr", "0.003", "--model.dropout", "0.1")
    assert len(said) == 1 and "not used: lr 0.003 (the checkpoint's: 0.5)." in said[0], said
    trained = torch.load(tmp_path / "other-lr" / "checkpoints" / "last.ckpt", weights_only=True)
    assert trained["hyper_parameters"]["lr"] == 0.5  # as the warning says
    assert fit("same", *resumed, "--model.lr", "0.5") == []
    # A config without a model section: the built-in defaults were set by no one.
    tiny = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    no_model = tmp_path / "no-model.yaml"
    no_model.write_text(yaml.safe_dump({k: v for k, v in tiny.items() if k != "model"}))
    caplog.clear()
    main(["fit", "--config", str(no_model), "--trainer.callbacks=[]", "--report_after_fit",
          "false", "--trainer.default_root_dir", str(tmp_path / "defaults"), *resumed])  # fmt: skip
    assert not [r for r in caplog.records if "resumed fit" in r.getMessage()]
    # test, validate and predict score the saved network too: a setting given is said unused.
    caplog.clear()
    main(["test", "--config", str(CONFIGS / "tiny.yaml"), "--ckpt_path", str(last), "--model.lr",
          "0.003", "--trainer.default_root_dir", str(tmp_path / "tested")])  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "with its model settings" in r.getMessage()]
    assert (
        len(said) == 1
        and "test scores" in said[0]
        and "lr 0.003 (the checkpoint's: 0.5)" in said[0]
    )


@pytest.mark.fault(
    "a fit resumed with `--ckpt_path last` and model settings other than its checkpoint's "
    "(`--model.n_heads 8` where it was saved with 2)",
    "the checkpoint's settings build the network, as for a named file, and one warning names "
    "the setting not used (Lightning's CLI reads `last`'s settings not at all: the config's "
    "built another network around the saved weights)",
)
def test_a_fit_resumed_from_last_builds_the_network_its_checkpoint_was_saved_with(
    tmp_path, caplog, monkeypatch, capsys
):
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from docclass.cli import main

    def fit(*extra, run=tmp_path):
        caplog.clear()
        main(
            ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.callbacks=[]",
             "--report_after_fit", "false", "--trainer.default_root_dir", str(run), *extra]
        )  # fmt: skip
        return [r.getMessage() for r in caplog.records if "resumed fit" in r.getMessage()]

    last = tmp_path / "checkpoints" / "last.ckpt"
    assert fit("--trainer.max_epochs", "1") == []
    said = fit("--trainer.max_epochs", "2", "--ckpt_path", "last", "--model.n_heads", "8")
    assert len(said) == 1 and "not used: n_heads 8 (the checkpoint's: 2)." in said[0], said
    assert str(last) in said[0]
    resumed = torch.load(last, weights_only=True)
    assert resumed["epoch"] == 1 and resumed["hyper_parameters"]["n_heads"] == 2
    # Resumed on another split (another seed carves other validation and test documents, some
    # of them trained on): refused before a step.
    with pytest.raises(SystemExit) as exit_info:
        fit("--trainer.max_epochs", "3", "--ckpt_path", "last", "--data.split_seed", "1")
    assert exit_info.value.code == 2 and "trained on another split" in capsys.readouterr().err
    assert torch.load(last, weights_only=True)["epoch"] == 1
    # A run folder without last.ckpt starts anew from its config: a stray ./last (Lightning's
    # CLI reads any file of that name) lends it no settings.
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(last, tmp_path / "last")
    assert fit("--trainer.max_epochs", "1", "--ckpt_path", "last", "--model.n_heads", "8",
               "--test_after_fit", "false", run=tmp_path / "new") == []  # fmt: skip
    new = torch.load(tmp_path / "new" / "checkpoints" / "last.ckpt", weights_only=True)
    assert new["epoch"] == 0 and new["hyper_parameters"]["n_heads"] == 8
    # Every DDP rank parses the command line: only rank 0 says so.
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert fit("--trainer.max_epochs", "2", "--ckpt_path", "last", "--model.n_heads", "8",
               "--test_after_fit", "false") == []  # fmt: skip


@pytest.mark.fault(
    "SIGKILL while a checkpoint is being written",
    "the previous checkpoint loads whole; the next save removes the partial file left behind",
)
def test_checkpoint_write_sigkilled_midway_leaves_the_previous_one_whole(tmp_path):
    from docclass.train.checkpoint import AtomicCheckpointIO

    path = tmp_path / "checkpoints" / "last.ckpt"
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)], cwd=REPO, env=ENV,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert writer.stdout.readline().strip() == b"first saved"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        partial = list(path.parent.glob(".last.ckpt.*.partial"))
        if partial and partial[0].stat().st_size > 0:
            break
        time.sleep(0.002)
    writer.send_signal(signal.SIGKILL)  # mid-write: no finally, no clean-up
    writer.wait()
    assert list(path.parent.glob(".last.ckpt.*.partial")), "the kill came after the write"
    kept = load_checkpoint(path)
    assert kept["epoch"] == 1 and torch.equal(kept["w"], torch.ones(3))
    AtomicCheckpointIO().save_checkpoint({"epoch": 3, "w": torch.ones(2)}, path)
    assert sorted(p.name for p in path.parent.iterdir()) == WRITTEN


# A checkpoint and the record of its SHA-256, in sha256sum's format.
WRITTEN = ["last.ckpt", "last.ckpt.sha256"]


@pytest.mark.fault(
    "a checkpoint changed or damaged after docclass wrote it (weights edited in place, "
    "another run's file copied over it)",
    "one line: its SHA-256 is not the one recorded beside it when it was written; a kill at "
    "any point of a save leaves a checkpoint its record accepts",
)
@pytest.mark.parametrize("dies", ["before the rename", "before the record"])
def test_a_checkpoint_is_loaded_only_with_the_bytes_docclass_wrote(tmp_path, monkeypatch, dies):
    import hashlib

    from docclass.artifacts import hashing
    from docclass.errors import CheckpointError
    from docclass.train import checkpoint as checkpoint_io

    path = tmp_path / "last.ckpt"
    io = checkpoint_io.AtomicCheckpointIO()
    io.save_checkpoint({"epoch": 1, "w": torch.ones(3)}, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert (tmp_path / "last.ckpt.sha256").read_text() == f"{digest}  last.ckpt\n"
    # Killed between the steps of the next save: either file is accepted by the record.
    step = {"before the rename": (checkpoint_io.os, "replace")}.get(
        dies, (checkpoint_io, "write_checkpoint_hashes")
    )
    calls, real = [], getattr(*step)

    def dies_there(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:  # the record's own write renames a file first
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(*step, dies_there)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"epoch": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    epoch = load_checkpoint(path)["epoch"]
    assert epoch == (1 if dies == "before the rename" else 2)
    # Another file in its place: refused, in one line, before a byte of it is unpickled.
    torch.save({"epoch": 9, "w": torch.full((3,), 5.0)}, path)
    with pytest.raises(CheckpointError, match="SHA-256 is not the one recorded") as refused:
        load_checkpoint(path)
    assert "\n" not in str(refused.value)
    # Without a record (Lightning's own writer, a copy of the file alone): loaded, with a word.
    (tmp_path / "last.ckpt.sha256").unlink()
    hashing._VERIFIED.clear()
    assert load_checkpoint(path)["epoch"] == 9
    # Lightning removing a checkpoint (save_top_k) removes its record with it.
    io.save_checkpoint({"epoch": 3}, path)
    io.remove_checkpoint(path)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_record_that_cannot_vouch_never_stops_training_or_vouches_wrongly(
    tmp_path, monkeypatch, caplog
):
    import os

    from docclass.errors import CheckpointError
    from docclass.train import checkpoint as checkpoint_io

    path = tmp_path / "last.ckpt"
    record = tmp_path / "last.ckpt.sha256"
    io = checkpoint_io.AtomicCheckpointIO()
    # A damaged record (a power cut, an upper-case hash): loading refuses it in one line, and
    # the next save replaces it rather than failing the run.
    torch.save({"epoch": 0}, path)
    for damaged in ("", " \n", "ABC  last.ckpt\n"):
        record.write_text(damaged)
        with pytest.raises(CheckpointError, match="not a SHA-256 record"):
            load_checkpoint(path)
        io.save_checkpoint({"epoch": 1}, path)
        assert load_checkpoint(path)["epoch"] == 1
    # A checkpoint that was never checked (no record) and a save killed before its rename: it
    # stays unchecked, not vouched for by a record written for the save.
    record.unlink()
    torch.save({"epoch": 5}, path)
    real_replace = os.replace

    def dies_at_the_checkpoints_rename(source, target):
        if os.fspath(target) == os.fspath(path):  # records are renamed into place too
            raise KeyboardInterrupt
        real_replace(source, target)

    monkeypatch.setattr(checkpoint_io.os, "replace", dies_at_the_checkpoints_rename)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"epoch": 6}, path)
    monkeypatch.setattr(checkpoint_io.os, "replace", real_replace)
    assert not record.exists()
    with caplog.at_level("WARNING"):
        assert load_checkpoint(path)["epoch"] == 5
    assert "loaded unchecked" in caplog.text
    # Rewritten in place with its old size and times put back: still refused in this process.
    io.save_checkpoint({"epoch": 7, "w": torch.ones(3)}, path)
    load_checkpoint(path)
    stat = path.stat()
    ones = torch.ones(3).numpy().tobytes()
    data = path.read_bytes()
    assert data.count(ones) == 1
    with open(path, "r+b") as handle:  # the weights' bytes, changed where they lie
        handle.seek(data.index(ones))
        handle.write(torch.full((3,), 2.0).numpy().tobytes())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    with pytest.raises(CheckpointError, match="SHA-256 is not the one recorded"):
        load_checkpoint(path)
    # Lightning's own read (a resume by any alias) checks the file too.
    with pytest.raises(CheckpointError, match="SHA-256 is not the one recorded"):
        io.load_checkpoint(path)
    # Each reader unpickles what it hashed: docclass's through the very handle it hashed (at
    # its start), Lightning's (weights_only not forced on) from the bytes it hashed.
    from docclass.artifacts import hashing

    io.save_checkpoint({"epoch": 8}, path)
    handles, given, digests = [], [], []
    real_open, real_load, real_digest = open, torch.load, hashing._sha256_of_handle

    def opening(*args, **kwargs):
        handles.append(real_open(*args, **kwargs))
        return handles[-1]

    def loading(f, **kwargs):
        given.append((f, f.tell()))
        return real_load(f, **kwargs)

    monkeypatch.setattr(hashing, "open", opening, raising=False)
    monkeypatch.setattr(torch, "load", loading)
    monkeypatch.setattr(
        hashing, "_sha256_of_handle", lambda *a: digests.append(a) or real_digest(*a)
    )
    for reader in (load_checkpoint, io.load_checkpoint):
        hashing._VERIFIED.clear()
        assert reader(path)["epoch"] == 8
    assert len(digests) == 2 and given[0] == (handles[0], 0)
    assert type(given[1][0]).__name__ == "BytesIO" and given[1][0].getvalue() == digests[1][1]
    monkeypatch.undo()

    def written_meanwhile(handle):
        with open(path, "r+b") as other:
            other.write(handle.read(1))  # the same byte: only the change time moves
        return "loaded"

    hashing._VERIFIED.clear()
    with pytest.raises(CheckpointError, match="changed while it was read"):
        hashing.load_checked_checkpoint(path, written_meanwhile)
    # A path with "~" is the user's home folder, for the save, the record and the load.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    io.save_checkpoint({"epoch": 10}, "~/run/last.ckpt")
    assert (tmp_path / "home" / "run" / "last.ckpt.sha256").is_file()
    assert load_checkpoint("~/run/last.ckpt")["epoch"] == 10


@pytest.mark.fault(
    "a checkpoint the process may not read (permissions, a disk error)",
    "one line naming the file and what stopped the read, not a claim that it is damaged",
)
def test_a_checkpoint_that_cannot_be_read_is_not_called_damaged(tmp_path, monkeypatch):
    import errno

    from docclass.artifacts import hashing
    from docclass.errors import CheckpointError

    path = tmp_path / "last.ckpt"
    checkpoint_io_module().AtomicCheckpointIO().save_checkpoint({"epoch": 1}, path)

    def denied(file, *args, **kwargs):  # root reads any file, so chmod cannot stand in here
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))

    monkeypatch.setattr(hashing, "open", denied, raising=False)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert str(refused.value).startswith(f"{path}: cannot be read (Permission denied); check")
    assert "\n" not in str(refused.value)
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 1
    # A damaged file can make torch itself raise an OSError ("Invalid argument", cut a byte
    # short): that is damage, not a read the disk or permissions stopped.
    whole = tmp_path / "whole.ckpt"
    torch.save({"w": torch.ones(1000), "v": torch.zeros(50, 50)}, whole)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(whole.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="cut.ckpt: not a loadable checkpoint"):
        load_checkpoint(cut)


@pytest.mark.fault(
    "a checkpoint loaded while training saves a new one over it (a report of the run so far)",
    "loaded: the new file, checked against the record its save wrote, not refused as damaged",
)
def test_a_save_between_reading_the_record_and_opening_the_file_is_no_damage(tmp_path, monkeypatch):
    import builtins

    from docclass.artifacts import hashing

    path = tmp_path / "last.ckpt"
    io = checkpoint_io_module().AtomicCheckpointIO()
    io.save_checkpoint({"epoch": 1}, path)
    saved = []

    def a_save_comes_first(file, *args, **kwargs):
        if (
            os.fspath(file) == os.fspath(path) and not saved
        ):  # the loader has read the record by now
            saved.append(True)
            io.save_checkpoint({"epoch": 2}, path)
        return builtins.open(file, *args, **kwargs)

    monkeypatch.setattr(hashing, "open", a_save_comes_first, raising=False)
    hashing._VERIFIED.clear()
    assert load_checkpoint(path)["epoch"] == 2 and saved


def test_a_linked_checkpoint_is_checked_as_the_file_it_names(tmp_path):
    from docclass.errors import CheckpointError

    io = checkpoint_io_module().AtomicCheckpointIO()
    io.save_checkpoint({"epoch": 1}, tmp_path / "last.ckpt")
    io.save_checkpoint({"epoch": 3}, tmp_path / "epoch=3.ckpt")
    # Lightning's save_last="link" swaps last.ckpt for a link, leaving last.ckpt's record.
    (tmp_path / "last.ckpt").unlink()
    (tmp_path / "last.ckpt").symlink_to("epoch=3.ckpt")
    assert load_checkpoint(tmp_path / "last.ckpt")["epoch"] == 3
    # A link into a store of unrecorded files (a hub cache's blobs/) keeps its own record.
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    (tmp_path / "epoch=3.ckpt").rename(blob)
    (tmp_path / "epoch=3.ckpt.sha256").rename(tmp_path / "linked.ckpt.sha256")
    (tmp_path / "linked.ckpt").symlink_to(blob)
    assert load_checkpoint(tmp_path / "linked.ckpt")["epoch"] == 3
    torch.save({"epoch": 99}, blob)
    with pytest.raises(CheckpointError, match="SHA-256 is not the one recorded"):
        load_checkpoint(tmp_path / "linked.ckpt")


@pytest.mark.fault(
    '`save_last="link"` where links cannot be made (Windows): Lightning copies the newest '
    "checkpoint over `last.ckpt`, beside the old file's record",
    "the copy is checked against the record of the file it copies; a changed copy is refused",
)
@pytest.mark.parametrize("links", ["made", "refused"])
def test_a_linked_last_checkpoint_is_checked_as_the_file_it_copies_or_names(
    tmp_path, monkeypatch, caplog, links
):
    from docclass.artifacts import hashing
    from docclass.cli import main
    from docclass.errors import CheckpointError

    linked = tmp_path / "linked"
    last = linked / "last.ckpt"
    # An earlier run wrote last.ckpt itself (save_last=True): its record stays beside it.
    checkpoint_io_module().AtomicCheckpointIO().save_checkpoint({"epoch": -1}, last)
    if links == "refused":

        def no_links(*args, **kwargs):
            raise OSError("symbolic links need a privilege here")

        monkeypatch.setattr(os, "symlink", no_links)
    main([
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--report_after_fit", "false",
        "--test_after_fit", "false", "--trainer.default_root_dir", str(tmp_path / "run"),
        "--trainer.max_epochs", "2",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.dirpath", str(linked), "--trainer.callbacks.filename", "{epoch}",
        "--trainer.callbacks.save_top_k", "-1", "--trainer.callbacks.save_last", "link",
        "--trainer.callbacks.enable_version_counter", "false",
        "--trainer.callbacks.monitor", "val/loss",  # docclass's own last.ckpt is unmonitored
    ])  # fmt: skip
    monkeypatch.undo()
    assert last.is_symlink() == (links == "made")
    # A link keeps no record of its own (its target's checks it); a copy has its source's.
    record = linked / "last.ckpt.sha256"
    assert record.exists() == (links == "refused")
    if links == "refused":
        assert (
            record.read_text().split()[0] == (linked / "epoch=1.ckpt.sha256").read_text().split()[0]
        )
    hashing._VERIFIED.clear()
    with caplog.at_level("WARNING"):
        assert load_checkpoint(last)["epoch"] == 1
    assert "unchecked" not in caplog.text
    # Vouched for only as far as the file it copies: other bytes in its place are refused
    # (written through the link where it is one).
    torch.save({"epoch": 9}, last)
    with pytest.raises(CheckpointError, match="SHA-256 is not the one recorded"):
        load_checkpoint(last)


def test_a_copy_of_a_changed_checkpoint_is_not_vouched_for(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from docclass.errors import CheckpointError

    module = checkpoint_io_module()
    source, last = tmp_path / "epoch=1.ckpt", tmp_path / "last.ckpt"
    module.AtomicCheckpointIO().save_checkpoint({"epoch": 1}, source)
    torch.save({"epoch": 9}, source)  # changed after docclass wrote it, before the copy

    def no_links(*args, **kwargs):
        raise OSError("symbolic links need a privilege here")

    monkeypatch.setattr(os, "symlink", no_links)
    trainer = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(barrier=lambda: None))
    module.link_with_record(trainer, str(source), str(last))
    monkeypatch.undo()
    assert not last.is_symlink() and last.read_bytes() == source.read_bytes()
    with pytest.raises(CheckpointError, match="SHA-256 is not the one recorded"):
        load_checkpoint(last)


@pytest.mark.fault(
    "a second run started into the folder a run is writing (`make demo` twice at once)",
    "one line, exit 2, before the run writes: the folder is held by the first run (pid and "
    "host), and the flag that names another folder; a killed run leaves nothing to clean up "
    "(POSIX: on Windows, or a filesystem that cannot lock, nothing is held and a warning says so)",
)
@pytest.mark.skipif(sys.platform == "win32", reason="no flock on Windows: nothing is held there")
def test_a_second_run_into_a_busy_run_folder_is_refused_before_it_writes(
    tmp_path, capsys, monkeypatch, fitted
):
    import socket

    from docclass.cli import main
    from docclass.files import lock_folder
    from docclass.train import lightning_cli

    run = tmp_path / "run"
    holder = lock_folder(run, "--trainer.default_root_dir")
    settings = [
        "--config", str(CONFIGS / "tiny.yaml"), "--trainer.default_root_dir", str(run),
        "--trainer.max_epochs", "1", "--report_after_fit", "false",
    ]  # fmt: skip
    tested = ["--ckpt_path", str(fitted / "checkpoints" / "last.ckpt")]
    for command, extra in (("fit", []), ("test", tested)):
        with pytest.raises(SystemExit) as exit_info:
            main([command, *settings, *extra])
        assert exit_info.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        holder_named = f"(pid {os.getpid()} on {socket.gethostname()})"
        assert f"another docclass run is writing into it {holder_named}" in line, line
        assert "--trainer.default_root_dir another folder" in line
    assert sorted(p.name for p in run.iterdir()) == [".docclass-run.lock"]
    # A forked child (a DataLoader worker) does not keep the folder held after the run.
    forked, told = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(told, b"1")  # past the fork's hooks, which run before fork() returns here
        time.sleep(3)
        os._exit(0)
    assert os.read(forked, 1) == b"1"
    holder.close()  # as a run's end, or its death, releases it
    lock_folder(run, "--trainer.default_root_dir").close()
    os.waitpid(child, 0)
    # A run that fails after taking the hold lets go of it too.
    taken = []
    monkeypatch.setattr(
        lightning_cli, "lock_folder", lambda *a: taken.append(lock_folder(*a)) or taken[-1]
    )
    with pytest.raises(SystemExit):
        main(
            [
                "fit",
                *settings,
                "--trainer.max_epochs",
                "2",
                "--trainer.callbacks+=test_resume.PoisonWeights",
            ]
        )  # NaN loss
    assert len(taken) == 1 and taken[0].closed
    main(["fit", *settings])
    main(["fit", *settings])  # the run before let go of it when it returned
    assert len(taken) == 3 and all(lock.closed for lock in taken)
    assert (run / "checkpoints" / "last.ckpt").is_file()


def test_a_filesystem_that_cannot_lock_runs_unguarded_with_a_warning(tmp_path, monkeypatch, caplog):
    import errno

    fcntl = pytest.importorskip("fcntl")
    from docclass.files import lock_folder

    def no_locks(*args):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level("WARNING"):
        assert lock_folder(tmp_path / "nfs", "--trainer.default_root_dir") is None
    assert "cannot lock files" in caplog.text


def checkpoint_io_module():
    from docclass.train import checkpoint

    return checkpoint


def test_training_runs_write_checkpoints_atomically():
    from docclass.cli import DocClassCLI
    from docclass.train.checkpoint import AtomicCheckpointIO
    from docclass.train.datamodule import DocDataModule
    from docclass.train.lit_module import DocClassifierModule

    cli = DocClassCLI(
        DocClassifierModule, DocDataModule, run=False, args=["--config", str(CONFIGS / "tiny.yaml")]
    )
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_a_run_without_a_folder_writes_everything_into_reports_run(tmp_path, monkeypatch):
    from docclass.cli import main

    monkeypatch.chdir(tmp_path)
    main([
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.default_root_dir", "null",
        "--trainer.max_epochs", "1", "--report_after_fit", "false",
    ])  # fmt: skip
    # Lightning's own default is the working folder: metrics and figures landed there.
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]
    run = tmp_path / "reports" / "run"
    assert {"metrics.json", "split.json", "checkpoints"} <= {p.name for p in run.iterdir()}


def test_checkpoints_every_zero_steps_is_refused_not_ignored(tmp_path):
    # 0 wrote no step checkpoints, in silence: a run killed mid-epoch lost the whole epoch.
    from docclass.errors import ConfigError
    from docclass.train.lightning_cli import _step_checkpoints

    with pytest.raises(ConfigError, match="checkpoint_every_n_steps is 0"):
        _step_checkpoints(tmp_path, 0)
    assert _step_checkpoints(tmp_path, None) == []


def test_a_plugin_of_the_users_keeps_docclass_checkpoint_records(tmp_path):
    """Any trainer plugin (an environment here) switched saving back to Lightning's own: no
    hash record, and the record left from before refused the run's newest checkpoint."""
    import hashlib

    from docclass.cli import main

    environment = '[{"class_path": "lightning.fabric.plugins.environments.LightningEnvironment"}]'
    main(["fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.callbacks=[]",
          "--report_after_fit", "false", "--test_after_fit", "false",
          "--calibrate_after_fit", "false", "--trainer.max_epochs", "1",
          "--trainer.plugins", environment,
          "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    last = tmp_path / "checkpoints" / "last.ckpt"
    digest = hashlib.sha256(last.read_bytes()).hexdigest()
    assert (tmp_path / "checkpoints" / "last.ckpt.sha256").read_text() == f"{digest}  last.ckpt\n"


@pytest.mark.fault(
    "a fit resumed with other batch settings (`--data.max_tokens`, `batch_size`, "
    "`max_batch_tokens`, `pad_to_multiple`, `seed`)",
    "refused in one line naming each setting and the checkpoint's value, before a step",
)
@pytest.mark.parametrize("changed", [["--data.max_tokens", "16"], ["--data.batch_size", "4"]])
def test_a_resumed_fit_with_other_batch_settings_is_refused(tmp_path, capsys, changed):
    """At another max_tokens the run trained and tested on shorter documents while its
    checkpoints kept recording the old limit, which classify then used; at another batch
    size the schedule and the epoch's batches done were the old batches'."""
    from docclass.cli import main

    def fit(*extra):
        main(["fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.callbacks=[]",
              "--report_after_fit", "false", "--test_after_fit", "false",
              "--calibrate_after_fit", "false", "--trainer.default_root_dir", str(tmp_path),
              *extra])  # fmt: skip

    fit("--trainer.max_epochs", "1")
    last = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(SystemExit) as exit_info:
        fit("--trainer.max_epochs", "2", "--ckpt_path", "last", *changed)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"changed: data.{changed[0][7:]}" in error, error
    assert torch.load(last, weights_only=True)["epoch"] == 0
    fit("--trainer.max_epochs", "2", "--ckpt_path", "last")  # as it trained: resumed
    assert torch.load(last, weights_only=True)["epoch"] == 1


@pytest.mark.fault(
    "a fit whose last epoch ends without validation (`check_val_every_n_epoch 2` over 3 epochs)",
    "`last.ckpt` holds the weights the after-fit test scored, and `metrics.json`'s `val` is "
    "of those weights",
)
def test_the_after_fit_test_scores_the_weights_last_ckpt_holds(tmp_path):
    from docclass.artifacts.load import checkpoint_fingerprint
    from docclass.cli import main

    main([
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--report_after_fit", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "3",
        "--trainer.check_val_every_n_epoch", "2",
    ])  # fmt: skip
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["epoch"] == 2
    assert metrics["test"]["weights"] == checkpoint_fingerprint(last)
    # Snapshot pages of the fit's validation passes alone: the one at its end is no epoch's.
    assert sorted(p.name for p in (tmp_path / "attention").iterdir()) == ["epoch_001"]
    # Validation of the same weights again: the figures metrics.json keeps.
    main([
        "validate", "--config", str(CONFIGS / "tiny.yaml"), "--ckpt_path", str(last),
        "--trainer.default_root_dir", str(tmp_path / "again"),
    ])  # fmt: skip
    logged = logged_rows(tmp_path / "again" / "logs")[-1][-1]
    assert float(logged["val/acc"]) == pytest.approx(metrics["val"]["acc"], abs=1e-6)
    assert float(logged["val/loss"]) == pytest.approx(metrics["val"]["loss"], abs=1e-5)


SLURM_TASK = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "docclass", "SLURM_PROCID": "0",
              "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7"}  # fmt: skip


@pytest.mark.fault(
    "a SLURM job requeued after its hpc checkpoint (hpc_ckpt_1.ckpt and its hash record)",
    "resumes from that checkpoint through docclass's checks, and the after-fit test scores "
    "the final weights, not the hpc checkpoint's",
)
def test_a_requeued_slurm_job_resumes_from_its_hpc_checkpoint_and_tests_its_final_weights(
    tmp_path, monkeypatch, capsys
):
    from docclass.artifacts.hashing import sha256_of, write_checkpoint_hashes
    from docclass.artifacts.load import checkpoint_fingerprint
    from docclass.cli import main

    settings = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--report_after_fit", "false",
        "--trainer.default_root_dir", str(tmp_path),
    ]  # fmt: skip
    with pytest.raises(SystemExit):
        main([*settings, "--ckpt_path", "hpc"])
    assert "holds no hpc_ckpt_N.ckpt" in capsys.readouterr().err
    main([*settings, "--trainer.max_epochs", "1", "--test_after_fit", "false"])
    # What Lightning's requeue handler leaves: the run's state, saved through docclass's
    # checkpoint writing, so with its record beside it.
    hpc = tmp_path / "hpc_ckpt_1.ckpt"
    shutil.copy(tmp_path / "checkpoints" / "last.ckpt", hpc)
    write_checkpoint_hashes(hpc, [sha256_of(hpc)])
    resumed_from = checkpoint_fingerprint(hpc)
    for name, value in SLURM_TASK.items():
        monkeypatch.setenv(name, value)
    main([*settings, "--trainer.max_epochs", "2"])
    # It went on from epoch 1: the second run logged that epoch alone.
    trained = [row for row in logged_rows(tmp_path / "logs")[-1] if row["train/loss_step"]]
    assert {row["epoch"] for row in trained} == {"1"}
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["global_steps"] == 14
    assert metrics["test"]["weights"] == checkpoint_fingerprint(tmp_path / "checkpoints/last.ckpt")
    assert metrics["test"]["weights"] != resumed_from
    assert not list((tmp_path / "checkpoints").glob(".after-fit*"))
    # The finished fit removed its resume points: a next fit into the folder starts anew.
    assert not list(tmp_path.glob("hpc_ckpt_*"))
    # A fit that writes no checkpoint (fast_dev_run) into a folder holding an older run's
    # last.ckpt, and a hash record whose hpc checkpoint is gone (Lightning read it as
    # checkpoint 1256): the weights tested are the fit's own, never the older file's.
    (tmp_path / "hpc_ckpt_3.ckpt.sha256").write_text(f"{'0' * 64}  hpc_ckpt_3.ckpt\n")
    main([*settings, "--trainer.fast_dev_run", "true"])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["global_steps"] == 1
    assert metrics["test"]["weights"] != checkpoint_fingerprint(tmp_path / "checkpoints/last.ckpt")


class FailAtStep(Callback):
    """Fault injection inside the process: an error as step ``at`` starts (no checkpoint)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.at:
            raise RuntimeError("injected fault")


@pytest.mark.fault(
    "a fit validating every second epoch, stopped at the start of an unvalidated one",
    "resumes from that epoch's end (last.ckpt, written there now) to the weights of an "
    "uninterrupted run, dropout included",
)
def test_a_run_validating_every_second_epoch_resumes_from_an_unvalidated_epoch_end(tmp_path):
    from docclass.cli import main

    settings = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--report_after_fit", "false",
        "--test_after_fit", "false", "--trainer.check_val_every_n_epoch", "2",
        "--trainer.max_epochs", "3",
    ]  # fmt: skip
    main([*settings, "--trainer.default_root_dir", str(tmp_path / "whole")])
    last = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    with pytest.raises(RuntimeError, match="injected fault"):
        main([*settings, "--trainer.default_root_dir", str(tmp_path / "cut"),
              "--trainer.callbacks+=test_resume.FailAtStep",
              "--trainer.callbacks.at", "8"])  # fmt: skip
    assert torch.load(last, weights_only=True)["global_step"] == 7  # epoch 0's end, unvalidated
    main([*settings, "--trainer.default_root_dir", str(tmp_path / "cut"), "--ckpt_path", str(last)])
    whole = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = torch.load(last, weights_only=True)
    assert resumed["global_step"] == whole["global_step"] == 21
    for name, tensor in whole["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.fault(
    "a fit validating twice an epoch (`val_check_interval 0.5`) stopped inside an epoch",
    "last.ckpt holds the weights of its latest validation, the resume point inside the epoch",
)
def test_a_run_validating_inside_epochs_saves_last_at_each_validation(tmp_path):
    from docclass.cli import main

    last = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(RuntimeError, match="injected fault"):
        main(["fit", "--config", str(CONFIGS / "tiny.yaml"), "--report_after_fit", "false",
              "--trainer.val_check_interval", "0.5", "--trainer.default_root_dir",
              str(tmp_path), "--trainer.callbacks+=test_resume.FailAtStep",
              "--trainer.callbacks.at", "5"])  # fmt: skip
    # 7 batches an epoch, validated after the 3rd and 6th: the 3rd's state, not none.
    assert torch.load(last, weights_only=True)["global_step"] == 3
    # Accumulating 2 batches a step, the 3rd batch's validation falls inside a window whose
    # gradient is in no file: no resume point there (a resume trained to other weights).
    with pytest.raises(RuntimeError, match="injected fault"):
        main(["fit", "--config", str(CONFIGS / "tiny.yaml"), "--report_after_fit", "false",
              "--trainer.val_check_interval", "0.5", "--trainer.accumulate_grad_batches", "2",
              "--trainer.default_root_dir", str(tmp_path / "accumulated"),
              "--trainer.callbacks+=test_resume.FailAtStep",
              "--trainer.callbacks.at", "2"])  # fmt: skip
    assert not (tmp_path / "accumulated" / "checkpoints" / "last.ckpt").exists()


@pytest.mark.fault(
    "a checkpoint written inside a training step (SLURM's requeue signal: Lightning saves "
    "hpc_ckpt_N.ckpt from the signal handler, after the step's dropout draws)",
    "it keeps the random generators of the step's start, so the resumed run draws the same "
    "dropout again (a requeued job trained to weights up to 0.0076 away)",
)
def test_a_checkpoint_written_inside_a_step_keeps_the_generators_of_its_start():
    from docclass.train.callbacks import RandomState

    keeper = RandomState()
    counters = SimpleNamespace(started=5, processed=4)
    fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(
        current=counters)))  # fmt: skip
    trainer = SimpleNamespace(fit_loop=fit_loop)
    torch.manual_seed(3)
    keeper.on_train_batch_start(trainer, None, None, 0)
    drawn = torch.rand(4)  # the step's dropout
    inside = keeper.state_dict()
    counters.processed = 5  # the step is done: a resume goes on with the next batch
    done = keeper.state_dict()  # (a save by a callback whose batch end comes first)
    keeper.on_train_batch_end(trainer, None, None, None, 0)
    after = keeper.state_dict()  # a checkpoint at the step's end keeps the state then
    keeper.load_state_dict(inside)
    assert torch.equal(torch.rand(4), drawn)
    for state in (done, after):
        keeper.load_state_dict(state)
        assert not torch.equal(torch.rand(4), drawn)


class FailOnTest(Callback):
    def on_test_start(self, trainer, pl_module) -> None:
        raise RuntimeError("test killed")


def test_a_fit_whose_test_fails_keeps_its_hpc_checkpoint(tmp_path, monkeypatch):
    """The requeued job's resume point goes only once metrics.json is written: a test killed
    before (a SIGTERM Lightning defers to it) would leave the next job nothing to resume."""
    from docclass.artifacts.hashing import sha256_of, write_checkpoint_hashes
    from docclass.cli import main

    settings = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--report_after_fit", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "1",
    ]  # fmt: skip
    main([*settings, "--test_after_fit", "false"])
    hpc = tmp_path / "hpc_ckpt_1.ckpt"
    shutil.copy(tmp_path / "checkpoints" / "last.ckpt", hpc)
    write_checkpoint_hashes(hpc, [sha256_of(hpc)])
    for name, value in SLURM_TASK.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match="test killed"):
        main([*settings, "--trainer.callbacks+=test_resume.FailOnTest"])
    assert hpc.is_file() and not (tmp_path / "metrics.json").exists()


def test_the_after_test_hook_follows_the_after_fit_test_alone(tmp_path):
    """Figures are drawn once the after-fit test has written metrics.json, and not by a fit
    that tests nothing (the hook had slipped into the hpc clean-up, which both paths call)."""
    from docclass.train.lightning_cli import TrainingCLI, training_cli

    calls = []

    class Recording(TrainingCLI):
        def after_test(self) -> None:
            calls.append((self.trainer.default_root_dir / Path("metrics.json")).is_file())

    settings = ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--trainer.max_epochs", "1",
                "--trainer.callbacks=[]"]  # fmt: skip
    training_cli([*settings, "--test_after_fit", "false", "--trainer.default_root_dir",
                  str(tmp_path / "untested")], cli_class=Recording)  # fmt: skip
    assert calls == []
    training_cli([*settings, "--trainer.default_root_dir", str(tmp_path / "tested")],
                 cli_class=Recording)  # fmt: skip
    assert calls == [True]
