"""``docclass audit``: the training and validation labels a model confidently disagrees with.

Every document of the config's training and validation splits gets probabilities from a model
that never trained on it. The documents are cut into k folds stratified by label; for each fold
``docclass fit`` runs in its own process (the same fit path, the config's own trainer: a GPU
when it names one) on the other folds, a share of them carved off for validation (early
stopping, the temperature), and is tested on the fold. Confident learning (cleanlab's
``find_label_issues``) flags the documents whose label the out-of-sample probabilities
confidently contradict, and ranks them by the probability of their given label.

The test split is never read, so it stays untouched for ``--retrain``: the config trained once
on its whole split and once without the flagged documents, both scored on test.

Resumable: the plan (folds, ids, labels) is written first and checked before anything is
reused; a fold with probabilities on disk is done, a fold with a ``last.ckpt`` resumes from it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import numpy as np

from docclass.errors import ConfigError, DataError, UserError
from docclass.inference.classifier import DocClassifier
from docclass.interpret.explain import explain_documents

PLAN = "audit_plan.json"
OUT_OF_SAMPLE = "out_of_sample.json"
AUDIT_CSV = "audit.csv"
SUMMARY = "audit.json"
CSV_FIELDS = (
    "rank", "id", "split", "given_label", "suggested_label", "score",
    "p_given", "p_suggested", "fold",
)  # fmt: skip
FILTERS = ("prune_by_noise_rate", "prune_by_class", "both", "confident_learning")


def _needs_cleanlab() -> None:
    try:
        import cleanlab  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            "docclass audit needs cleanlab: pip install 'docclass[audit]' (or cleanlab>=2.9)"
        ) from error


def plan_folds(
    ids: list[str], labels: list[int], label_names: list[str], folds: int, val_fraction: float,
    seed: int,
) -> list[dict[str, list[str]]]:  # fmt: skip
    """Each fold's ``split.json``: the fold as ``test``; the rest as ``train`` and ``val``
    (``val_fraction`` of it), both stratified by label and seeded."""
    from sklearn.model_selection import StratifiedKFold, train_test_split

    if folds < 2:
        raise ConfigError(f"--folds {folds}: an audit needs at least 2 folds")
    counts = Counter(labels)
    short = sorted(label_names[c] for c, n in counts.items() if n < folds)
    if short:
        raise DataError(
            f"class(es) {short} have fewer than {folds} training and validation documents: "
            "lower --folds"
        )
    labels_array = np.asarray(labels)
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    plans = []
    for rest, held in splitter.split(np.zeros(len(ids)), labels_array):
        try:
            train, val = train_test_split(
                rest, test_size=val_fraction, stratify=labels_array[rest], random_state=seed
            )
        except ValueError as error:
            raise DataError(
                f"cannot carve a stratified validation share of {val_fraction:.0%} from a fold's "
                f"{len(rest)} training documents ({error}); set data.val_fraction or --folds"
            ) from error
        plans.append(
            {
                "train": [ids[i] for i in sorted(train)],
                "val": [ids[i] for i in sorted(val)],
                "test": [ids[i] for i in sorted(held)],
            }
        )
    return plans


def labels_fingerprint(ids: list[str], labels: list[str]) -> str:
    """A hash of the audited documents and their given labels: a plan is reused only for
    the very same ones."""
    return hashlib.sha256(json.dumps([ids, labels]).encode()).hexdigest()


def _fit_command(config: str, fit_args: list[str], split: Path, run_dir: Path) -> list[str]:
    command = [
        sys.executable, "-m", "docclass.cli", "fit", "--config", config, *fit_args,
        "--data.split_file", str(split), "--trainer.default_root_dir", str(run_dir),
        "--trainer.enable_progress_bar", "false",
        "--test_after_fit", "true", "--report_after_fit", "false",
    ]  # fmt: skip
    last = run_dir / "checkpoints" / "last.ckpt"
    if last.is_file():
        # Killed after an epoch: go on from there (Lightning restores the epoch and the
        # callbacks' state).
        command += ["--ckpt_path", str(last)]
    return command


def fit_run(config: str, fit_args: list[str], split: Path, run_dir: Path) -> dict[str, Any]:
    """``docclass fit`` in its own process on a split file, unless its run already finished
    (its ``metrics.json`` written after testing); returns the run's test metrics."""
    metrics = run_dir / "metrics.json"
    if not metrics.is_file():
        finished = subprocess.run(_fit_command(config, fit_args, split, run_dir))
        if finished.returncode or not metrics.is_file():
            raise UserError(
                f"{run_dir}: docclass fit exited with {finished.returncode}; fix the cause and "
                "run the same audit command again: finished folds are kept"
            )
    return json.loads(metrics.read_text())


