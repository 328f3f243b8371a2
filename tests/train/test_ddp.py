"""Distributed data parallel for real: two CPU processes (gloo) run ``fit`` on the tiny config."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import CONFIGS, REPO


def test_two_process_ddp_fit_trains_tests_and_reports_once(tmp_path):
    run_dir = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "docclass.cli", "fit",
        "--config", str(CONFIGS / "tiny.yaml"), "--config", str(CONFIGS / "ddp.yaml"),
        "--trainer.accelerator", "cpu", "--trainer.devices", "2",
        "--trainer.default_root_dir", str(run_dir),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    seen = [*command, "--trainer.callbacks+=helpers.RankMetrics"]
    env_seen = {**env, "PYTHONPATH": str(REPO / "tests")}
    done = subprocess.run(seen, cwd=REPO, env=env_seen, capture_output=True, text=True, timeout=600)
    assert_ended_cleanly(done)
    output = done.stdout + done.stderr
    assert "distributed_backend=gloo" in output
    assert "All distributed processes registered. Starting with 2 processes" in output
    # What EarlyStopping and metrics.json read is the same on both ranks: the whole validation
    # set's loss and both ranks' token counts, not each rank's own shard.
    ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    for key in ("val/loss", "val/acc", "train/real_tokens"):
        assert ranks[0][key] == ranks[1][key], key

    metrics = json.loads((run_dir / "metrics.json").read_text())
    # ... and the validation split's own: each document once, although the distributed sampler
    # repeats one of the tiny config's 213 to give both ranks 107 (RankMetrics recomputes them
    # from every rank's predictions).
    assert metrics["data"]["val_documents"] % 2 == 1
    for seen in ranks:
        assert seen["recomputed/val_documents"] == metrics["data"]["val_documents"]
        assert seen["val/acc"] == pytest.approx(seen["recomputed/val_acc"], abs=1e-6)
        assert seen["val/f1"] == pytest.approx(seen["recomputed/val_f1"], abs=1e-6)
        assert seen["val/loss"] == pytest.approx(seen["recomputed/val_loss"], abs=1e-5)
    assert metrics["val"]["acc"] == ranks[0]["val/acc"]
    # Metrics cover the whole test split once, not rank 0's shard (or the sampler's repeats).
    assert metrics["test"]["n_documents"] == metrics["data"]["test_documents"]
    assert sum(map(sum, metrics["test"]["confusion_matrix"])) == metrics["data"]["test_documents"]
    # Each rank read half of every epoch: steps = ceil(ceil(train / 2) / batch) × epochs.
    per_rank = math.ceil(metrics["data"]["train_documents"] / 2)
    assert metrics["global_steps"] == math.ceil(per_rank / 16) * metrics["epochs_trained"]
    # Written once, by rank 0: one report, checkpoints loadable without executing pickle.
    assert (run_dir / "report" / "index.html").is_file()
    assert output.count(f"report: {metrics['test']['n_documents']} documents →") == 1
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == metrics["global_steps"]

    # predict on two ranks: one row per test document, in split order, in one file.
    predict = [*command[:3], "predict", *command[4:]]
    predict += ["--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")]
    done = subprocess.run(predict, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert_ended_cleanly(done)
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").open()]
    split = json.loads((run_dir / "split.json").read_text())
    assert [row["id"] for row in rows] == split["test"]
    assert not list(run_dir.glob("predictions.jsonl.rank*"))


def test_two_process_ddp_fit_on_a_stream_runs_equal_steps(tmp_path):
    from helpers import KEYWORDS, write_jsonl

    from docclass.data.synthetic import planted_keyword_corpus

    # Three shards for two ranks: shares of unequal length, the case that hangs unless every
    # rank runs the same number of steps.
    rows = planted_keyword_corpus(100, KEYWORDS, seed=7)
    for shard in range(3):
        write_jsonl(tmp_path / f"train-{shard}.jsonl", rows[shard::3])
    write_jsonl(tmp_path / "held_out.jsonl", planted_keyword_corpus(20, KEYWORDS, seed=8))
    metrics = quick_ddp_fit(
        tmp_path / "run",
        "--data.source", str(tmp_path / "held_out.jsonl"), "--data.max_docs_per_class", "null",
        "--data.stream", str(tmp_path / "train-*.jsonl"), "--data.steps_per_epoch", "7",
    )  # fmt: skip
    assert metrics["global_steps"] == 7 * metrics["epochs_trained"] == 14


def test_two_process_ddp_fit_with_a_token_budget_runs_equal_steps(tmp_path):
    metrics = quick_ddp_fit(
        tmp_path / "budget", "--trainer.max_epochs", "1", "--data.max_batch_tokens", "512"
    )
    # The tiny config's documents are cut at 64 tokens, so a 512-token budget holds 8 of them:
    # each rank runs ceil(ceil(train / 2) / 8) steps, not the 16-document batches' count.
    per_rank = math.ceil(metrics["data"]["train_documents"] / 2)
    assert metrics["global_steps"] == math.ceil(per_rank / 8)


def quick_ddp_fit(run_dir, *options: str) -> dict:
    """``fit`` on the tiny config in two gloo processes, no report; its metrics.json."""
    command = [
        sys.executable, "-m", "docclass.cli", "fit",
        "--config", str(CONFIGS / "tiny.yaml"), "--config", str(CONFIGS / "ddp.yaml"),
        "--trainer.accelerator", "cpu", "--trainer.devices", "2",
        "--trainer.callbacks=[]", "--report_after_fit", "false",
        "--trainer.default_root_dir", str(run_dir), *options,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert_ended_cleanly(done)
    return json.loads((run_dir / "metrics.json").read_text())


def assert_ended_cleanly(done: subprocess.CompletedProcess) -> None:
    """Rank 0 exited 0 and no rank aborted. Rank 1 writes to the same stderr, and its abort as
    rank 0 finishes would not show in rank 0's exit status."""
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr, done.stderr[-3000:]


