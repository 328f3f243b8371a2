"""``docclass audit``: the training and validation labels a model confidently disagrees with.

Every document of the config's training and validation splits gets probabilities from a model
that never trained on it. The documents are cut into k folds stratified by label; for each fold
``docclass fit`` runs in its own process (the same fit path, the config's own trainer: a GPU
when it names one) on the other folds, a share of them carved off for validation (early
stopping, the temperature), and is tested on the fold. Confident learning (cleanlab's
``find_label_issues``) flags the documents whose label the out-of-sample probabilities
confidently contradict, and ranks them by the probability of their given label (or, under
``--filter_by calibrated_count_by_self_confidence``, flags cleanlab's calibrated count of them
by that probability alone). ``--with_audits`` first averages each document's probabilities with
finished audits of the same documents by other configs.

The test split is never read, so it stays untouched for ``--retrain``: the config trained once
on its whole split and once without the flagged documents, both scored on test.

Resumable: the plan (folds, ids, labels) is written first and checked before anything is
reused; a fold with probabilities on disk is done, a fold with a ``last.ckpt`` resumes from it.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from docclass.data.cleaning import TEXT_HASHES, text_hash
from docclass.errors import ConfigError, DataError, RunStopped, UserError
from docclass.files import lock_folder, spreadsheet_safe, write_atomically
from docclass.inference.calibration import calibrate, labelled_logits, write_calibration
from docclass.inference.classifier import DocClassifier, resolve_device
from docclass.inference.model_facts import read_json
from docclass.inference.reporting import Documents
from docclass.interpret.default_method import DefaultMethod, default_method
from docclass.interpret.explain import CONTRAST_RULES, class_contrast, explain_documents
from docclass.interpret.inputs import encode_documents
from docclass.interpret.records import method_label
from docclass.processes import end_with_parent

PLAN = "audit_plan.json"
OUT_OF_SAMPLE = "out_of_sample.json"
AUDIT_CSV = "audit.csv"
SUMMARY = "audit.json"
# What a run folder was asked to train on: a folder started on another split is refused.
REQUESTED_SPLIT = "requested_split.json"
# Seconds a stopped fold's process gets to end after SIGTERM before it is killed.
CHILD_STOP_SECONDS = 30
CSV_FIELDS = (
    "rank", "id", "split", "given_label", "suggested_label", "score",
    "p_given", "p_suggested", "fold",
)  # fmt: skip
# The last rule is cleanlab's calibrated estimate of how many labels are wrong, taken in order of
# the given label's probability (the pairing cleanlab.count.num_label_issues documents): the four
# before it choose per pair of classes, and so flag documents that sit between two classes as
# readily as labels flipped at random, which get almost no probability for their given label.
SELF_CONFIDENCE_RULE = "calibrated_count_by_self_confidence"
FILTERS = (
    "prune_by_noise_rate", "prune_by_class", "both", "confident_learning", SELF_CONFIDENCE_RULE
)  # fmt: skip


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
    # A class with no document at all is short too: cleanlab cannot estimate its noise.
    short = [name for c, name in enumerate(label_names) if counts[c] < folds]
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


def documents_fingerprint(ids: list[str], texts: list[str], labels: list[str]) -> str:
    """A hash of the audited documents and their given labels: a plan (and the fold runs it
    made) is reused only for the very same ones."""
    return hashlib.sha256(json.dumps([ids, texts, labels]).encode()).hexdigest()


def _fit_command(config: str, fit_args: list[str], split: Path, run_dir: Path) -> list[str]:
    command = [
        sys.executable, "-m", "docclass.cli", "fit", "--config", config, *fit_args,
        "--data.split_file", str(split), "--trainer.default_root_dir", str(run_dir),
        "--trainer.enable_progress_bar", "false", "--test_after_fit", "true",
        # The audit calibrates every fold itself (_calibrated_fold): one path, and a fold
        # killed between testing and calibrating cannot slip through uncalibrated.
        "--calibrate_after_fit", "false", "--report_after_fit", "false",
    ]  # fmt: skip
    last = run_dir / "checkpoints" / "last.ckpt"
    if last.is_file():
        # Killed after an epoch: go on from there (Lightning restores the epoch and the
        # callbacks' state).
        command += ["--ckpt_path", str(last)]
    return command


def fit_run(config: str, fit_args: list[str], split: dict[str, list[str]], run_dir: Path) -> dict:
    """``docclass fit`` in its own process on ``split`` (ids per split), unless its run already
    finished (``metrics.json``, written after testing); returns the run's metrics. A run
    folder started, or finished, on another split is refused."""
    asked, written = run_dir / REQUESTED_SPLIT, run_dir / "split.json"
    metrics = run_dir / "metrics.json"
    # The split a finished run wrote is what its DataModule really read; an unfinished one is
    # judged by what it was asked for.
    previous = written if metrics.is_file() else asked
    if (metrics.is_file() or asked.is_file()) and not _same_documents(
        read_json(previous), read_json(asked) if asked.is_file() else None, split
    ):
        raise ConfigError(
            f"{run_dir}: was trained on another split (another plan, --filter_by or "
            "--with_audits), or on documents whose texts or labels have changed since, or its "
            "split is unknown; delete that folder to train it again"
        )
    if (
        not (metrics.is_file() or asked.is_file())
        and (run_dir / "checkpoints" / "last.ckpt").is_file()
    ):
        # _fit_command would resume from it, and nothing says which documents it trained on:
        # it may have seen the fold's held-out ones.
        raise ConfigError(
            f"{run_dir}: holds checkpoints/last.ckpt but neither metrics.json nor "
            f"{REQUESTED_SPLIT}, so the split it trained on is unknown; delete that folder to "
            "train it again"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if not metrics.is_file():
        # Written for a run about to train only: a finished run's request stays as it started
        # it (an old one, without labels, is not stamped with today's).
        write_json_file(asked, split)
        returncode = run_child(_fit_command(config, fit_args, asked, run_dir))
        if returncode or not metrics.is_file():
            raise UserError(
                f"{run_dir}: docclass fit exited with {returncode} (its output is above); fix "
                "the cause and run the same command again: finished runs are kept"
            )
    return read_json(metrics)


def _with_text_hashes(
    split: dict[str, list[str]], texts: dict[str, str], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """``split`` with each named document's text hash, as a run's own split.json has: a fold
    run's child process then refuses data that changed after the audit planned its folds.
    With ``labels``, a hash of every named document's label too (a finished run is reused
    only for the same ones: the re-training's test labels are in no plan)."""
    ids = [doc_id for name in ("train", "val", "test") for doc_id in split[name]]
    content = {**split, TEXT_HASHES: {doc_id: text_hash(texts[doc_id]) for doc_id in ids}}
    if labels is not None:
        given = json.dumps([[doc_id, labels[doc_id]] for doc_id in ids])
        content[LABELS_SHA256] = hashlib.sha256(given.encode()).hexdigest()
    return content


