"""docclass audit: folds that hold every document out once, confident learning that finds
planted flips, the CSV and page that list them, resuming, and refusing a mismatched plan."""

import csv
import json
import random
import re
from collections import Counter
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
from helpers import CONFIGS

from docclass.cli import main
from docclass.data.synthetic import planted_keyword_corpus
from docclass.errors import ConfigError, DataError
from docclass.inference import audit
from docclass.report.audit import contrast_words, write_audit_report

pytest.importorskip("cleanlab")
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
    monkeypatch.setattr(audit.subprocess, "run", lambda *_, **__: pytest.fail("trained"))
    with pytest.raises(ConfigError, match="cleaned: was trained on another split"):
        audit.fit_run("c.yaml", [], {"train": ["2"], "val": [], "test": []}, run_dir)
    assert audit.fit_run("c.yaml", [], same, run_dir) == {"test": {"accuracy": 1.0}}


def test_confident_learning_flags_the_confidently_contradicted_labels_lowest_first():
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


def _record(words, given_scores, suggested_scores):
    spans, start = [], 0
    for word in words:
        spans.append([start, start + len(word)])
        start += len(word) + 1
    return {
        "id": "doc<1>", "label": "given", "predicted": "model", "words": words,
        "text": " ".join(words), "spans": spans, "words_read": len(words), "n_tokens": len(words),
        "tokens_read": len(words), "truncated": False,
        "probs": {"given": 0.1, "model": 0.9}, "temperature": 1.0,
        "logits": {"given": 0.0, "model": 1.0}, "contribution_bias": {"given": 0.0, "model": 0.0},
        "scores": {"attention": [1 / len(words)] * len(words), "contribution": suggested_scores},
        "contributions": {"model": suggested_scores, "given": given_scores},
        "contribution_mean": [0.0] * len(words),
    }  # fmt: skip


def test_contrast_words_are_the_difference_of_the_two_classes():
    words = ["alpha", "beta", ",", "gamma", "Beta"]
    record = _record(words, [0.5, 0.0, 0.0, 0.1, 0.0], [0.1, 0.4, 0.9, 0.1, 0.6])
    toward_model = contrast_words(record, "model", "given")
    # "," is no word, gamma a tie, beta once (at its strongest).
    assert [w["word"] for w in toward_model] == ["Beta"]
    assert toward_model[0]["score"] == pytest.approx(0.6)
    assert [w["word"] for w in contrast_words(record, "given", "model")] == ["alpha"]
    assert contrast_words(record, "given", "absent") == []


def test_audit_page_escapes_every_word_and_links_each_entry(tmp_path):
    record = _record(["<script>alert(1)</script>", "plain"], [0.9, 0.0], [0.0, 0.7])
    entry = {"rank": 1, "id": "doc<1>", "split": "val", "given": "given", "suggested": "model",
             "score": 0.1, "p_given": 0.1, "p_suggested": 0.9, "fold": 0}  # fmt: skip
    summary = {"config": "c<b>.yaml", "documents": 10, "folds": 2, "filter_by": "both",
               "flagged": 1, "out_of_sample_accuracy": 0.9, "retrain": None,
               "by_class": [{"label": "<i>given</i>", "documents": 5, "flagged": 1}]}  # fmt: skip
    index = write_audit_report([entry], [record], summary, tmp_path / "report")
    page = index.read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "doc&lt;1&gt;" in page and "c&lt;b&gt;.yaml" in page and "<i>given</i>" not in page
    href = re.search(r'<a href="(docs/doc-[0-9]+\.html)">doc&lt;1&gt;', page).group(1)
    assert (tmp_path / "report" / href).is_file()
    assert "<script>alert" not in (tmp_path / "report" / href).read_text()


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
    "audit: killed and run again; resumed into a folder planned with other settings",
    "finished folds reused, probabilities of other weights scored again; another plan refused "
    "in one line naming what differs",
)
def test_audit_finds_planted_flips_resumes_and_refuses_another_plan(
    noisy_corpus, monkeypatch, capsys
):
    folder, flipped = noisy_corpus
    out = folder / "audit"
    fit_args = json.dumps([
        "--data.source", str(folder / "corpus.jsonl"), "--data.max_docs_per_class", "null",
        "--data.max_tokens", "256", "--trainer.callbacks=[]", "--model.n_layers", "0",
        "--trainer.max_epochs", "8", "--model.lr", "0.01",
    ])  # fmt: skip
    args = ["audit", "--config", TINY, "--out", str(out), "--folds", "2", "--fit_args", fit_args]
    main([*args, "--retrain", "true"])
    summary = json.loads((out / "audit.json").read_text())
    plan = json.loads((out / "audit_plan.json").read_text())
    pool = {doc for fold in plan["fold_splits"] for doc in fold["test"]}
    for fold, split in enumerate(plan["fold_splits"]):
        # The fold's own run trained on the documents the plan gave it, not on its held-out ones.
        run_dir = out / "folds" / f"fold-{fold}"
        assert json.loads((run_dir / "split.json").read_text()) == split
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
    retrain = summary["retrain"]
    assert retrain["removed"] == len(rows)
    assert retrain["cleaned"]["train_documents"] < retrain["baseline"]["train_documents"]
    assert retrain["cleaned"]["documents"] == retrain["baseline"]["documents"]  # same test
    page = (out / "report" / "index.html").read_text()
    assert page.count('href="docs/doc-') == len(rows)

    # Resumed: nothing trains again, the same results come back.
    def no_training(*_, **__):
        raise AssertionError("a finished fold was trained again")

    monkeypatch.setattr(audit.subprocess, "run", no_training)
    # Probabilities written for other weights are scored again, never reused.
    scored = out / "folds" / "fold-0" / audit.OUT_OF_SAMPLE
    stale = json.loads(scored.read_text())
    scored.write_text(json.dumps({**stale, "weights": "other", "probs": stale["probs"][::-1]}))
    main(args)
    assert json.loads(scored.read_text()) == stale
    with (out / "audit.csv").open() as handle:
        assert list(csv.DictReader(handle)) == rows
    # The same folder with other settings: refused in one line, nothing of it reused.
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["audit", "--config", TINY, "--out", str(out), "--folds", "3",
              "--fit_args", fit_args])  # fmt: skip
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "holds an audit with other folds" in line and "\n" not in line
