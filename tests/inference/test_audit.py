"""docclass audit: folds that hold every document out once, confident learning that finds
planted flips, the CSV and page that list them, resuming, and refusing a mismatched plan."""

import csv
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
from helpers import CONFIGS, DOCUMENTS, tiny_classifier

from docclass.cli import main
from docclass.data.cleaning import TEXT_HASHES, text_hash
from docclass.data.synthetic import planted_keyword_corpus
from docclass.errors import ConfigError, DataError, UserError
from docclass.inference import audit
from docclass.interpret.default_method import default_method
from docclass.interpret.explain import class_contrast

TINY = str(CONFIGS / "tiny.yaml")


def test_folds_hold_every_document_out_once_and_never_train_on_it():
    ids = [f"d{i}" for i in range(103)]
    labels = [i % 3 for i in range(103)]
    plans = audit.plan_folds(ids, labels, ["a", "b", "c"], 4, 0.1, seed=0)
    held = [doc for plan in plans for doc in plan["test"]]
    assert sorted(held) == sorted(ids)  # each document held out exactly once
    for plan in plans:
        train, val, test = (set(plan[s]) for s in ("train", "val", "test"))
        assert not (train & test or val & test or train & val)
        assert train | val | test == set(ids)
        # Stratified: each class's share of a fold within one document of even.
        per_class = Counter(labels[ids.index(d)] for d in plan["test"])
        assert max(per_class.values()) - min(per_class.values()) <= 1
        assert 8 <= len(val) <= 9
    assert plans == audit.plan_folds(ids, labels, ["a", "b", "c"], 4, 0.1, seed=0)
    assert plans != audit.plan_folds(ids, labels, ["a", "b", "c"], 4, 0.1, seed=1)


@pytest.mark.fault(
    "audit: a class with fewer documents than folds (or none)",
    "refused in one line naming the class, before any training",
)
def test_a_class_smaller_than_the_folds_is_refused_by_name():
    ids = [f"d{i}" for i in range(23)]
    labels = [0] * 20 + [1] * 3
    with pytest.raises(DataError, match=r"\['rare'\].*lower --folds"):
        audit.plan_folds(ids, labels, ["common", "rare"], 5, 0.1, seed=0)
    with pytest.raises(DataError, match=r"\['absent'\]"):
        audit.plan_folds(ids, [0] * 23, ["common", "absent"], 2, 0.1, seed=0)
    with pytest.raises(ConfigError, match="at least 2 folds"):
        audit.plan_folds(ids, labels, ["common", "rare"], 1, 0.1, seed=0)


def _datamodule(ids_by_split, stream=None):
    splits = {
        split: datasets.Dataset.from_dict(
            {"id": ids, "text": [f"text {i}" for i in ids], "label": [0] * len(ids)}
        )
        for split, ids in ids_by_split.items()
    }
    return SimpleNamespace(
        splits=splits, label_names=["a"], stream=stream,
        source_spec=SimpleNamespace(source="docs.jsonl"),
    )  # fmt: skip


@pytest.mark.fault(
    "audit: two documents with the same id (also across train and test)",
    "refused in one line naming the ids; results never merged, no fold trains on a test twin",
)
def test_repeated_ids_and_streamed_training_are_refused():
    pool = audit.audited_pool(_datamodule({"train": ["1", "2"], "val": ["3"], "test": ["4"]}))
    assert pool == {"1": ("text 1", "a"), "2": ("text 2", "a"), "3": ("text 3", "a")}
    with pytest.raises(DataError, match=r"docs.jsonl: ids \['2'\] name more than one"):
        audit.audited_pool(_datamodule({"train": ["1", "2"], "val": ["3"], "test": ["2"]}))
    streamed = _datamodule({"train": ["1"], "val": ["3"], "test": ["4"]}, stream="big/*.jsonl")
    with pytest.raises(ConfigError, match="cannot be cut into folds"):
        audit.audited_pool(streamed)