def _same_documents(written: dict | None, asked: dict | None, split: dict[str, Any]) -> bool:
    """Whether a run's split (``written``: what it read, or what it was asked) names the
    documents of ``split``: the same ids, the same texts where it recorded them, and the
    same labels where the request it was started with recorded them. A run reused on ids
    alone kept the re-training's test figures of texts since changed."""
    if written is None or _ids_only(written) != _ids_only(split):
        return False
    recorded = written.get(TEXT_HASHES) or {}
    asked_texts = split.get(TEXT_HASHES) or {}
    if any(recorded.get(doc_id, text) != text for doc_id, text in asked_texts.items()):
        return False
    labels = (asked or {}).get(LABELS_SHA256)
    return labels is None or labels == split.get(LABELS_SHA256, labels)


LABELS_SHA256 = "labels_sha256"


def _ids_only(split: dict[str, Any] | None) -> dict[str, Any] | None:
    """A split.json's ids per split, without the text hashes a run writes beside them."""
    return None if split is None else {name: split.get(name) for name in ("train", "val", "test")}


def _stopped(signum: int, frame: Any) -> None:
    raise RunStopped(
        "audit stopped by SIGTERM, and the fold it was training with it; run the same "
        "command again to resume (finished folds are kept, the stopped one goes on from its "
        "last.ckpt)"
    )


def run_child(command: list[str]) -> int:
    """Run a child process to its end; SIGTERM to the audit, Ctrl+C or any error here stops
    the child too, so no ``docclass fit`` keeps training behind a stopped audit; an audit
    killed outright (SIGKILL) takes it along through the kernel."""
    child = subprocess.Popen(command, preexec_fn=functools.partial(end_with_parent, os.getpid()))
    handles = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stopped) if handles else None
    try:
        return child.wait()
    finally:
        if handles:
            signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=CHILD_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def write_json_file(path: Path, value: Any, indent: int | None = None) -> None:
    """Written whole or not at all (a kill mid-write leaves the old file or none)."""
    write_atomically(path, json.dumps(value, indent=indent) + "\n")