# ``python -c AFTER_MAIN fit ...`` runs ``docclass fit ...``, then prints what the process still
# holds once main() has returned, which is what interpreter shutdown would meet: the process
# group, and gloo's threads (workers, transport loop, TCPStore server), which only /proc names.
AFTER_MAIN = """
import json, os, sys
import torch.distributed as dist
from docclass.cli import main

main(sys.argv[1:])
tasks = "/proc/self/task" if os.path.isdir("/proc/self/task") else None
names = [open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)] if tasks else []
gloo = sorted(name for name in names if name.startswith(("pt_gloo", "gloo", "pt_tcpstore")))
print(json.dumps({"initialized": dist.is_initialized(), "threads": gloo}))
"""


def test_a_ddp_run_leaves_nothing_of_its_process_group_to_interpreter_shutdown(tmp_path):
    # A gloo group left to interpreter shutdown keeps its worker threads there, and one that
    # drops the last reference to a collective's tensor (all_gather_object's) as shutdown begins
    # wants the GIL: Python ends the thread, the unwind meets a noexcept destructor and
    # std::terminate aborts the process ("terminate called without an active exception"), now
    # and then, under load. One process is enough to see whether the group outlives the run.
    command = [
        sys.executable, "-c", AFTER_MAIN, "fit", "--config", str(CONFIGS / "tiny.yaml"),
        "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
        "--trainer.callbacks=[]", "--trainer.logger", "false", "--report_after_fit", "false",
        "--trainer.default_root_dir", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert_ended_cleanly(done)
    assert "distributed_backend=gloo" in done.stdout + done.stderr
    left = json.loads(done.stdout.strip().splitlines()[-1])
    assert left == {"initialized": False, "threads": []}


@pytest.mark.fault(
    "a two-process run's checkpoint, resumed",
    "it holds every rank's random generators; each rank gets its own back, not rank 0's",
)
def test_each_rank_saves_and_gets_back_its_own_random_state(tmp_path, monkeypatch):
    from docclass.train import callbacks

    command = [
        sys.executable, "-m", "docclass.cli", "fit",
        "--config", str(CONFIGS / "tiny.yaml"), "--config", str(CONFIGS / "ddp.yaml"),
        "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--report_after_fit", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "1",
        "--trainer.callbacks+=helpers.RankRandomState",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PYTHONPATH"] = str(REPO / "tests")
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert_ended_cleanly(done)
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    state = next(v for k, v in saved["callbacks"].items() if "RandomState" in k)
    ranks = state["ranks"]
    # The ranks drew different amounts of randomness (see RankRandomState): so do their states.
    assert len(ranks) == 2 and not torch.equal(ranks[0]["torch"], ranks[1]["torch"])
    for rank in (0, 1):
        monkeypatch.setattr(callbacks, "process_rank", lambda rank=rank: (rank, 2))
        callbacks.RandomState().load_state_dict(state)
        assert torch.equal(torch.get_rng_state(), ranks[rank]["torch"]), rank


def test_rows_a_rank_repeated_are_counted_and_written_once(tmp_path):
    """The ranks' turns repeat a few documents when a split has too few batches to share (one
    document a batch, fewer documents than ranks): metrics and predictions take each once."""
    from docclass.train.callbacks import PredictionWriter, gather_by_document

    indices = torch.tensor([4, 1, 4, 0, 1])
    labels, predicted = torch.tensor([9, 8, 9, 7, 8]), torch.tensor([3, 2, 3, 1, 2])
    kept = gather_by_document(indices, labels, predicted)
    assert [column.tolist() for column in kept] == [[7, 8, 9], [1, 2, 3]]  # by index, once

    writer = PredictionWriter()
    writer.resolved_path = tmp_path / "predictions.jsonl"
    shards = {0: [(2, "b"), (0, "a")], 1: [(1, "c"), (2, "b")]}  # rank 1 repeats index 2
    for rank, rows in shards.items():
        with writer._rank_path(writer.resolved_path, rank).open("w") as handle:
            for index, doc_id in rows:
                handle.write(json.dumps({"id": doc_id, "_index": index}) + "\n")
    writer._merge_shards(2)
    lines = writer.resolved_path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"id": "a"}, {"id": "c"}, {"id": "b"}]
    assert not list(tmp_path.glob("*.rank*"))