def _score_fold(
    run_dir: Path, ids: list[str], texts: list[str], label_names: list[str], device: str
) -> dict[str, Any]:
    """The fold's model's calibrated probabilities for the documents it did not train on."""
    classifier = DocClassifier.load(run_dir / "checkpoints" / "last.ckpt", device=device)
    if classifier.labels != label_names:
        raise DataError(
            f"{run_dir}: the fold's model has labels {classifier.labels}, the audit "
            f"{label_names}; delete the folder and run the audit again"
        )
    results = classifier.predict(texts)
    return {
        "ids": ids,
        "probs": [[r["probs"][name] for name in label_names] for r in results],
        "temperature": classifier.temperature,
    }


def _fold_probabilities(
    plan: dict[str, Any], out: Path, config: str, fit_args: list[str], texts: dict[str, str],
    device: str,
) -> dict[str, Any]:  # fmt: skip
    """Every fold run (or reused) and scored: ``{id: (fold, probabilities)}`` and each fold's
    test figures."""
    by_id: dict[str, tuple[int, list[float]]] = {}
    figures = []
    for fold, split in enumerate(plan["folds"]):
        run_dir = out / "folds" / f"fold-{fold}"
        scored = run_dir / OUT_OF_SAMPLE
        split_path = out / "folds" / f"fold-{fold}.split.json"
        split_path.write_text(json.dumps(split))
        metrics = fit_run(config, fit_args, split_path, run_dir)
        if not scored.is_file():
            held, names = split["test"], plan["label_names"]
            facts = _score_fold(run_dir, held, [texts[i] for i in held], names, device)
            scored.write_text(json.dumps(facts))
        facts = json.loads(scored.read_text())
        if facts["ids"] != split["test"]:
            raise DataError(f"{scored}: written for another fold; delete {run_dir} and rerun")
        by_id.update(
            {doc_id: (fold, p) for doc_id, p in zip(facts["ids"], facts["probs"], strict=True)}
        )
        figures.append({"fold": fold, "temperature": facts["temperature"], **_test_scores(metrics)})
        print(f"audit: fold {fold + 1}/{len(plan['folds'])} done ({figures[-1]})", flush=True)
    return {"by_id": by_id, "folds": figures}


def _test_scores(metrics: dict[str, Any]) -> dict[str, Any]:
    test = metrics["test"]
    return {
        "accuracy": test["accuracy"],
        "macro_f1": test["macro_f1"],
        "documents": test["n_documents"],
    }


def find_label_issues(
    given: np.ndarray, probs: np.ndarray, filter_by: str
) -> tuple[np.ndarray, np.ndarray]:
    """cleanlab's confident learning: the flagged rows, most likely wrong first (lowest
    probability of the given label), and every row's label quality (that probability)."""
    from cleanlab.filter import find_label_issues as cleanlab_issues
    from cleanlab.rank import get_label_quality_scores

    # Probabilities were rounded to 6 decimals on the way: rows must sum to 1 for cleanlab.
    probs = probs / probs.sum(axis=1, keepdims=True)
    ranked = cleanlab_issues(
        given, probs, filter_by=filter_by, return_indices_ranked_by="self_confidence"
    )
    quality = get_label_quality_scores(given, probs, method="self_confidence")
    return np.asarray(ranked, dtype=int), quality