def _calibrated_fold(
    run_dir: Path, metrics: dict, validation: Documents, label_names: list[str], device: str
) -> DocClassifier:
    """The fold's tested weights with their temperature, fitted on the fold's validation
    share here when the run has none for them."""
    classifier = DocClassifier.load(run_dir / "checkpoints" / "last.ckpt", device=device)
    if classifier.trained.fingerprint != metrics["test"]["weights"]:
        raise DataError(
            f"{run_dir}: checkpoints/last.ckpt is not the weights the run tested (a "
            "trainer.max_steps or max_time limit stopped it mid-epoch, or the folder was "
            "edited); remove such a limit, delete the folder and run again"
        )
    if classifier.labels != label_names:
        raise DataError(
            f"{run_dir}: the fold's model has labels {classifier.labels}, the audit "
            f"{label_names}; delete the folder and run the audit again"
        )
    if not classifier.calibrated:
        facts = calibrate(classifier.trained, validation, None, str(classifier.device))
        write_calibration(run_dir, facts)
        classifier = DocClassifier(classifier.trained, device, calibration=facts)
    return classifier


def _score_fold(classifier: DocClassifier, held: Documents, weights: str) -> dict[str, Any]:
    """The fold's model's calibrated probabilities for the documents it did not train on,
    from the unrounded logits (ties at a rounded 0 would leave the ranking to pool order)."""
    logits, _ = labelled_logits(classifier.trained, held, str(classifier.device))
    if len(logits) != len(held.ids):
        trained = classifier.trained
        encoded = encode_documents(trained.tokenizer, held.texts, trained.max_tokens)
        empty = [i for i, document in zip(held.ids, encoded, strict=True) if not document.token_ids]
        raise DataError(
            f"{held.description}: documents {empty[:3]} have no token to classify; remove them "
            "from the source"
        )
    probs = torch.softmax(logits.double() / classifier.temperature, dim=-1)
    return {
        "ids": held.ids,
        "probs": probs.tolist(),
        "temperature": classifier.temperature,
        "weights": weights,
    }


def _readable(path: Path) -> Any:
    """A file the audit can write again (a fold's probabilities): damaged counts as absent."""
    try:
        return read_json(path)
    except UserError:
        return None


def _fold_documents(split: list[str], pool: dict[str, tuple[str, str]], what: str) -> Documents:
    return Documents(
        texts=[pool[i][0] for i in split],
        ids=list(split),
        labels=[pool[i][1] for i in split],
        description=f"the audit's {what}",
    )


def _fold_probabilities(
    plan: dict[str, Any], out: Path, config: str, fit_args: list[str],
    pool: dict[str, tuple[str, str]], device: str,
) -> dict[str, Any]:  # fmt: skip
    """Every fold run (or reused) and scored: ``{id: (fold, probabilities)}`` and each fold's
    test figures. ``pool``: each audited id's text and given label."""
    by_id: dict[str, tuple[int, list[float]]] = {}
    figures = []
    texts = {doc_id: text for doc_id, (text, _) in pool.items()}
    for fold, split in enumerate(plan["fold_splits"]):
        run_dir = out / "folds" / f"fold-{fold}"
        metrics = fit_run(config, fit_args, _with_text_hashes(split, texts), run_dir)
        scored, weights = run_dir / OUT_OF_SAMPLE, metrics["test"]["weights"]
        facts = _readable(scored) or {}
        if facts.get("weights") != weights:
            validation = _fold_documents(split["val"], pool, f"fold {fold}'s validation")
            classifier = _calibrated_fold(run_dir, metrics, validation, plan["label_names"], device)
            held = _fold_documents(split["test"], pool, f"fold {fold}")
            facts = _score_fold(classifier, held, weights)
            write_json_file(scored, facts)
            del classifier
            if torch.cuda.is_available():
                # The next fold's process trains on the same GPU.
                torch.cuda.empty_cache()
        if facts["ids"] != split["test"]:
            raise DataError(f"{scored}: written for another fold; delete {run_dir} and rerun")
        by_id.update(
            {doc_id: (fold, p) for doc_id, p in zip(facts["ids"], facts["probs"], strict=True)}
        )
        figures.append({"fold": fold, "temperature": facts["temperature"], **_test_scores(metrics)})
        print(f"audit: fold {fold + 1}/{len(plan['fold_splits'])} done ({figures[-1]})", flush=True)
    return {"by_id": by_id, "folds": figures}