@pytest.mark.fault(
    "audit: a run folder started on another split (another plan or --filter_by)",
    "refused in one line naming the folder; its old figures are never reported",
)
def test_a_run_folder_of_another_split_is_not_reused(tmp_path, monkeypatch):
    run_dir = tmp_path / "retrain" / "cleaned"
    run_dir.mkdir(parents=True)
    same = {"train": ["1"], "val": [], "test": []}
    (run_dir / audit.REQUESTED_SPLIT).write_text(json.dumps(same))
    (run_dir / "metrics.json").write_text(json.dumps({"test": {"accuracy": 1.0}}))
    monkeypatch.setattr(audit, "run_child", lambda *_, **__: pytest.fail("trained"))
    # Finished, but without the split its data module wrote: what it trained on is unknown.
    with pytest.raises(ConfigError, match="cleaned: was trained on another split"):
        audit.fit_run("c.yaml", [], same, run_dir)
    (run_dir / "split.json").write_text(json.dumps(same))
    with pytest.raises(ConfigError, match="cleaned: was trained on another split"):
        audit.fit_run("c.yaml", [], {"train": ["2"], "val": [], "test": []}, run_dir)
    assert audit.fit_run("c.yaml", [], same, run_dir) == {"test": {"accuracy": 1.0}}
    # The text hashes a run writes beside the ids are no other split.
    (run_dir / "split.json").write_text(json.dumps({**same, "text_sha256": {"1": "0f"}}))
    assert audit.fit_run("c.yaml", [], same, run_dir) == {"test": {"accuracy": 1.0}}
    # Texts or labels changed since the run (the re-training's test split is in no plan): its
    # figures are of other documents. Labels are judged by the request the run started with.
    changed_text = {**same, "text_sha256": {"1": "1f"}}
    with pytest.raises(ConfigError, match="texts or labels have changed"):
        audit.fit_run("c.yaml", [], changed_text, run_dir)
    (run_dir / audit.REQUESTED_SPLIT).write_text(json.dumps({**same, "labels_sha256": "aa"}))
    with pytest.raises(ConfigError, match="texts or labels have changed"):
        audit.fit_run("c.yaml", [], {**same, "labels_sha256": "bb"}, run_dir)
    assert audit.fit_run("c.yaml", [], {**same, "labels_sha256": "aa"}, run_dir)
    # A request written before labels were recorded is reused, and left as it was.
    (run_dir / audit.REQUESTED_SPLIT).write_text(json.dumps(same))
    assert audit.fit_run("c.yaml", [], {**same, "labels_sha256": "cc"}, run_dir)
    assert json.loads((run_dir / audit.REQUESTED_SPLIT).read_text()) == same
    # Unfinished: judged by what it was asked to train on.
    (run_dir / "metrics.json").unlink()
    with pytest.raises(ConfigError, match="cleaned: was trained on another split"):
        audit.fit_run("c.yaml", [], {"train": ["2"], "val": [], "test": []}, run_dir)


@pytest.mark.fault(
    "audit resumed after a config file named in --fit_args changed, or into a folder whose "
    "fold runs have lost their audit_plan.json",
    "refused in one line before anything trains; folds trained under other settings were "
    "reused beside new ones",
)
def test_an_audit_is_resumed_only_under_the_settings_that_trained_its_folds(tmp_path):
    config, extra = tmp_path / "c.yaml", tmp_path / "extra.yaml"
    config.write_text("data: {}\n")
    extra.write_text("model: {n_layers: 0}\n")
    pool = {str(i): (f"text {i}", "ab"[i % 2]) for i in range(12)}
    settings = {"config": str(config), "fit_args": ["--config", str(extra)], "folds": 2,
                "label_names": ["a", "b"]}  # fmt: skip
    datamodule = SimpleNamespace(val_fraction=0.25, split_seed=0)
    out = tmp_path / "audit"
    plan = audit._read_or_write_plan(out, settings, pool, datamodule)
    assert audit._read_or_write_plan(out, settings, pool, datamodule) == plan
    extra.write_text("model: {n_layers: 2}\n")
    with pytest.raises(ConfigError, match="holds an audit with other files in fit_args"):
        audit._read_or_write_plan(out, settings, pool, datamodule)
    # Named as --config=extra.yaml too.
    assert audit._files_named([f"--config={extra}"]) == audit._files_named(["--config", str(extra)])
    assert list(audit._files_named([f"--config={extra}"])) == [str(extra)]
    (out / audit.PLAN).unlink()
    (out / "folds" / "fold-0").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds folds/ but no audit_plan.json"):
        audit._read_or_write_plan(out, settings, pool, datamodule)


@pytest.mark.fault(
    "audit: a fold folder with checkpoints/last.ckpt but neither metrics.json nor "
    "requested_split.json",
    "refused in one line naming the folder (delete it); never resumed on an unknown split",
)
def test_a_checkpoint_of_an_unknown_split_is_not_resumed(tmp_path, monkeypatch):
    run_dir = tmp_path / "folds" / "fold-0"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    monkeypatch.setattr(audit, "run_child", lambda *_, **__: pytest.fail("resumed"))
    split = {"train": ["1"], "val": [], "test": ["2"]}
    with pytest.raises(ConfigError, match=r"fold-0: holds checkpoints/last.ckpt .* delete that"):
        audit.fit_run("c.yaml", [], split, run_dir)
    assert not (run_dir / audit.REQUESTED_SPLIT).exists()  # nothing written that would vouch