def _read_or_write_plan(
    out: Path, folds: int, config: str, fit_args: list[str], datamodule: Any
) -> dict[str, Any]:
    """The audit's plan, checked against what would be planned now when one is on disk."""
    splits, names = datamodule.splits, list(datamodule.label_names)
    ids = [*splits["train"]["id"], *splits["val"]["id"]]
    given = [names[label] for label in [*splits["train"]["label"], *splits["val"]["label"]]]
    fingerprint = labels_fingerprint(ids, given)
    settings = {"config": config, "fit_args": fit_args, "folds": folds, "label_names": names}
    path = out / PLAN
    if path.is_file():
        plan = json.loads(path.read_text())
        if plan["labels"] != fingerprint or {k: plan[k] for k in settings} != settings:
            raise ConfigError(
                f"{out}: holds an audit of other documents, labels or settings; pass another "
                "--out, or delete it to start over"
            )
        return plan
    folds_of = plan_folds(
        ids, [names.index(g) for g in given], names, folds, datamodule.val_fraction,
        datamodule.split_seed,
    )  # fmt: skip
    plan = {**settings, "labels": fingerprint, "folds": folds_of}
    out.mkdir(parents=True, exist_ok=True)
    (out / "folds").mkdir(exist_ok=True)
    path.write_text(json.dumps(plan))
    return plan


def _flagged_entries(
    datamodule: Any, by_id: dict[str, tuple[int, list[float]]], filter_by: str
) -> tuple[list[dict[str, Any]], float]:
    """The flagged documents, most likely wrong first, and the out-of-sample accuracy."""
    names = list(datamodule.label_names)
    rows = [
        (split, doc_id, label)
        for split in ("train", "val")
        for doc_id, label in zip(
            datamodule.splits[split]["id"], datamodule.splits[split]["label"], strict=True
        )
    ]
    given = np.asarray([label for _, _, label in rows])
    probs = np.asarray([by_id[doc_id][1] for _, doc_id, _ in rows], dtype=float)
    ranked, quality = find_label_issues(given, probs, filter_by)
    suggested = probs.argmax(axis=1)
    entries = []
    for rank, i in enumerate(ranked, start=1):
        split, doc_id, label = rows[i]
        entries.append(
            {
                "rank": rank, "id": doc_id, "split": split, "given": names[label],
                "suggested": names[suggested[i]], "score": round(float(quality[i]), 6),
                "p_given": probs[i, label], "p_suggested": probs[i, suggested[i]],
                "fold": by_id[doc_id][0],
            }
        )  # fmt: skip
    return entries, float((suggested == given).mean())