def finished_audit_probabilities(
    folder: Path, plan: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Another finished audit's plan and out-of-sample probabilities by id, once it is known to
    have audited exactly this audit's documents, given labels and classes (``plan``: this
    audit's) and every fold of it was scored by that fold's tested weights."""
    other = _readable(folder / PLAN)
    if other is None:
        raise ConfigError(
            f"--with_audits {folder}: holds no audit ({PLAN}); run docclass audit --out "
            f"{folder} with the other config first"
        )
    for key in ("documents and labels", "label_names"):
        if other.get(key) != plan[key]:
            # Averaging rows of other documents, or classes in another order, would flag
            # labels from another corpus's probabilities without a word.
            raise ConfigError(
                f"--with_audits {folder}: audited other {key} than this audit; give an audit "
                "of the same documents (the same data source, split and labels)"
            )
    probs: dict[str, list[float]] = {}
    for fold, split in enumerate(other["fold_splits"]):
        run_dir = folder / "folds" / f"fold-{fold}"
        facts, metrics = _readable(run_dir / OUT_OF_SAMPLE), _readable(run_dir / "metrics.json")
        if (
            facts is None or metrics is None or facts.get("ids") != split["test"]
            or facts.get("weights") != metrics["test"]["weights"]
        ):  # fmt: skip
            raise ConfigError(
                f"--with_audits {folder}: fold {fold} is unfinished or was scored by other "
                f"weights; run docclass audit --out {folder} again to finish it"
            )
        probs.update(zip(facts["ids"], facts["probs"], strict=True))
    ours = {doc_id for split in plan["fold_splits"] for doc_id in split["test"]}
    if set(probs) != ours:
        raise ConfigError(
            f"--with_audits {folder}: its folds scored {len(set(probs) - ours)} documents this "
            f"audit lacks and missed {len(ours - set(probs))} it has; give an audit of the same "
            "documents"
        )
    return other, probs


def averaged_with(
    by_id: dict[str, tuple[int, list[float]]], others: list[dict[str, list[float]]]
) -> dict[str, tuple[int, list[float]]]:
    """This audit's probabilities averaged with other audits' of the same documents; each
    document keeps its own fold (whose model explains it)."""
    return {
        doc_id: (fold, np.mean([probs, *(other[doc_id] for other in others)], axis=0).tolist())
        for doc_id, (fold, probs) in by_id.items()
    }


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
    from cleanlab.count import num_label_issues
    from cleanlab.filter import find_label_issues as cleanlab_issues
    from cleanlab.rank import get_label_quality_scores

    # cleanlab checks that rows sum to 1; float sums may miss by an ulp.
    probs = probs / probs.sum(axis=1, keepdims=True)
    quality = get_label_quality_scores(given, probs, method="self_confidence")
    if filter_by == SELF_CONFIDENCE_RULE:
        count = num_label_issues(given, probs, estimation_method="off_diagonal_calibrated")
        # As under cleanlab's other rules, a document whose most probable class is its given
        # label is never flagged: it would be "suggested" the label it has.
        candidates = np.flatnonzero(probs.argmax(axis=1) != given)
        # Stable: equal scores keep the documents' order, so a rerun flags the same ones.
        return candidates[np.argsort(quality[candidates], kind="stable")][:count], quality
    # n_jobs 1: no pool of processes forked from one holding torch's threads.
    ranked = cleanlab_issues(
        given, probs, filter_by=filter_by, return_indices_ranked_by="self_confidence", n_jobs=1
    )
    return np.asarray(ranked, dtype=int), quality


def audited_pool(datamodule: Any) -> dict[str, tuple[str, str]]:
    """Each training and validation document's id → (text, given label), once ids are known
    to be unique across every split (a repeated id would merge two documents' results, and let
    a fold train on a test document of the same id)."""
    if datamodule.stream:
        raise ConfigError(
            f"data.stream {datamodule.stream!r}: a streamed training set cannot be cut into "
            "folds; audit a config that reads its training documents from data.source"
        )
    names = list(datamodule.label_names)
    every = [i for s in ("train", "val", "test") for i in datamodule.splits[s]["id"]]
    repeated = sorted(i for i, n in Counter(every).items() if n > 1)
    if repeated:
        raise DataError(
            f"{datamodule.source_spec.source}: ids {repeated[:3]} name more than one document; "
            "give every document a unique id (or drop the id column to number them)"
        )
    return {
        doc_id: (text, names[label])
        for s in ("train", "val")
        for doc_id, text, label in zip(
            *(datamodule.splits[s][c] for c in ("id", "text", "label")), strict=True
        )
    }


def _read_or_write_plan(
    out: Path, settings: dict[str, Any], pool: dict[str, tuple[str, str]], datamodule: Any
) -> dict[str, Any]:
    """The audit's plan, checked against what would be planned now when one is on disk."""
    ids = list(pool)
    given = [pool[i][1] for i in ids]
    names = settings["label_names"]
    texts = [pool[i][0] for i in ids]
    settings = {
        **settings,
        # The config file itself: a fold trained under another recipe must not be mixed in.
        "config file": hashlib.sha256(Path(settings["config"]).read_bytes()).hexdigest(),
        # And those --fit_args names (--config extra.yaml): their settings are the folds' too.
        "files in fit_args": _files_named(settings["fit_args"]),
        "documents and labels": documents_fingerprint(ids, texts, given),
    }
    path = out / PLAN
    if path.is_file():
        try:
            plan = json.loads(path.read_text())
            # The config as typed is not compared (configs/x.yaml and its absolute path are
            # one file): its contents are, as "config file".
            changed = [key for key in settings if key != "config" and plan[key] != settings[key]]
        except (ValueError, KeyError, TypeError):
            changed = ["the plan file itself (unreadable, or from an earlier docclass)"]
        if changed:
            raise ConfigError(
                f"{out}: holds an audit with other {', '.join(changed)}; pass another --out, "
                f"or delete the folder {out} to start over"
            )
        return plan
    trained = [name for name in ("folds", "retrain") if (out / name).is_dir()]
    if trained:
        # Their runs would be reused on their split ids alone, whatever settings trained them.
        raise ConfigError(
            f"{out}: holds {' and '.join(trained)}/ but no {PLAN}, so what trained them is "
            f"unknown; pass another --out, or delete the folder {out} to start over"
        )
    folds_of = plan_folds(
        ids, [names.index(g) for g in given], names, settings["folds"],
        datamodule.val_fraction, datamodule.split_seed,
    )  # fmt: skip
    plan = {**settings, "fold_splits": folds_of}
    out.mkdir(parents=True, exist_ok=True)
    write_json_file(path, plan)
    return plan


def _files_named(fit_args: list[str]) -> dict[str, str]:
    """The SHA-256 of each config file ``fit_args`` names (``--config extra.yaml`` or
    ``--config=extra.yaml``): their settings are the folds' too."""
    values = [arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
              for arg in fit_args]  # fmt: skip
    return {
        value: hashlib.sha256(Path(value).read_bytes()).hexdigest()
        for value in values
        if Path(value).suffix.lower() in {".yaml", ".yml", ".json"} and Path(value).is_file()
    }


def _accuracy(
    pool: dict[str, tuple[str, str]], names: list[str], by_id: dict[str, tuple[int, list[float]]]
) -> float:
    """The share of audited documents whose most probable class is their given label."""
    return float(np.mean([int(np.argmax(by_id[i][1])) == names.index(pool[i][1]) for i in pool]))


def _flagged_entries(
    pool: dict[str, tuple[str, str]], splits: dict[str, str], names: list[str],
    by_id: dict[str, tuple[int, list[float]]], filter_by: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """The flagged documents, most likely wrong first. ``splits``: each audited id's split."""
    ids = list(pool)
    given = np.asarray([names.index(pool[i][1]) for i in ids])
    probs = np.asarray([by_id[i][1] for i in ids], dtype=float)
    ranked, quality = find_label_issues(given, probs, filter_by)
    suggested = probs.argmax(axis=1)
    entries = []
    for rank, row in enumerate(ranked, start=1):
        doc_id, label = ids[row], given[row]
        entries.append(
            {
                "rank": rank, "id": doc_id, "split": splits[doc_id], "given": names[label],
                "suggested": names[suggested[row]], "score": round(float(quality[row]), 6),
                "p_given": float(probs[row, label]),
                "p_suggested": float(probs[row, suggested[row]]), "fold": by_id[doc_id][0],
            }
        )  # fmt: skip
    return entries


def write_audit_csv(entries: list[dict[str, Any]], path: Path) -> None:
    """One row per flagged document: ``score`` is the out-of-sample probability of the given
    label (cleanlab's self-confidence: lower, more likely wrong).

    An id, split or label that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
    return, and is not a plain number (``-1``), is written with a ``'`` before it, so that a
    spreadsheet opening the file shows it as text instead of running it as a formula;
    ``audit.json`` and the page keep it as given. Strip that one leading ``'`` to match such a
    row to its document."""
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(CSV_FIELDS)
    for e in entries:
        texts = [spreadsheet_safe(str(e[key])) for key in ("id", "split", "given", "suggested")]
        writer.writerow(
            [e["rank"], *texts, e["score"], round(e["p_given"], 6), round(e["p_suggested"], 6),
             e["fold"]]
        )  # fmt: skip
    write_atomically(path, table.getvalue())


def _explain_flagged(
    entries: list[dict[str, Any]], pool: dict[str, tuple[str, str]], out: Path, device: str
) -> tuple[list[dict[str, Any]], DefaultMethod]:
    """Each flagged document explained by the fold model that did not train on it, in rank
    order, with ``audit_contrast``: each word's push toward the suggested class rather than
    the given one, by the fold model's default method. Also that method and why."""
    records: dict[str, dict[str, Any]] = {}
    method = None
    for fold in sorted({e["fold"] for e in entries}):
        chosen = [e for e in entries if e["fold"] == fold]
        run_dir = out / "folds" / f"fold-{fold}"
        classifier = DocClassifier.load(run_dir / "checkpoints" / "last.ckpt", device=device)
        own = _contrast_method(classifier.default)
        if method is not None and own.method != method.method:
            # Every fold is trained alike and measures no faithfulness: a difference means a
            # run folder this audit did not write.
            raise ConfigError(
                f"{run_dir}: its default word-score method is {own.method}, the other folds' "
                f"{method.method}; delete the folder and run the audit again"
            )
        method = own
        texts = [pool[e["id"]][0] for e in chosen]
        explained = explain_documents(
            classifier.trained,
            texts,
            doc_ids=[e["id"] for e in chosen],
            labels=[e["given"] for e in chosen],
            classes="contrast",
            device=classifier.device,
        )
        toward, against = [e["suggested"] for e in chosen], [e["given"] for e in chosen]
        contrasts = class_contrast(
            classifier.trained, texts, toward, against, method.method, device=classifier.device
        )
        for record, high, low, scores in zip(explained, toward, against, contrasts, strict=True):
            record["audit_contrast"] = {
                "method": method.method,
                "toward": high,
                "against": low,
                "scores": scores,
            }
            records[str(record["id"])] = record
    return [records[str(e["id"])] for e in entries], method or _contrast_method(None)


def _contrast_method(default: DefaultMethod | None) -> DefaultMethod:
    """The fold model's default method when it can contrast two classes (a fold run measures
    no faithfulness, so this is docclass's unmeasured default), else that unmeasured default,
    saying why."""
    if default is None:
        return default_method(None)
    if default.method in CONTRAST_RULES:
        return default
    fallback = default_method(None).method
    return DefaultMethod(
        fallback,
        f"{method_label(fallback)} is shown first: the model's default, "
        f"{method_label(default.method)}, gives each word one score whatever the class, and "
        "the audit contrasts two classes.",
    )


def retrain_without(
    datamodule: Any, flagged: set[str], out: Path, config: str, fit_args: list[str]
) -> dict[str, Any]:
    """The config trained on its own split, and again without the flagged documents (from
    train and validation), both scored on the untouched test split."""
    split = {s: list(datamodule.splits[s]["id"]) for s in ("train", "val", "test")}
    texts = {
        doc_id: text
        for s in ("train", "val", "test")
        for doc_id, text in zip(split[s], datamodule.splits[s]["text"], strict=True)
    }
    names = datamodule.label_names
    labels = {
        doc_id: names[label]
        for s in ("train", "val", "test")
        for doc_id, label in zip(split[s], datamodule.splits[s]["label"], strict=True)
    }
    cleaned = {s: [i for i in ids if i not in flagged] if s != "test" else ids
               for s, ids in split.items()}  # fmt: skip
    figures: dict[str, Any] = {"test_documents": len(split["test"])}
    for name, chosen in (("baseline", split), ("cleaned", cleaned)):
        metrics = fit_run(
            config, fit_args, _with_text_hashes(chosen, texts, labels), out / "retrain" / name
        )
        # Flagged validation documents are removed too: both counts, so the page adds up.
        figures[name] = {
            **_test_scores(metrics),
            "train_documents": len(chosen["train"]),
            "val_documents": len(chosen["val"]),
        }
        print(f"audit: re-trained ({name}): {figures[name]}", flush=True)
    figures["removed"] = (
        len(split["train"]) + len(split["val"]) - (len(cleaned["train"]) + len(cleaned["val"]))
    )
    return figures


def _by_class(
    pool: dict[str, tuple[str, str]], names: list[str], entries: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    audited = Counter(label for _, label in pool.values())
    flagged = Counter(e["given"] for e in entries)
    return [{"label": n, "documents": audited[n], "flagged": flagged[n]} for n in names]


def _other_audits(
    folders: list[str], out_dir: Path, plan: dict[str, Any]
) -> list[tuple[Path, dict[str, Any], dict[str, list[float]]]]:
    """Each ``--with_audits`` folder with its plan and probabilities, checked before any fold
    trains (a wrong folder is refused at once, not after hours of training), and no two of
    them scored by the same weights."""
    seen: set[Path] = {out_dir.resolve()}
    owners: dict[str, str] = {}
    others = []
    for folder in map(Path, folders):
        if folder.resolve() in seen:
            raise ConfigError(
                f"--with_audits {folder}: is this audit's own --out or is named twice, which "
                "would count the same probabilities twice; give each other audit once"
            )
        seen.add(folder.resolve())
        # Refuses a folder with no plan.
        other, probs = finished_audit_probabilities(folder, plan)
        # A copy under another path passes the path check: its weights give it away.
        _claim_weights(owners, _fold_weights(folder, other), folder, str(folder))
        others.append((folder, other, probs))
    return others


def _claim_weights(owners: dict[str, str], weights: list[str], folder: Path, name: str) -> None:
    """Records ``weights`` as ``name``'s in ``owners`` (fingerprint → audit), refusing any one
    another audit already holds: the two are one audit (a copy), whose probabilities would
    count twice in the mean."""
    for fingerprint in weights:
        if owners.setdefault(fingerprint, name) != name:
            raise ConfigError(
                f"--with_audits {folder}: was scored by the same weights as "
                f"{owners[fingerprint]} (one is a copy of the other), which would count its "
                "probabilities twice; give each audit once, each by another config or other "
                "--fit_args"
            )


def _fold_weights(out: Path, plan: dict[str, Any]) -> list[str]:
    """The weights fingerprint each fold of an audit was scored by."""
    return [
        read_json(out / "folds" / f"fold-{fold}" / OUT_OF_SAMPLE)["weights"]
        for fold in range(len(plan["fold_splits"]))
    ]


def _with_audits_summary(
    others: list[tuple[Path, dict[str, Any], dict[str, list[float]]]], out_dir: Path,
    plan: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """What each other audit was (config, its fit arguments, its folds' weights), refusing one
    scored by the weights of this audit or of another one named: a copy would count them
    twice."""
    # Every fold's weights, this audit's and each other's, in one set: any overlap is a copy.
    owners: dict[str, str] = {}
    _claim_weights(owners, _fold_weights(out_dir, plan), out_dir, f"this audit ({out_dir})")
    described = []
    for folder, other_plan, _ in others:
        weights = _fold_weights(folder, other_plan)
        _claim_weights(owners, weights, folder, str(folder))
        described.append({"out": str(folder), "config": other_plan["config"],
                          "fit_args": other_plan["fit_args"], "fold_weights": weights})  # fmt: skip
    return described


def audit_command(
    config: str,
    out: str = "reports/audit",
    folds: int = 5,
    fit_args: list[str] | None = None,
    filter_by: Literal[FILTERS] = "prune_by_noise_rate",  # type: ignore[valid-type]
    retrain: bool = False,
    report_documents: int | None = 500,
    device: str = "auto",
    with_audits: list[str] | None = None,
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
        filter_by: the rule for flagging: one of cleanlab's find_label_issues rules, or
            calibrated_count_by_self_confidence (cleanlab's calibrated count of wrong labels,
            the lowest probabilities of the given label first).
        retrain: also train the config on its split with and without the flagged documents
            and report both on test.
        report_documents: the page explains at most this many flagged documents (the most
            likely first); audit.csv lists them all. null: every one.
        device: where to score and explain (auto: CUDA when available).
        with_audits: finished audits of the same documents by other configs (their --out
            folders): each document's probabilities are averaged over this audit and those
            before flagging. Models that err differently flag fewer sound labels.
    """
    _needs_cleanlab()
    resolve_device(device)  # checked before the first fold trains, not when it is scored
    if report_documents is not None and report_documents < 0:
        raise ConfigError(f"--report_documents {report_documents}: give 0 or more, or null")
    fit_args, out_dir = list(fit_args or []), Path(out)
    if any(arg.split("=")[0] == "--ckpt_path" for arg in fit_args):
        raise ConfigError(
            "--fit_args: --ckpt_path is the audit's own (a checkpoint trained on the whole "
            "split would have seen every held-out document); remove it"
        )
    # One audit at a time in a folder: two would train the same folds and interleave results.
    hold = lock_folder(out_dir, "--out")
    try:
        return _audit(
            config, out_dir, folds, fit_args, filter_by, retrain, report_documents, device,
            with_audits or [],
        )  # fmt: skip
    finally:
        if hold is not None:
            hold.close()


def _audit(
    config: str, out_dir: Path, folds: int, fit_args: list[str], filter_by: str, retrain: bool,
    report_documents: int | None, device: str, with_audits: list[str],
) -> dict[str, Any]:  # fmt: skip
    """:func:`audit_command`'s work, once its folder is held."""
    from docclass.train.lightning_cli import datamodule_from_config

    datamodule = datamodule_from_config(config, fit_args)
    datamodule.prepare()
    pool = audited_pool(datamodule)
    if retrain and not len(datamodule.splits["test"]):
        # Found now, not after every fold has trained (the re-training's test step failed).
        raise ConfigError(
            f"--retrain scores both trainings on the test split, and {config} gives it no "
            "documents; give a split with a test part, or drop --retrain"
        )
    names = list(datamodule.label_names)
    settings = {"config": config, "fit_args": fit_args, "folds": folds, "label_names": names}
    plan = _read_or_write_plan(out_dir, settings, pool, datamodule)
    others = _other_audits(with_audits, out_dir, plan)
    scored = _fold_probabilities(plan, out_dir, config, fit_args, pool, device)
    described = _with_audits_summary(others, out_dir, plan)
    by_id = averaged_with(scored["by_id"], [probs for _, _, probs in others])
    splits = {i: s for s in ("train", "val") for i in datamodule.splits[s]["id"]}
    entries = _flagged_entries(pool, splits, names, by_id, filter_by)
    # This config's own accuracy; the averaged one is reported beside it.
    accuracy = _accuracy(pool, names, scored["by_id"])
    summary = {
        "config": config, "fit_args": fit_args, "documents": len(pool), "folds": folds,
        "filter_by": filter_by, "flagged": len(entries), "out_of_sample_accuracy": accuracy,
        "fold_figures": scored["folds"], "by_class": _by_class(pool, names, entries),
        "label_names": names, "retrain": None,
        "with_audits": described,
        "averaged_out_of_sample_accuracy": _accuracy(pool, names, by_id) if others else None,
    }  # fmt: skip
    if retrain:
        flagged = {e["id"] for e in entries}
        summary["retrain"] = retrain_without(datamodule, flagged, out_dir, config, fit_args)
    shown = entries[:report_documents] if report_documents is not None else entries
    records, method = _explain_flagged(shown, pool, out_dir, device)
    summary["contrast_method"] = method.method
    index = _write_results(out_dir, entries, shown, records, summary, method)
    print(
        f"audit: {len(entries)} of {len(pool)} documents flagged "
        f"(out-of-sample accuracy {accuracy:.4f}) → {out_dir / AUDIT_CSV}, {index}"
    )
    return summary


def _write_results(
    out_dir: Path, entries: list[dict[str, Any]], shown: list[dict[str, Any]],
    records: list[dict[str, Any]], summary: dict[str, Any], method: DefaultMethod,
) -> Path:  # fmt: skip
    """The page, ``audit.csv`` and ``audit.json``, once every slow step (re-training,
    explaining) is done: a rerun that fails before leaves the last run's three together."""
    from docclass.report.audit import write_audit_report

    # The last run's three go first: a failure while writing leaves some of this run's, none
    # of that one's beside them. audit.json, written last, says the three are whole.
    for stale in (out_dir / SUMMARY, out_dir / AUDIT_CSV, out_dir / "report" / "index.html"):
        stale.unlink(missing_ok=True)
    index = write_audit_report(shown, records, summary, out_dir / "report", method)
    write_audit_csv(entries, out_dir / AUDIT_CSV)
    write_json_file(out_dir / SUMMARY, summary, indent=2)
    return index