def test_flagged_words_contrast_the_two_labels_by_each_fold_model_s_default_method(
    tmp_path, monkeypatch
):
    # Two blocks: conservative propagation and class contribution rank words differently.
    models = {}

    def load(path, device):
        fold = Path(path).parents[1].name
        models[fold] = tiny_classifier(n_layers=2, labels=["markets", "sport", "tech"])
        return SimpleNamespace(trained=models[fold], default=default_method(None), device="cpu")

    monkeypatch.setattr(audit.DocClassifier, "load", load)
    pool = {f"d{i}": (text, "sport") for i, text in enumerate(DOCUMENTS)}
    entries = [{"id": f"d{i}", "fold": i % 2, "given": "sport", "suggested": "tech"}
               for i in range(len(DOCUMENTS))]  # fmt: skip
    records, method = audit._explain_flagged(entries, pool, tmp_path, "cpu")
    assert method == default_method(None) and method.method == "conservative"
    assert [r["id"] for r in records] == [e["id"] for e in entries]
    for entry, record in zip(entries, records, strict=True):
        trained = models[f"fold-{entry['fold']}"]
        text = pool[entry["id"]][0]
        (expected,) = class_contrast(trained, [text], ["tech"], ["sport"], "conservative")
        (other,) = class_contrast(trained, [text], ["tech"], ["sport"], "contribution")
        contrast = record["audit_contrast"]
        assert (contrast["method"], contrast["toward"], contrast["against"]) == (
            "conservative",
            "tech",
            "sport",
        )
        assert contrast["scores"] == pytest.approx(expected, abs=1e-6)
        assert contrast["scores"] != pytest.approx(other, abs=1e-3)
    # A fold whose default differs is not one this audit trained: refused, naming it.
    defaults = iter([default_method(None), SimpleNamespace(method="grad_input", reason="")])
    monkeypatch.setattr(
        audit.DocClassifier, "load",
        lambda path, device: SimpleNamespace(trained=tiny_classifier(), default=next(defaults),
                                             device="cpu"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="fold-1: its default word-score method is grad_input"):
        audit._explain_flagged(entries, pool, tmp_path, "cpu")


def test_retraining_drops_the_flagged_documents_and_keeps_the_test_split(tmp_path, monkeypatch):
    splits = {"train": ["a", "b", "c", "d"], "val": ["e", "f"], "test": ["g", "h"]}
    datamodule = SimpleNamespace(
        splits={
            s: {"id": ids, "text": [f"text of {i}" for i in ids], "label": [0] * len(ids)}
            for s, ids in splits.items()
        },
        label_names=["sport"],
    )
    trained = {}

    def fit(config, fit_args, split, run_dir):
        # What each run is asked to train on (fit_run writes it as the run's split file; the
        # end-to-end audit test checks a real run's split against it).
        trained[run_dir.name] = (config, fit_args, split)
        accuracy = 0.5 if run_dir.name == "baseline" else 1.0
        return {"test": {"accuracy": accuracy, "macro_f1": accuracy - 0.1, "n_documents": 3}}

    monkeypatch.setattr(audit, "fit_run", fit)
    figures = audit.retrain_without(datamodule, {"b", "e"}, tmp_path, "c.yaml", ["--x"])
    cleaned = {"train": ["a", "c", "d"], "val": ["f"], "test": ["g", "h"]}
    # Each run is asked for its ids, with their texts' hashes for its child process to check.
    hashes = {i: text_hash(f"text of {i}") for ids in splits.values() for i in ids}
    kept = {i: hashes[i] for i in hashes if i not in {"b", "e"}}
    labelled = {name: run[2].pop(audit.LABELS_SHA256) for name, run in trained.items()}
    assert trained == {"baseline": ("c.yaml", ["--x"], {**splits, TEXT_HASHES: hashes}),
                       "cleaned": ("c.yaml", ["--x"], {**cleaned, TEXT_HASHES: kept})}  # fmt: skip
    assert len(set(labelled.values())) == 2  # and their labels' hash, each its own documents'

    assert figures["removed"] == 2 and figures["test_documents"] == 2
    assert figures["baseline"] == {"accuracy": 0.5, "macro_f1": 0.4, "documents": 3,
                                   "train_documents": 4, "val_documents": 2}  # fmt: skip
    assert figures["cleaned"] == {"accuracy": 1.0, "macro_f1": 0.9, "documents": 3,
                                  "train_documents": 3, "val_documents": 1}  # fmt: skip


@pytest.mark.fault(
    "audit: --ckpt_path among the fit arguments",
    "refused in one line before anything is read: every fold would start from a model that "
    "saw its held-out documents",
)
def test_a_checkpoint_for_the_folds_is_refused(capsys, tmp_path):
    fit_args = json.dumps(["--ckpt_path", "reports/bbc/checkpoints/last.ckpt"])
    with pytest.raises(SystemExit) as stopped:
        main(["audit", "--config", TINY, "--out", str(tmp_path), "--fit_args", fit_args])
    assert stopped.value.code == 2
    assert "--ckpt_path is the audit's own" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.fault(
    "audit: a second audit started into the folder an audit is writing",
    "one line, exit 2, before anything is read or trained: the folder's holder (pid and host) "
    "and --out",
)
def test_a_second_audit_into_a_busy_folder_is_refused(capsys, tmp_path):
    from docclass.files import lock_folder

    holder = lock_folder(tmp_path, "--out")
    with pytest.raises(SystemExit) as stopped:
        main(["audit", "--config", TINY, "--out", str(tmp_path)])
    assert stopped.value.code == 2
    assert "another docclass run is writing into it" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == [".docclass-run.lock"]
    holder.close()


def test_confident_learning_flags_the_confidently_contradicted_labels_lowest_first():
    pytest.importorskip("cleanlab")
    rng = np.random.default_rng(0)
    true = np.repeat(np.arange(3), 100)
    probs = np.full((300, 3), 0.05)
    probs[np.arange(300), true] = 0.9
    probs += rng.uniform(0, 0.02, probs.shape)
    given = true.copy()
    flipped = [3, 50, 120, 250, 299]
    for i in flipped:
        given[i] = (true[i] + 1) % 3
    probs[250] = [0.3, 0.3, 0.4]  # a flip the model is unsure of: not confidently contradicted
    ranked, quality = audit.find_label_issues(given, probs, "prune_by_noise_rate")
    assert set(ranked) == {3, 50, 120, 299}
    assert list(quality[ranked]) == sorted(quality[ranked])
    assert quality[3] == pytest.approx(probs[3, given[3]] / probs[3].sum())


def test_the_self_confidence_rule_takes_cleanlab_s_calibrated_count_lowest_first():
    pytest.importorskip("cleanlab")
    from cleanlab.count import num_label_issues

    rng = np.random.default_rng(0)
    true = np.repeat(np.arange(3), 100)
    probs = np.full((300, 3), 0.05)
    probs[np.arange(300), true] = 0.9
    probs += rng.uniform(0, 0.02, probs.shape)
    given = true.copy()
    flipped = [3, 50, 120, 250, 299]
    for i in flipped:
        given[i] = (true[i] + 1) % 3
    # Between two classes: the given label keeps a third of the probability.
    between = [10, 110, 210]
    for i in between:
        probs[i] = 0.05
        probs[i, given[i]], probs[i, (given[i] + 2) % 3] = 0.35, 0.6
    ranked, quality = audit.find_label_issues(given, probs, audit.SELF_CONFIDENCE_RULE)
    count = num_label_issues(given, probs / probs.sum(axis=1, keepdims=True),
                             estimation_method="off_diagonal_calibrated")  # fmt: skip
    assert len(ranked) == count and count >= len(flipped)
    assert list(quality[ranked]) == sorted(quality[ranked])
    # Every flip (its given label near 0) comes before any document between two classes.
    assert set(ranked[: len(flipped)]) == set(flipped)
    assert set(ranked) <= set(flipped) | set(between)


def _noisy_probabilities(true_class_lift: float, flips: int):
    """300 documents of 3 classes: random logits with the true class's lifted, and ``flips``
    given labels moved to the next class (seeded)."""
    rng = np.random.default_rng(0)
    true = np.repeat(np.arange(3), 100)
    logits = rng.normal(0, 1, (300, 3))
    logits[np.arange(300), true] += true_class_lift
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    given = true.copy()
    for i in rng.choice(300, flips, replace=False):
        given[i] = (true[i] + 1) % 3
    return true, given, probs


def test_the_self_confidence_rule_counts_with_the_calibrated_joint():
    pytest.importorskip("cleanlab")
    from cleanlab.count import num_label_issues

    # Noisy probabilities, where cleanlab's calibrated count (16) exceeds its plain one (12).
    true, given, probs = _noisy_probabilities(true_class_lift=3, flips=15)
    ranked, quality = audit.find_label_issues(given, probs, audit.SELF_CONFIDENCE_RULE)
    assert len(ranked) == num_label_issues(
        given, probs, estimation_method="off_diagonal_calibrated"
    ) > num_label_issues(given, probs)  # fmt: skip
    # The lowest probabilities of the given label, among documents whose most probable class
    # is another one.
    candidates = np.flatnonzero(probs.argmax(axis=1) != given)
    lowest = candidates[np.argsort(quality[candidates], kind="stable")]
    assert list(ranked) == list(lowest[: len(ranked)])


def test_the_self_confidence_rule_never_flags_a_document_whose_label_is_its_top_class():
    pytest.importorskip("cleanlab")
    # Blurred probabilities and many flips: the count reaches given-label probabilities of
    # about 0.37, above three unsure documents whose label is still their most probable class.
    true, given, probs = _noisy_probabilities(true_class_lift=1.5, flips=80)
    unsure = [i for i in range(300) if given[i] == true[i] and i % 50 == 7][:3]
    for i in unsure:
        probs[i] = 0.33
        probs[i, given[i]] = 0.34
    ranked, quality = audit.find_label_issues(given, probs, audit.SELF_CONFIDENCE_RULE)
    assert max(quality[unsure]) < quality[ranked].max()  # low enough to be taken by score
    assert not set(unsure) & set(ranked)
    assert all(probs[i].argmax() != given[i] for i in ranked)


def test_csv_lists_each_flagged_document_with_both_labels(tmp_path):
    entries = [
        {"rank": 1, "id": "a,1", "split": "train", "given": "x", "suggested": "y",
         "score": 0.01, "p_given": 0.01, "p_suggested": 0.98, "fold": 2},
    ]  # fmt: skip
    audit.write_audit_csv(entries, tmp_path / "audit.csv")
    with (tmp_path / "audit.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [
        {"rank": "1", "id": "a,1", "split": "train", "given_label": "x", "suggested_label": "y",
         "score": "0.01", "p_given": "0.01", "p_suggested": "0.98", "fold": "2"},
    ]  # fmt: skip


@pytest.mark.fault(
    "audit: an id or label starting with =, +, - or @ (a spreadsheet formula)",
    "written to audit.csv with a leading ' (shown as text); audit.json keeps it as given",
)
def test_csv_cells_a_spreadsheet_would_run_as_formulas_are_quoted(tmp_path):
    entries = [
        {"rank": 1, "id": '=HYPERLINK("http://x","y")', "split": "train", "given": "+x",
         "suggested": "@y", "score": 0.01, "p_given": 0.01, "p_suggested": 0.98, "fold": 0},
        {"rank": 2, "id": "-2+3", "split": "val", "given": "x=1", "suggested": "-1",
         "score": 0.02, "p_given": 0.02, "p_suggested": 0.9, "fold": 1},
    ]  # fmt: skip
    given = json.loads(json.dumps(entries))
    audit.write_audit_csv(entries, tmp_path / "audit.csv")
    with (tmp_path / "audit.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["id"], r["given_label"], r["suggested_label"]) for r in rows] == [
        ('\'=HYPERLINK("http://x","y")', "'+x", "'@y"),
        ("'-2+3", "x=1", "-1"),  # only a leading sign is a formula; a plain number is a value
    ]
    assert [(r["score"], r["fold"]) for r in rows] == [("0.01", "0"), ("0.02", "1")]
    assert entries == given  # the entries audit.json is written from keep them as given


@pytest.fixture(scope="module")
def noisy_corpus(tmp_path_factory):
    """A corpus a tiny model learns (a planted keyword decides the label) with 15 labels
    flipped outside the test split."""
    folder = tmp_path_factory.mktemp("noisy")
    rows = planted_keyword_corpus(150, seed=3)
    rng = random.Random(0)
    names = sorted({row["label"] for row in rows})
    flipped = set(rng.sample(range(len(rows)), 15))
    with (folder / "corpus.jsonl").open("w") as handle:
        for i, row in enumerate(rows):
            label = row["label"]
            if i in flipped:
                label = names[(names.index(label) + 1) % len(names)]
            handle.write(json.dumps({"id": f"doc-{i}", "text": row["text"], "label": label}) + "\n")
    return folder, {f"doc-{i}" for i in flipped}


@pytest.mark.fault(
    "audit --retrain with a split whose test part is empty (a data.split_file)",
    "refused in one line before any fold trains (the re-training's test step failed with a "
    "traceback after every fold had trained)",
)
def test_retraining_without_test_documents_is_refused_before_training(
    noisy_corpus, tmp_path, monkeypatch, capsys
):
    folder, _ = noisy_corpus
    ids = [json.loads(line)["id"] for line in (folder / "corpus.jsonl").read_text().splitlines()]
    split_file = tmp_path / "split.json"
    split_file.write_text(json.dumps({"train": ids[:120], "val": ids[120:], "test": []}))
    monkeypatch.setattr(audit, "run_child", lambda *_, **__: pytest.fail("trained"))
    fit_args = json.dumps(["--data.source", str(folder / "corpus.jsonl"),
                           "--data.split_file", str(split_file)])  # fmt: skip
    with pytest.raises(SystemExit):
        main(["audit", "--config", TINY, "--out", str(tmp_path / "audit"), "--folds", "2",
              "--fit_args", fit_args, "--retrain", "true"])  # fmt: skip
    assert "gives it no documents" in capsys.readouterr().err


@pytest.mark.fault(
    "audit: killed and run again; resumed into a folder planned with other settings",
    "finished folds reused, probabilities of other weights scored again; another plan refused "
    "in one line naming what differs",
)
def test_audit_finds_planted_flips_resumes_and_refuses_another_plan(
    noisy_corpus, monkeypatch, capsys
):
    pytest.importorskip("cleanlab")
    folder, flipped = noisy_corpus
    out = folder / "audit"
    fit_args = json.dumps([
        "--data.source", str(folder / "corpus.jsonl"), "--data.max_docs_per_class", "null",
        "--data.max_tokens", "256", "--trainer.callbacks=[]", "--model.n_layers", "0",
        "--trainer.max_epochs", "8", "--model.lr", "0.01",
    ])  # fmt: skip
    args = ["audit", "--config", TINY, "--out", str(out), "--folds", "2", "--fit_args", fit_args]
    main(args)
    summary = json.loads((out / "audit.json").read_text())
    plan = json.loads((out / "audit_plan.json").read_text())
    pool = {doc for fold in plan["fold_splits"] for doc in fold["test"]}
    for fold, split in enumerate(plan["fold_splits"]):
        # The fold's own run trained on the documents the plan gave it, not on its held-out ones.
        run_dir = out / "folds" / f"fold-{fold}"
        written = json.loads((run_dir / "split.json").read_text())
        assert {name: written[name] for name in ("train", "val", "test")} == split
        # Calibrated by the audit on the fold's validation share, for the weights it tested.
        weights = json.loads((run_dir / "metrics.json").read_text())["test"]["weights"]
        calibration = json.loads((run_dir / "calibration.json").read_text())["by_weights"]
        figure = summary["fold_figures"][fold]
        assert figure["temperature"] == calibration[weights]["temperature"] != 1.0
    in_pool = flipped & pool
    with (out / "audit.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    found = {row["id"] for row in rows}
    assert summary["flagged"] == len(rows) and summary["documents"] == len(pool)
    # A tiny model two folds train in seconds is right on about 90 % of the held-out documents:
    # the flags must still be mostly flips (4 % of the documents), and most flips flagged.
    assert len(found & in_pool) >= 0.6 * len(in_pool)  # recall
    assert len(found & in_pool) >= 0.3 * len(found)  # precision, 7x the flips' share
    assert [int(row["rank"]) for row in rows] == list(range(1, len(rows) + 1))
    assert all(row["given_label"] != row["suggested_label"] for row in rows)
    assert summary["retrain"] is None
    page = (out / "report" / "index.html").read_text()
    assert page.count('href="docs/doc-') == len(rows)
    # Each label's words by the default method: a flip the model undid has its planted keyword
    # (the true label's own name) first among the words for the model's label.
    assert summary["contrast_method"] == "conservative"
    cells = dict(
        (doc, (given, for_given, suggested, for_suggested))
        for doc, given, for_given, suggested, for_suggested in re.findall(
            r">(doc-\d+)</a>.*?<b>(\w+)</b>.*?<td>(.*?)</td>\s*<td><b>(\w+)</b>.*?<td>(.*?)</td>",
            page,
            re.S,
        )
    )
    names = sorted(("zorblax", "quintessa", "vermilox"))  # a flip moved a label one name on
    undone = [
        doc
        for doc in found & in_pool
        if cells[doc][2] == names[(names.index(cells[doc][0]) - 1) % len(names)]
    ]
    assert len(undone) >= 0.5 * len(in_pool)
    for doc in undone:
        given, for_given, suggested, for_suggested = cells[doc]
        assert for_suggested.startswith(f"<i>{suggested}</i>") and suggested not in for_given

    # Killed after its last epoch, before testing: resumed from last.ckpt, the same results.
    real_run = audit.run_child
    commands = []

    def recorded(command):
        commands.append(command)
        return real_run(command)

    monkeypatch.setattr(audit, "run_child", recorded)
    for name in ("metrics.json", "split.json", audit.OUT_OF_SAMPLE):
        (out / "folds" / "fold-1" / name).unlink()
    main(args)
    assert len(commands) == 1 and "--ckpt_path" in commands[0]
    with (out / "audit.csv").open() as handle:
        assert list(csv.DictReader(handle)) == rows

    # Resumed again: nothing trains; probabilities written for other weights are scored again.
    monkeypatch.setattr(audit, "run_child", lambda *_, **__: pytest.fail("trained again"))
    scored = out / "folds" / "fold-0" / audit.OUT_OF_SAMPLE
    stale = json.loads(scored.read_text())
    scored.write_text(json.dumps({**stale, "weights": "other", "probs": stale["probs"][::-1]}))
    # With --retrain every flagged document is left out, not only the pages' first two.
    asked = []

    def retrain(datamodule, flagged, out, config, fit_args):
        asked.append(flagged)
        scores = {"accuracy": 0.9, "macro_f1": 0.9, "documents": 50}
        return {"test_documents": 50, "removed": len(flagged),
                "baseline": {**scores, "train_documents": 250, "val_documents": 30},
                "cleaned": {**scores, "train_documents": 249, "val_documents": 28}}  # fmt: skip

    monkeypatch.setattr(audit, "retrain_without", retrain)
    main([*args, "--retrain", "true", "--report_documents", "2"])
    assert asked == [found]
    page = (out / "report" / "index.html").read_text()
    assert 'id="retrain-table"' in page and page.count('href="docs/doc-') == 2
    # Flagged validation documents are removed too: the page says how many in all.
    removed = json.loads((out / "audit.json").read_text())["retrain"]["removed"]
    assert f'<b id="retrain-removed">{removed}</b>' in page and removed == len(found)
    assert json.loads(scored.read_text()) == stale
    with (out / "audit.csv").open() as handle:
        assert list(csv.DictReader(handle)) == rows

    # A rerun that fails after flagging (fewer flags this time, then re-training or
    # explaining fails) leaves the last run's csv, page and json together, all of one run.
    written = ("audit.csv", "audit.json", "report/index.html")
    before = {name: (out / name).read_bytes() for name in written}
    real_flagged, real_explain = audit._flagged_entries, audit._explain_flagged

    def failed(*_):
        raise UserError("failed after flagging")

    monkeypatch.setattr(audit, "_flagged_entries", lambda *a: real_flagged(*a)[:1])
    for step, more in (("retrain_without", ["--retrain", "true"]), ("_explain_flagged", [])):
        monkeypatch.setattr(audit, step, failed)
        with pytest.raises(SystemExit):
            main([*args, *more])
        assert {name: (out / name).read_bytes() for name in written} == before, step
    monkeypatch.setattr(audit, "_flagged_entries", real_flagged)
    monkeypatch.setattr(audit, "_explain_flagged", real_explain)

    # The same folder with other settings: refused in one line, nothing of it reused.
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["audit", "--config", TINY, "--out", str(out), "--folds", "3",
              "--fit_args", fit_args])  # fmt: skip
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "holds an audit with other folds" in line and "\n" not in line
    # The same config named another way is the same audit: resumed, not refused.
    main([os.path.relpath(TINY) if arg == TINY else arg for arg in args])
    # One given label changed in the source: the documents are not those the folds were cut for.
    corpus = folder / "corpus.jsonl"
    lines = corpus.read_text().splitlines()
    row = next(json.loads(line) for line in lines if json.loads(line)["id"] in pool)
    changed = {**row, "label": "zorblax" if row["label"] != "zorblax" else "quintessa"}
    original = corpus.read_text()
    corpus.write_text("\n".join(json.dumps(changed) if json.loads(x)["id"] == row["id"] else x
                                for x in lines) + "\n")  # fmt: skip
    try:
        with pytest.raises(SystemExit):
            main(args)
    finally:
        corpus.write_text(original)  # the module's corpus, as the fixture made it
    assert "holds an audit with other documents and labels" in capsys.readouterr().err


def test_an_audit_averaged_with_another_of_the_same_documents(
    noisy_corpus, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("cleanlab")
    folder, _ = noisy_corpus

    def fit_args(epochs):
        return json.dumps([
            "--data.source", str(folder / "corpus.jsonl"), "--data.max_docs_per_class", "null",
            "--data.max_tokens", "256", "--trainer.callbacks=[]", "--model.n_layers", "0",
            "--trainer.max_epochs", str(epochs),
        ])  # fmt: skip

    first, second = tmp_path / "first", tmp_path / "second"
    base = ["audit", "--config", TINY, "--folds", "2"]
    main([*base, "--out", str(first), "--fit_args", fit_args(2)])
    # Another recipe's audit of the same documents (here: more epochs).
    main([*base, "--out", str(second), "--fit_args", fit_args(3)])
    rule = ["--filter_by", "calibrated_count_by_self_confidence"]
    with_first = ["--with_audits", json.dumps([str(first)])]
    loaded = []
    with monkeypatch.context() as patched:
        real_load = audit.DocClassifier.load

        def load(path, *more, **named):
            loaded.append(Path(path))
            return real_load(path, *more, **named)

        patched.setattr(audit.DocClassifier, "load", load)
        main([*base, "--out", str(second), "--fit_args", fit_args(3), *with_first, *rule])
    summary = json.loads((second / "audit.json").read_text())
    [other] = summary["with_audits"]
    assert (other["out"], other["config"], len(other["fold_weights"])) == (str(first), TINY, 2)
    names = summary["label_names"]
    probs, fold_of = {}, {}
    for audited in (first, second):
        for fold in (0, 1):
            facts = json.loads(
                (audited / "folds" / f"fold-{fold}" / audit.OUT_OF_SAMPLE).read_text()
            )
            for doc_id, row in zip(facts["ids"], facts["probs"], strict=True):
                probs.setdefault(doc_id, []).append(row)
                if audited == second:
                    fold_of[doc_id] = fold
    with (second / "audit.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows, "nothing flagged to check"
    for row in rows:
        mean = np.mean(probs[row["id"]], axis=0)
        assert float(row["p_given"]) == pytest.approx(
            mean[names.index(row["given_label"])], abs=1e-6
        )
        assert row["suggested_label"] == names[int(mean.argmax())] != row["given_label"]
        assert int(row["fold"]) == fold_of[row["id"]]  # the fold that held it out
    # Both audits cut the same folds (same documents and seed), so the fold number cannot tell
    # whose model explained a row: the only models loaded (this audit's folds were already
    # scored, so only to explain) are this audit's, of the rows' folds.
    assert set(loaded) == {
        second / "folds" / f"fold-{int(row['fold'])}" / "checkpoints" / "last.ckpt" for row in rows
    }
    # The accuracy cards: this config's folds alone (the second audit's rows), and the mean.
    given = {r["id"]: r["label"] for r in map(json.loads, (folder / "corpus.jsonl").open())}

    def accuracy(probabilities):
        return np.mean([names[int(np.argmax(probabilities(i)))] == given[i] for i in probs])

    assert summary["out_of_sample_accuracy"] == pytest.approx(accuracy(lambda i: probs[i][1]))
    assert summary["averaged_out_of_sample_accuracy"] == pytest.approx(
        accuracy(lambda i: np.mean(probs[i], axis=0))
    )
    # The two differ with this fixture (2 and 3 epochs: about 0.40 and 0.43), so the checks
    # above tell this audit's own figure from the averaged one.
    assert summary["out_of_sample_accuracy"] != pytest.approx(
        summary["averaged_out_of_sample_accuracy"]
    )
    page = (second / "report" / "index.html").read_text()
    assert 'id="with-audits"' in page and 'id="averaged-accuracy"' in page

    # A byte copy of this audit named as another: its weights give it away (after its folds,
    # here already scored), in one line naming both folders; nothing of the last run is lost.
    copy_of_first, copy_of_second = tmp_path / "copy-of-first", tmp_path / "copy-of-second"
    shutil.copytree(first, copy_of_first)
    shutil.copytree(second, copy_of_second)
    last_run = (second / "audit.json").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main([*base, "--out", str(second), "--fit_args", fit_args(3),
              "--with_audits", json.dumps([str(copy_of_second)]), *rule])  # fmt: skip
    line = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and "\n" not in line, line
    assert (
        f"--with_audits {copy_of_second}: was scored by the same weights as this audit "
        f"({second})" in line
    ), line
    assert (second / "audit.json").read_bytes() == last_run

    # Refused in one line before any fold trains (a fresh --out, training forbidden): its own
    # folder or one named twice, a folder with no audit, an audit of other documents or of the
    # classes in another order, another audit's fold scored by other weights or unfinished.
    monkeypatch.setattr(audit, "run_child", lambda *_, **__: pytest.fail("trained"))
    third = tmp_path / "third"
    plan_file = first / audit.PLAN
    plan = json.loads(plan_file.read_text())
    scored = first / "folds" / "fold-0" / audit.OUT_OF_SAMPLE
    facts = json.loads(scored.read_text())

    def write_plan(**changed):
        plan_file.write_text(json.dumps({**plan, **changed}))

    cases = [
        # Another audit and a byte copy of it: refused before any fold trains.
        ([str(first), str(copy_of_first)],
         f"{copy_of_first}: was scored by the same weights as {first}", lambda: None),
        ([str(third)], "is this audit's own --out or is named twice", lambda: None),
        ([str(second), str(second)], "is this audit's own --out or is named twice", lambda: None),
        ([str(tmp_path)], "holds no audit", lambda: None),
        ([str(first)], "audited other documents and labels",
         lambda: write_plan(**{"documents and labels": "x"})),
        ([str(first)], "audited other label_names",
         lambda: write_plan(label_names=plan["label_names"][::-1])),
        ([str(first)], "fold 0 is unfinished or was scored by other weights",
         lambda: (write_plan(), scored.write_text(json.dumps({**facts, "weights": "other"})))),
        ([str(first)], "fold 0 is unfinished or was scored by other weights",
         lambda: scored.write_text(json.dumps({**facts, "ids": facts["ids"][::-1]}))),
        ([str(first)], "fold 1 is unfinished",
         lambda: (scored.write_text(json.dumps(facts)),
                  (first / "folds" / "fold-1" / audit.OUT_OF_SAMPLE).unlink())),
    ]  # fmt: skip
    for others, message, change in cases:
        change()
        capsys.readouterr()
        with pytest.raises(SystemExit) as stopped:
            main([*base, "--out", str(third), "--fit_args", fit_args(2),
                  "--with_audits", json.dumps(others)])  # fmt: skip
        line = capsys.readouterr().err.strip()
        assert stopped.value.code == 2 and message in line and "\n" not in line, line


def _children(pid):
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


@pytest.mark.fault(
    "audit: SIGTERM while a fold trains",
    "the audit and the fold's docclass fit both end; the same command resumes",
)
def test_sigterm_to_the_audit_ends_the_fold_it_is_training(tmp_path):
    out = tmp_path / "audit"
    # A fold that trains long enough to be caught (it is stopped long before it ends).
    fit_args = json.dumps(["--trainer.max_epochs", "200", "--trainer.callbacks=[]"])
    audit_process = subprocess.Popen(
        [sys.executable, "-m", "docclass.cli", "audit", "--config", TINY, "--out", str(out),
         "--folds", "2", "--fit_args", fit_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out / "folds" / "fold-0" / "checkpoints" / "last.ckpt").is_file():
        assert audit_process.poll() is None and time.monotonic() < deadline, "no fold trained"
        time.sleep(0.5)
    folds = _children(audit_process.pid)
    assert len(folds) == 1
    audit_process.send_signal(signal.SIGTERM)
    _, errors = audit_process.communicate(timeout=60)
    assert audit_process.returncode == 2
    assert "audit stopped by SIGTERM" in errors.strip().splitlines()[-1]
    for _ in range(60):
        if not Path(f"/proc/{folds[0]}").exists():
            break
        time.sleep(0.5)
    outlived = Path(f"/proc/{folds[0]}").exists()
    if outlived:  # not left training for 200 epochs behind a failed test
        os.kill(folds[0], signal.SIGKILL)
    assert not outlived, "the fold's docclass fit outlived the audit"


def _ended(pid: int) -> bool:
    """No such process, or one that has exited and waits to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal")
@pytest.mark.fault(
    "an audit killed outright (SIGKILL, the OOM killer) while a fold trains",
    "the fold's `docclass fit` ends with it (it trained on as an orphan, and a resumed audit "
    "could start a second one into the same fold folder)",
)
def test_a_fold_ends_with_an_audit_killed_outright():
    fold = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    audit = (
        "import sys; from docclass.inference.audit import run_child; "
        f"run_child([sys.executable, '-c', {fold!r}])"
    )
    process = subprocess.Popen([sys.executable, "-c", audit], stdout=subprocess.PIPE)
    child = int(process.stdout.readline())
    try:
        assert not _ended(child)
        process.kill()
        process.wait()
        deadline = time.monotonic() + 10
        while not _ended(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ended(child)
    finally:
        if not _ended(child):
            os.kill(child, signal.SIGKILL)