def write_audit_csv(entries: list[dict[str, Any]], path: Path) -> None:
    """One row per flagged document: ``score`` is the out-of-sample probability of the given
    label (cleanlab's self-confidence: lower, more likely wrong)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_FIELDS)
        for e in entries:
            writer.writerow(
                [
                    e["rank"], e["id"], e["split"], e["given"], e["suggested"], e["score"],
                    round(e["p_given"], 6), round(e["p_suggested"], 6), e["fold"],
                ]
            )  # fmt: skip


def _explain_flagged(
    entries: list[dict[str, Any]], texts: dict[str, str], out: Path, device: str
) -> list[dict[str, Any]]:
    """Each flagged document explained by the fold model that did not train on it, keeping
    the contributions of its given and suggested classes; in rank order."""
    records: dict[str, dict[str, Any]] = {}
    for fold in sorted({e["fold"] for e in entries}):
        chosen = [e for e in entries if e["fold"] == fold]
        run_dir = out / "folds" / f"fold-{fold}"
        classifier = DocClassifier.load(run_dir / "checkpoints" / "last.ckpt", device=device)
        explained = explain_documents(
            classifier.trained,
            [texts[e["id"]] for e in chosen],
            doc_ids=[e["id"] for e in chosen],
            labels=[e["given"] for e in chosen],
            classes="contrast",
            device=classifier.device,
        )
        records.update({str(r["id"]): r for r in explained})
    return [records[str(e["id"])] for e in entries]


def retrain_without(
    datamodule: Any, flagged: set[str], out: Path, config: str, fit_args: list[str]
) -> dict[str, Any]:
    """The config trained on its own split, and again without the flagged documents (from
    train and validation), both scored on the untouched test split."""
    split = {s: list(datamodule.splits[s]["id"]) for s in ("train", "val", "test")}
    cleaned = {s: [i for i in ids if i not in flagged] if s != "test" else ids
               for s, ids in split.items()}  # fmt: skip
    figures: dict[str, Any] = {"test_documents": len(split["test"])}
    for name, chosen in (("baseline", split), ("cleaned", cleaned)):
        path = out / "retrain" / f"{name}.split.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(chosen))
        metrics = fit_run(config, fit_args, path, out / "retrain" / name)
        figures[name] = {**_test_scores(metrics), "train_documents": len(chosen["train"])}
        print(f"audit: re-trained ({name}): {figures[name]}", flush=True)
    figures["removed"] = (
        len(split["train"]) + len(split["val"]) - (len(cleaned["train"]) + len(cleaned["val"]))
    )
    return figures


def _by_class(datamodule: Any, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = list(datamodule.label_names)
    audited = Counter(
        names[label] for s in ("train", "val") for label in datamodule.splits[s]["label"]
    )
    flagged = Counter(e["given"] for e in entries)
    return [{"label": n, "documents": audited[n], "flagged": flagged[n]} for n in names]


def audit_command(
    config: str,
    out: str = "reports/audit",
    folds: int = 5,
    fit_args: list[str] | None = None,
    filter_by: Literal[FILTERS] = "prune_by_noise_rate",  # type: ignore[valid-type]
    retrain: bool = False,
    report_documents: int | None = 500,
    device: str = "auto",
) -> dict[str, Any]:
    """Find likely label errors in a config's training and validation documents.

    Out-of-sample probabilities from k folds (each its own ``docclass fit``; resumable: run
    the same command again after a stop), cleanlab's confident learning, and in ``out``:
    ``audit.csv`` (id, given label, suggested label, score), ``report/index.html`` (ranked, the
    words for each label) and ``audit.json``.

    Args:
        config: the training config whose documents to audit (its split decides which are
            training and validation; test is never read).
        out: the audit's folder (fold runs, plan, results); an existing one is resumed.
        folds: how many folds; each document is held out by one.
        fit_args: more ``docclass fit`` arguments for every run, as a JSON list (e.g.
            '["--trainer.accelerator", "gpu"]' or a data.source override).
        filter_by: cleanlab's rule for flagging (its find_label_issues).
        retrain: also train the config on its split with and without the flagged documents
            and report both on test.
        report_documents: the page explains at most this many flagged documents (the most
            likely first); audit.csv lists them all. null: every one.
        device: where to score and explain (auto: CUDA when available).
    """
    _needs_cleanlab()
    from docclass.report.audit import write_audit_report
    from docclass.train.lightning_cli import datamodule_from_config

    fit_args, out_dir = list(fit_args or []), Path(out)
    datamodule = datamodule_from_config(config, fit_args)
    datamodule.prepare()
    plan = _read_or_write_plan(out_dir, folds, config, fit_args, datamodule)
    texts = {
        i: t for s in ("train", "val")
        for i, t in zip(datamodule.splits[s]["id"], datamodule.splits[s]["text"], strict=True)
    }  # fmt: skip
    scored = _fold_probabilities(plan, out_dir, config, fit_args, texts, device)
    entries, accuracy = _flagged_entries(datamodule, scored["by_id"], filter_by)
    write_audit_csv(entries, out_dir / AUDIT_CSV)
    summary = {
        "config": config, "fit_args": fit_args, "documents": len(texts), "folds": folds,
        "filter_by": filter_by, "flagged": len(entries), "out_of_sample_accuracy": accuracy,
        "fold_figures": scored["folds"], "by_class": _by_class(datamodule, entries),
        "label_names": list(datamodule.label_names), "retrain": None,
    }  # fmt: skip
    if retrain:
        flagged = {e["id"] for e in entries}
        summary["retrain"] = retrain_without(datamodule, flagged, out_dir, config, fit_args)
    shown = entries[:report_documents] if report_documents is not None else entries
    records = _explain_flagged(shown, texts, out_dir, device)
    index = write_audit_report(shown, records, summary, out_dir / "report")
    (out_dir / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(
        f"audit: {len(entries)} of {len(texts)} documents flagged "
        f"(out-of-sample accuracy {accuracy:.4f}) → {out_dir / AUDIT_CSV}, {index}"
    )
    return summary
