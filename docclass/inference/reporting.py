"""The report pipeline: documents → explanations → faithfulness → the HTML report.

Glue between the parts that never meet: documents come from a config's split or from a data
source, word scores from :mod:`docclass.interpret`, faithfulness from :mod:`docclass.evaluate`,
pages from :mod:`docclass.report`. The records are written as ``explanations.jsonl.gz`` beside the
pages, so the pages can be rebuilt (or analysed) without the model.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from jsonargparse.typing import NonNegativeInt, PositiveInt

from docclass.artifacts.checkpoint import load_checkpoint
from docclass.artifacts.folder import (
    SOURCE_PATH_SHA256,
    SPLIT_SHA256,
    path_digest,
    read_folder_config,
)
from docclass.artifacts.load import TrainedClassifier, load_classifier
from docclass.artifacts.locate import resolve_model
from docclass.data.sources import SourceSpec, load_source, local_source_path
from docclass.errors import CheckpointError, DataError, UserError
from docclass.evaluate.agreement import add_agreement
from docclass.evaluate.counterfactual import add_counterfactuals, search_limit
from docclass.evaluate.erasure import (
    FRACTIONS,
    Copies,
    aggregate_faithfulness,
    document_faithfulness,
)
from docclass.evaluate.faithfulness import faithfulness_figures
from docclass.evaluate.plausibility import plausibility, read_rationales
from docclass.inference.classifier import classify_texts, resolve_device
from docclass.inference.model_facts import (
    choose_default,
    faithfulness_tables,
    model_calibration,
    model_default_method,
    read_json,
    run_calibration,
    run_dir_of,
)
from docclass.interpret.explain import explain_documents
from docclass.interpret.inputs import float32_classifier
from docclass.interpret.methods import score_rules
from docclass.interpret.records import HEAD_PREFIX, file_record, method_label, write_jsonl
from docclass.metrics import classification_scores
from docclass.report.figures import removal_curves_figure, save_png
from docclass.report.html import (
    EXPLANATIONS,
    FAITHFULNESS_FILE,
    REPORT_META,
    first_method,
    rewrite_report,
    write_report,
)
from docclass.report.summaries import LOW_CONFIDENCE
from docclass.train.datamodule import DocDataModule
from docclass.train.lightning_cli import datamodule_from_config

log = logging.getLogger(__name__)

CONFIG_SUFFIXES = (".yaml", ".yml")
# A report explains at most this many documents unless told otherwise: with faithfulness each
# costs about 0.3 s on 2 CPU cores, so 1,000 take minutes, a hub test split would take hours.
REPORT_MAX_DOCUMENTS = 1000


@dataclass
class Documents:
    """Texts to explain, with ids and (where known) true label names."""

    texts: list[str]
    ids: list[str]
    labels: list[str | None]
    description: str


def documents_from_datamodule(datamodule: DocDataModule, split: str) -> Documents:
    """A prepared DataModule's split, exactly the documents training held out."""
    datamodule.prepare()
    if split not in datamodule.splits:
        raise DataError(f"no split {split!r}; choose one of {sorted(datamodule.splits)}")
    dataset = datamodule.splits[split]
    names = datamodule.label_names
    return Documents(
        texts=list(dataset["text"]),
        ids=[str(i) for i in dataset["id"]],
        labels=[names[label] for label in dataset["label"]],
        description=f"{datamodule.source_spec.source} · {split} split ({len(dataset)} documents)",
    )


def _documents_from_source(
    source: str, split: str, text_column: str, label_column: str | None, trained_on: bool = False
) -> Documents:
    # load_source keys splits by role: any split but train and test is asked for as the
    # validation one, which it refuses when absent (`validation` explained train's documents).
    role = split if split in ("train", "test") or Path(source).is_file() else "val"
    loaded = load_source(
        SourceSpec(
            source=source,
            text_column=text_column,
            label_column=label_column,
            val_split=split if role == "val" else None,
            labels_required=False,  # an unlabelled document is explained all the same
        )
    )
    chosen = role if role in loaded.splits else "train"
    if trained_on and (chosen != role or Path(source).is_file()):
        # Its documents are the ones the model trained on, held out only as its run split them:
        # explained and scored as new, they read as a model far surer and righter than it is.
        why = "a file has no splits" if Path(source).is_file() else f"it has no {split!r} split"
        raise DataError(
            f"{source}: the model trained on it, and {why}, so every document would be "
            "explained, training ones among them; report with the run's config (--data <its "
            ".yaml>) to explain the run's own held-out split"
        )
    dataset = loaded.splits[chosen]
    if Path(source).is_file():
        # One file has no splits: every row is explained, whatever --split says.
        chosen = "all rows"
    elif chosen != role:
        log.warning("%s has no %r split: explaining all %s documents", source, split, chosen)
    else:
        chosen = split
    if "label" in dataset.column_names:
        # Names already (load_source decodes them); a blank or missing label is no label, not
        # a class called "" that every prediction would miss.
        labels = [None if v is None or not str(v).strip() else str(v) for v in dataset["label"]]
    else:
        labels = [None] * len(dataset)
    return Documents(
        texts=list(dataset["text"]),
        ids=[str(i) for i in dataset["id"]],
        labels=labels,
        description=f"{source} · {chosen} ({len(dataset)} documents)",
    )


def check_same_split(
    ckpt: str, run_dir: Path | None, data: str, datamodule: DocDataModule, command: str
) -> None:
    """Refuse held-out documents of another split than the checkpoint's (a stale split.json
    left by another fit into the run folder, or other data settings): some would be documents
    it trained on. A temperature fitted to its certainty there flattered every probability;
    a report or faithfulness table measured there flattered its accuracy and chose the default
    method on documents it had learnt."""
    trained_on = DocDataModule.trained_split(load_checkpoint(ckpt))
    _refuse_another_split(ckpt, trained_on, run_dir, data, datamodule, command)


def check_folder_split(
    model: str, folder: Path, data: str, datamodule: DocDataModule, command: str
) -> None:
    """:func:`check_same_split` for a model folder (``model`` as given: a path or a hub id),
    which carries the split its checkpoint trained on in ``config.json`` (``split.sha256``).
    Refused where ``data`` reads the corpus the folder names; where it names another (or the
    same one written another way, which a folder cannot tell apart), a split other than the
    trained one is said, not refused: another corpus's config explains that corpus's split."""
    folder_config = read_folder_config(folder)
    trained_on = (folder_config.get("split") or {}).get(SPLIT_SHA256)
    trained = (folder_config.get("data") or {}).get("source")
    same = names_the_folders_source(folder_config, datamodule.source_spec.source)
    if same:
        _refuse_another_split(model, trained_on, None, data, datamodule, command)
        return
    if trained_on is None or trained_on == datamodule.split_fingerprint():
        return
    log.warning(
        "%s: trained on %s, a split other than the one --data %s makes of %s; if that is the "
        "same corpus, some of these documents are ones it trained on: %s with the config it "
        "was trained with",
        model,
        trained or "data it does not name",
        data,
        datamodule.source_spec.source,
        command,
    )


def names_the_folders_source(folder_config: dict, source: str) -> bool:
    """Whether ``source`` names the corpus a model folder's weights trained on. A local source
    is recorded by its last part alone and its resolved path's digest: only the same path is
    taken as it (another corpus's ``train.csv`` is not)."""
    trained = folder_config.get("data") or {}
    if trained.get("source") is None:
        return False
    if trained.get(SOURCE_PATH_SHA256):
        here = local_source_path(source)
        return here is not None and path_digest(here) == trained[SOURCE_PATH_SHA256]
    return same_source_name(trained["source"], source)


def _refuse_another_split(
    model: str,
    trained_on: str | None,
    run_dir: Path | None,
    data: str,
    datamodule: DocDataModule,
    command: str,
) -> None:
    if trained_on is None:
        log.warning(
            "%s: written by an earlier docclass, it names no split; %s reads the split --data "
            "%s makes, unchecked (a split.json another fit left in the run folder would go "
            "unnoticed)",
            model,
            command,
            data,
        )
    elif trained_on != datamodule.split_fingerprint():
        split_file = run_dir / "split.json" if run_dir is not None else None
        using = f" with {split_file}" if split_file is not None and split_file.is_file() else ""
        raise DataError(
            f"{model}: trained on another split than --data {data}{using} makes (the data, a "
            f"data.* setting or the split file changed since); {command} with the config and "
            "split.json of the fit that wrote this checkpoint"
        )


def trained_source_matches(run_dir: Path, source: str) -> bool | None:
    """Whether ``source`` is the one the run trained on (``metrics.json`` records it, a local
    path also resolved); None when the run does not say."""
    trained = (read_json(run_dir / "metrics.json") or {}).get("data") or {}
    trained_on = trained.get("source")
    if trained_on is None:
        return None
    where, here = trained.get("source_path"), local_source_path(source)
    if where is not None:  # a local file or folder then: the same one now, or another
        return here is not None and here == Path(where)
    # A name (the embedded corpus, a hub id), or a run from before paths were recorded.
    return same_source_name(trained_on, source)


def same_source_name(trained_on: Any, source: Any) -> bool:
    """Whether two recorded source names (a corpus or hub name, or a path as given) agree."""
    return str(trained_on) == str(source) or (
        Path(str(trained_on)).resolve() == Path(str(source)).resolve()
    )


def load_documents(
    data: str,
    ckpt: str,
    split: str = "test",
    text_column: str = "text",
    label_column: str | None = "label",
    command: str = "report",
) -> Documents:
    """Documents named by ``data``: a YAML config (its split, as training made it, read by
    LightningCLI's own parser with the checkpoint's tokenizer and labels) or a source.

    With a config of the corpus the checkpoint trained on, the split is the run's own
    ``split.json`` where it has one (unless the config names a split file), and one the
    checkpoint did not train on is refused (:func:`check_same_split`): a config's other seed
    made a "test" split of documents it had trained on, in silence. Another corpus's config
    explains that corpus's split, as before."""
    if Path(data).suffix.lower() in CONFIG_SUFFIXES:
        if (text_column, label_column) != ("text", "label"):
            log.warning(
                "--text_column and --label_column name a data file's columns; %s names its own "
                "(data.text_column, data.label_column), which are read", data,
            )  # fmt: skip
        overrides = ["--data.tokenizer_from", str(ckpt)]
        datamodule = datamodule_from_config(data, overrides)
        run_dir = run_dir_of(ckpt)
        same = run_dir is None or trained_source_matches(run_dir, datamodule.source_spec.source)
        split_file = run_dir / "split.json" if run_dir is not None else None
        if same is not False and split_file and split_file.is_file() and not datamodule.split_file:
            overrides += ["--data.split_file", str(split_file)]
            datamodule = datamodule_from_config(data, overrides)
        # A hub id is neither file nor folder as written: its (cached) download is the folder.
        local = resolve_model(ckpt)
        if same is not False and local.is_file():
            check_same_split(ckpt, run_dir, data, datamodule, command)
        elif local.is_dir():
            check_folder_split(ckpt, local, data, datamodule, command)
        return documents_from_datamodule(datamodule, split)
    # A source from a config or the API keeps its ~ (no shell expanded it).
    source = os.path.expanduser(data)
    return _documents_from_source(
        source, split, text_column, label_column, _trained_on(ckpt, source)
    )


def _trained_on(ckpt: str, source: str) -> bool:
    """Whether the model ``ckpt`` names trained on ``source``, as its run or folder records."""
    run_dir = run_dir_of(ckpt)
    if run_dir is not None:
        return trained_source_matches(run_dir, source) is True
    try:
        local = resolve_model(ckpt)
    except CheckpointError:
        return False  # no model there: loading it says so, in its own words
    return local.is_dir() and names_the_folders_source(read_folder_config(local), source)


def stratified_sample(
    keys: Sequence[Any], size: int, seed: int = 0, taken: Sequence[int] = ()
) -> list[int]:
    """``size`` positions drawn without replacement, each ``key`` (class) in proportion to its
    share (largest remainders get the seats rounding leaves), besides the positions already
    ``taken``; sorted. Every position when there are no more than ``size``."""
    chosen = set(taken)
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        if i not in chosen:
            groups[key].append(i)
    rest = sum(len(members) for members in groups.values())
    if size >= rest:
        return sorted(chosen | {i for members in groups.values() for i in members})
    rng = np.random.default_rng(seed)
    quotas = {key: size * len(members) / rest for key, members in groups.items()}
    take = {key: int(quota) for key, quota in quotas.items()}
    by_remainder = sorted(quotas, key=lambda key: (take[key] - quotas[key], str(key)))
    for key in by_remainder[: size - sum(take.values())]:
        take[key] += 1
    for key, members in groups.items():
        chosen |= set(rng.choice(members, take[key], replace=False).tolist())
    return sorted(chosen)


def select_for_report(
    labels: Sequence[str | None], predicted: Sequence[str | None], limit: int, seed: int = 0
) -> list[int]:
    """Which documents a capped report shows: every misclassified one first, then a sample of
    the correct ones stratified by true label (predicted where unknown), in proportion to the
    classes. Positions, in input order.

    When the errors alone would fill more than half of ``limit``, a seeded sample of them takes
    that half: the faithfulness table that picks the default method keeps the split's share
    of errors, and it needs correct documents to draw them from."""
    n = len(predicted)
    if n <= limit:
        return list(range(n))
    rng = np.random.default_rng(seed)
    errors = [i for i in range(n) if labels[i] is not None and labels[i] != predicted[i]]
    room = max(limit - (n - len(errors)), (limit + 1) // 2)  # the correct ones fill the rest
    shown = errors if len(errors) <= room else rng.choice(errors, room, replace=False).tolist()
    keys = [
        label if label is not None else guess
        for label, guess in zip(labels, predicted, strict=True)
    ]
    # Every error counts as taken, so the rest is drawn from correct documents only.
    correct = stratified_sample(keys, limit - len(shown), seed, taken=errors)
    return sorted(set(shown) | (set(correct) - set(errors)))


def population_figures(
    labels: Sequence[str | None], predicted: Sequence[str | None], label_names: list[str]
) -> dict[str, Any]:
    """Accuracy, macro-F1 and errors over every labelled, classified document."""
    index = {name: i for i, name in enumerate(label_names)}
    pairs = [
        (index[t], index[p])
        for t, p in zip(labels, predicted, strict=True)
        if t in index and p in index
    ]
    figures: dict[str, Any] = {
        "documents": len(predicted),
        # What the accuracy is over: labelled and classified, which ``documents`` need not be.
        "scored": len(pairs),
        "accuracy": None,
        "macro_f1": None,
    }
    if pairs:
        matrix = np.zeros((len(label_names), len(label_names)), dtype=np.int64)
        for true, guess in pairs:
            matrix[true, guess] += 1
        scores = classification_scores(matrix)
        figures.update(accuracy=scores["accuracy"], macro_f1=scores["macro_f1"])
        figures["errors"] = int(matrix.sum() - np.trace(matrix))
    return figures


def measure_faithfulness(
    classifier: TrainedClassifier,
    texts: Sequence[str],
    records: list[dict[str, Any]],
    device: str = "cpu",
    documents: int | None = None,
    error_share: float | None = None,
    copies: dict[int, Copies] | None = None,
) -> dict[str, Any] | None:
    """Per document and method, ERASER comprehensiveness and sufficiency under masked removal
    (stored in each measured record's ``faithfulness``); returns their summary over documents.
    ``copies``, when given, receives each measured document's perturbed copies (by record
    position) for the counterfactual search to read.

    With ``documents``, only a sample of that many is measured (:func:`faithfulness_sample`):
    misclassified documents in the share ``error_share`` of the population they come from (by
    default their share of ``records``; a capped report puts every error first, so it passes
    the population's), each part stratified by class. The table that picks the default method
    then describes the documents as they come; the summary says so.

    Single pool heads are left to ``docclass faithfulness``: they are views of pool attention,
    never a default, and their rankings were a third of the report's perturbed copies."""
    classifier = float32_classifier(classifier)
    chosen = faithfulness_positions(records, documents, error_share)
    for i in chosen:
        record = records[i]
        scores = record.get("scores", {})
        methods = {k: v for k, v in scores.items() if not k.startswith(HEAD_PREFIX)}
        measured = {**record, "scores": methods}
        run: Copies = {}
        figures = document_faithfulness(
            classifier, texts[i], measured, "mask", device=device, copies=run
        )
        if copies is not None:
            # Only copies small enough for the counterfactual search: at most its limit removed.
            limit = search_limit(record["words_read"])
            copies[i] = {
                key: distribution
                for key, distribution in run.items()
                if np.count_nonzero(~np.frombuffer(key[1], dtype=bool)) <= limit
            }
        if figures:
            record["faithfulness"] = {"removal": "mask", "methods": figures}
    per_document = [r["faithfulness"]["methods"] for r in records if r.get("faithfulness")]
    if not per_document:
        return None
    summary = {
        "removal": "mask",
        "fractions": list(FRACTIONS),
        "documents": len(per_document),
        "methods": aggregate_faithfulness(per_document),
    }
    if len(chosen) < len(records):
        errors = sum(_misclassified(records[i]) for i in chosen)
        share = error_share if error_share is not None else _error_share_of(records)
        summary["sample"] = (
            f"a sample of {len(per_document)} of the {len(records)} documents ({errors} "
            f"misclassified; the split has {100 * share:.1f} % errors), drawn in proportion to "
            "the classes (seed 0)"
        )
    return summary


def _error_share_of(records: Sequence[dict[str, Any]]) -> float:
    return sum(_misclassified(record) for record in records) / max(1, len(records))


def _misclassified(record: dict[str, Any]) -> bool:
    return record.get("label") is not None and record["label"] != record.get("predicted")


def faithfulness_sample(
    records: Sequence[dict[str, Any]], size: int, error_share: float | None = None, seed: int = 0
) -> list[int]:
    """``size`` positions of ``records``: ``round(size × error_share)`` misclassified ones (at
    most as many as there are) and correct ones for the rest, each part stratified by true class
    (predicted where unknown). ``error_share`` defaults to the records' own; sorted."""
    if size >= len(records):
        return list(range(len(records)))
    errors = [i for i, record in enumerate(records) if _misclassified(record)]
    rest = [i for i, record in enumerate(records) if not _misclassified(record)]
    share = len(errors) / len(records) if error_share is None else error_share
    wanted = min(len(errors), round(size * share))
    wanted = max(wanted, size - len(rest))

    def part(positions: list[int], count: int) -> list[int]:
        keys = [records[i].get("label") or records[i].get("predicted") for i in positions]
        return [positions[j] for j in stratified_sample(keys, count, seed)]

    return sorted(part(errors, wanted) + part(rest, size - wanted))


def faithfulness_positions(
    records: Sequence[dict[str, Any]], documents: int | None, error_share: float | None
) -> list[int]:
    """Which records the report's faithfulness table measures: ``documents`` of them
    (:func:`faithfulness_sample`), or all. A capped report (``error_share`` given) lists every
    misclassified document first, so "all" would weigh errors far above their share of the
    split: it measures the most records that keep the split's share instead."""
    if documents is None and error_share is not None:
        # As many as keep the split's share: bounded by the correct records where errors are
        # over-represented, and by the errors where the cap left fewer than their share (a
        # split of mostly errors, capped to half of them).
        errors = sum(_misclassified(record) for record in records)
        correct = len(records) - errors
        most = [int(correct / (1 - error_share)) if error_share < 1 else len(records)]
        most += [int(errors / error_share)] if error_share > 0 else []
        documents = min(most)
    if documents is None or documents >= len(records):
        return list(range(len(records)))
    return faithfulness_sample(records, documents, error_share)


def _calibrated(
    classifier: TrainedClassifier, run_dir: str | Path | None
) -> tuple[TrainedClassifier, dict[str, Any] | None]:
    """The classifier with the temperature measured for its weights (its folder's, or its run's
    ``calibration.json``), so the pages show the probabilities ``predict`` gives; and that
    calibration's figures for the index."""
    fingerprint = lambda: classifier.fingerprint  # noqa: E731
    calibration = model_calibration("", classifier.folder_config, fingerprint) or run_calibration(
        Path(run_dir) if run_dir else None, fingerprint
    )
    if not calibration:
        return classifier.with_temperature(1.0), None
    return classifier.with_temperature(calibration["temperature"]), calibration


def _known_labels(
    documents: Documents, limit: int | None, names: list[str]
) -> tuple[list[str | None], str]:
    """The first ``limit`` documents' labels, those the model has no class for read as no
    label, and the page's subtitle, which counts them. Left in, they counted as errors on the
    pages and in the sample, but the confusion matrix, and so the accuracy, skipped them
    ("SPORT" for "sport", a new class)."""
    labels, known = documents.labels[:limit], set(names)
    description = documents.description
    if limit is not None and limit < len(documents.texts):
        # The cards' figures are the first documents', not the split's the subtitle names.
        description += f" · its first {limit} documents only"
    unknown = collections.Counter(
        label for label in labels if label is not None and label not in known
    )
    if not unknown:
        return labels, description
    said = (
        f"{sum(unknown.values())} label(s) the model has no class for, read as unlabelled: "
        f"{', '.join(repr(name) for name, _ in unknown.most_common(3))}"
        f"{' …' if len(unknown) > 3 else ''}"
    )
    log.warning("%s", said)
    kept = [label if label in known else None for label in labels]
    return kept, f"{description} · {said}"


def _refuse_diverged(records: list[dict[str, Any]], documents: Documents) -> None:
    # A record keeps a non-finite logit as None: a diverged model's report was a TypeError
    # traceback at the first page, its "predictions" NaN's argmax, the first class.
    diverged = sum(None in (record.get("logits") or {}).values() for record in records)
    if diverged:
        raise CheckpointError(
            f"{documents.description}: the model's output is not finite on {diverged} of "
            f"{len(records)} documents (its weights diverged); nothing to explain: retrain it"
        )


def make_report(
    classifier: TrainedClassifier,
    documents: Documents,
    out_dir: str | Path,
    run_dir: str | Path | None = None,
    title: str = "docclass report",
    limit: int | None = None,
    batch_size: int = 16,
    classes: Literal["predicted", "contrast", "all"] = "contrast",
    device: str = "cpu",
    faithfulness: bool = True,
    max_documents: int | None = None,
    counterfactuals: bool = True,
    rationales: str | Path | None = None,
    faithfulness_documents: int | None = None,
) -> dict[str, Any]:
    """Explain ``documents`` and write ``explanations.jsonl.gz``, ``index.html`` and the pages.

    With ``faithfulness``, every document (or a class-stratified sample of
    ``faithfulness_documents``) also gets ERASER comprehensiveness and sufficiency for each
    method and a random ranking (:func:`measure_faithfulness`): the pages' badges and the
    index's table. It costs several times explaining the words: a sample keeps the report of a
    pre-trained encoder's model within minutes.

    With ``max_documents``, a larger set is first classified whole (the fast path) and the
    report explains :func:`select_for_report`'s sample of it; its headline figures stay those of
    every document. A hub test split of 70,000 documents would otherwise take hours.

    The page's default method is the one the faithfulness table trusts most
    (:func:`docclass.interpret.default_method.default_method`); with ``counterfactuals`` each
    document also gets the fewest of its top words (by that method) whose removal flips the
    label. Method agreement is always measured; ``rationales`` (ERASER JSONL) adds plausibility.

    Returns:
        What was written and how long each stage took (also logged).
    """
    out_dir = Path(out_dir)
    model_default = None if faithfulness else _models_own_default(classifier, run_dir, out_dir)
    _clear_for_new_report(out_dir)
    classifier, calibration = _calibrated(classifier, run_dir)
    texts, ids = documents.texts[:limit], documents.ids[:limit]
    started = time.perf_counter()
    population, (labels, subtitle) = None, _known_labels(documents, limit, classifier.label_names)
    if max_documents is not None and len(texts) > max_documents:
        population, (texts, ids, labels) = _capped(
            classifier, texts, ids, labels, max_documents, device
        )
        subtitle = f"{subtitle} · {population['selection']}"
    records = explain_documents(classifier, texts, ids, labels, batch_size, classes, device=device)
    _refuse_diverged(records, documents)
    explained = time.perf_counter()
    # Faithfulness's copies without the default method's top words spare the counterfactuals'.
    copies: dict[int, Copies] | None = {} if counterfactuals else None
    summary = (
        measure_faithfulness(classifier, texts, records, device, faithfulness_documents,
                             _error_share(population), copies)
        if faithfulness else None
    )  # fmt: skip
    measured = time.perf_counter()
    checks = _record_checks(
        classifier, texts, records, summary, counterfactuals, rationales, device, copies,
        model_default,
    )  # fmt: skip
    checked = time.perf_counter()
    write_jsonl(map(file_record, records), out_dir / EXPLANATIONS)
    index = write_report(
        records, out_dir, classifier.label_names, title=title, subtitle=subtitle,
        run_dir=run_dir, faithfulness=summary, population=population, checks=checks,
        weights=classifier.fingerprint, calibration=calibration, scores=score_rules(),
        model_default=model_default,
    )  # fmt: skip
    stages = _stage_seconds(started, explained, measured, checked, time.perf_counter())
    log.info("report: %d documents, %s → %s", len(records), stages, index)
    return {"index": str(index), "documents": len(records), **stages}


def _models_own_default(
    classifier: TrainedClassifier, run_dir: Path | None, out_dir: Path
) -> dict | None:
    """The default method predict, classify and serve use for these weights (a folder's
    recorded choice, or the table of the run's report, where this report does not replace
    it), for a report that measures none: its pages show the same method first."""
    own_report = Path(run_dir) / "report" if run_dir is not None else None
    if classifier.folder_config.get("default_method"):
        chosen = model_default_method(
            "the model folder", classifier.folder_config, lambda: classifier.fingerprint
        )
    elif own_report is not None and own_report.resolve() != out_dir.resolve():
        tables = faithfulness_tables(own_report, classifier.fingerprint)
        if not tables:
            return None
        chosen = choose_default(tables)
    else:
        return None
    return {"method": chosen.method, "reason": chosen.reason}


def _clear_for_new_report(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = out_dir / FAITHFULNESS_FILE
    if stale.is_file():
        # Its figures describe the model and documents of the report being replaced.
        stale.unlink()
        log.info("removed %s: run 'docclass faithfulness' again for the new report", stale)


def _stage_seconds(
    started: float, explained: float, measured: float, checked: float, finished: float
) -> dict[str, float]:
    return {
        "explain_s": round(explained - started, 2),
        "faithfulness_s": round(measured - explained, 2),
        "counterfactuals_and_agreement_s": round(checked - measured, 2),
        "pages_s": round(finished - checked, 2),
        "total_s": round(finished - started, 2),
    }


def _error_share(population: dict[str, Any] | None) -> float | None:
    """The share of misclassified documents in a capped report's whole split (None uncapped:
    the records are the split)."""
    if population is None or population["accuracy"] is None:
        return None
    return 1.0 - population["accuracy"]


def _capped(
    classifier: TrainedClassifier,
    texts: list[str],
    ids: list[str],
    labels: list[str | None],
    max_documents: int,
    device: str,
) -> tuple[dict[str, Any], tuple[list, list, list]]:
    """Every document classified for the headline figures, and :func:`select_for_report`'s
    sample of them to explain: ``(population figures, (texts, ids, labels) shown)``."""
    results = classify_texts(classifier, texts, device=device, temperature=classifier.temperature)
    predicted = [result["label"] for result in results]
    population = population_figures(labels, predicted, classifier.label_names)
    # The headline's other counts are the split's too: the sample's, beside the split's
    # document count, read "213 documents · 40 below 60 % confidence" where all 213 were.
    population["uncertain"] = sum(
        result["score"] is not None and result["score"] < LOW_CONFIDENCE for result in results
    )
    population["truncated"] = sum(bool(result.get("truncated")) for result in results)
    population["failed"] = sum(result["label"] is None for result in results)
    chosen = select_for_report(labels, predicted, max_documents)
    wrong = [t is not None and t != p for t, p in zip(labels, predicted, strict=True)]
    errors, shown_errors = sum(wrong), sum(wrong[i] for i in chosen)
    population["selection"] = (
        f"{len(chosen)} of {len(texts)} documents shown: "
        + (
            "every misclassified one first"
            if shown_errors >= errors
            else f"{shown_errors} of the {errors} misclassified"
        )
        + ", then a sample stratified by class"
    )
    shown = tuple([values[i] for i in chosen] for values in (texts, ids, labels))
    return population, shown


def _record_checks(
    classifier: TrainedClassifier,
    texts: Sequence[str],
    records: list[dict[str, Any]],
    faithfulness: dict[str, Any] | None,
    counterfactuals: bool,
    rationales: str | Path | None,
    device: str,
    copies: dict[int, Copies] | None = None,
    model_default: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Counterfactuals by the default method (``model_default`` where the report measures no
    faithfulness), agreement between methods and, with rationales,
    plausibility: stored in the records, summarised for the index. ``copies``: the
    faithfulness measure's perturbed copies by record position."""
    # With a faithfulness sample, counterfactuals are searched on the same documents: each
    # costs a dozen passes, which through a pre-trained encoder a whole split cannot afford.
    searched = (
        [i for i, record in enumerate(records) if record.get("faithfulness")]
        if faithfulness and faithfulness.get("sample")
        else None
    )
    shown_first = first_method(faithfulness or {}, model_default)
    found = None
    if counterfactuals:
        method = shown_first.method
        found = add_counterfactuals(
            classifier, texts, records, method, device=device, positions=searched, copies=copies
        )
    return {
        "counterfactual": found,
        "agreement": add_agreement(records),
        "plausibility": plausibility(records, read_rationales(rationales)) if rationales else None,
    }


def report_command(
    ckpt: str,
    data: str,
    out: str,
    split: str = "test",
    text_column: str = "text",
    label_column: str | None = "label",
    limit: PositiveInt | None = None,
    batch_size: PositiveInt = 16,
    classes: Literal["predicted", "contrast", "all"] = "contrast",
    device: str = "cpu",
    faithfulness: bool = True,
    max_documents: PositiveInt | None = REPORT_MAX_DOCUMENTS,
    counterfactuals: bool = True,
    rationales: str | None = None,
    faithfulness_documents: PositiveInt | None = None,
) -> dict[str, Any]:
    """Explain documents with a trained checkpoint and write a standalone HTML report:
    index.html, one page per document, explanations.jsonl.gz.

    Args:
        ckpt: checkpoint written by 'docclass fit', a folder written by 'docclass export', or
            hub:owner/name@<commit> (a folder on the hub, pinned).
        data: a YAML config (its split, exactly as in training) or a data source: a
            CSV/JSONL/Parquet file, a folder of <class>/*.txt, 'bbc' or a hub dataset name.
        out: folder for the report (created).
        split: split to explain.
        text_column: text column of a data file.
        label_column: label column of a data file; null for unlabelled documents.
        limit: explain only the first N documents.
        batch_size: documents per forward pass.
        classes: whose contributions each document keeps beside its predicted class's:
            'contrast' (the runner-up, every other class given 1 % or more, at most 5 in all,
            and the true class: what the pages contrast and the index's confused pairs use),
            'all' (every class: files grow with the class count) or 'predicted' (none).
        device: cpu, cuda, cuda:1, ...
        faithfulness: measure each method's ERASER comprehensiveness per document (the pages'
            badges and the index's table); several times the cost of explaining.
        faithfulness_documents: measure faithfulness on a sample of this many documents,
            misclassified ones in the split's share, each part in proportion to the classes
            (the index says so); null measures every one.
        max_documents: explain at most this many: every misclassified document first, then a
            sample stratified by class (all are classified for the headline figures); null
            explains every document.
        counterfactuals: for each document, find the fewest of its top words (by the default
            method) whose removal flips the label (up to 20 % of its words).
        rationales: ERASER-format JSONL of human evidence spans, keyed by document id: adds
            each method's plausibility (token F1, IOU F1, AUPRC) to the report.
    """
    resolve_device(device)  # a device this machine lacks fails now, not after the loading
    refuse_out_that_is_no_folder(out)
    if rationales:
        read_rationales(rationales)  # a bad file fails now, not after the explaining
    documents = load_documents(data, ckpt, split, text_column, label_column)
    run_dir = run_dir_of(ckpt)
    summary = make_report(
        load_classifier(ckpt),
        documents,
        out,
        run_dir=run_dir,
        title=f"docclass report · {model_name(ckpt, run_dir)}",
        limit=limit,
        batch_size=batch_size,
        classes=classes,
        device=device,
        faithfulness=faithfulness,
        max_documents=max_documents,
        counterfactuals=counterfactuals,
        rationales=rationales,
        faithfulness_documents=faithfulness_documents,
    )
    print(
        f"report: {summary['documents']} documents in {summary['total_s']:.1f} s "
        f"→ {summary['index']}"
    )
    return summary


def refuse_out_that_is_no_folder(out: str | Path) -> None:
    """``--out`` naming a file (or a path through one) was a FileExistsError traceback, for
    ``faithfulness`` after all its measuring."""
    for path in (Path(out), *Path(out).parents):
        if path.exists() and not path.is_dir():
            raise UserError(f"--out {out}: {path} is a file, not a folder; give a folder")
        if path.exists():
            return


def model_name(ckpt: str, run_dir: Path | None) -> str:
    """What a report is titled after: the training run's folder name (``reports/bbc`` → "bbc")
    or an export folder's or hub repository's name, never a checkpoint file's ("last.ckpt")."""
    if run_dir is not None:
        return run_dir.name
    path = Path(ckpt.removeprefix("hub:").split("@")[0])
    return path.parent.name if path.suffix == ".ckpt" and path.parent.name else path.name


def faithfulness_command(
    ckpt: str,
    data: str,
    out: str,
    split: str = "test",
    limit: PositiveInt | None = None,
    removals: list[Literal["mask", "delete", "unk"]] = ["mask", "delete", "unk"],  # noqa: B006
    device: str = "cpu",
    sample: NonNegativeInt = 20,
    ig_steps: NonNegativeInt = 32,
    permutations: PositiveInt = 20,
    rationales: str | None = None,
    text_column: str = "text",
    label_column: str | None = "label",
) -> dict[str, Any]:
    """ERASER comprehensiveness and sufficiency (AOPC over 1-50 % of the words) of every
    word-score method beside a random ranking, permuted-pool and randomised-weight sanity
    checks, and on a sample integrated gradients and rank agreement with leave-one-word-out;
    writes faithfulness.json and .png (and renders again a report found in --out, when it
    explains the same weights under the same rules).

    Args:
        ckpt: checkpoint written by 'docclass fit', a folder written by 'docclass export', or
            hub:owner/name@<commit> (a folder on the hub, pinned).
        data: a YAML config (its split) or a data source.
        out: folder for faithfulness.json and .png.
        split: split to measure.
        limit: only the first N documents.
        removals: remove words by masking their tokens out, every other token keeping its
            position (mask); by cutting them out of the text, as ERASER does (delete); by
            replacing them with [UNK] (unk); any of them: '[mask, delete, unk]'.
        device: cpu, cuda, ...
        sample: documents (a fixed random sample) for integrated gradients, leave-one-word-out
            and the randomised-weights check; 0 skips them.
        ig_steps: integrated-gradients steps; 0 skips them.
        permutations: pool shuffles per document.
        rationales: ERASER-format JSONL of human evidence spans, keyed by document id: adds
            each method's plausibility (token F1, IOU F1, AUPRC).
        text_column: text column of a data file.
        label_column: label column of a data file; null for unlabelled documents (the
            figures follow the predicted class, so need no labels).
    """
    resolve_device(device)
    refuse_out_that_is_no_folder(out)  # now, not after every figure is measured
    evidence = read_rationales(rationales) if rationales else None
    classifier = load_classifier(ckpt)
    documents = load_documents(data, ckpt, split, text_column, label_column, command="faithfulness")
    figures = faithfulness_figures(
        classifier, documents.texts[:limit], removals, sample, ig_steps, permutations, device,
        ids=documents.ids[:limit], rationales=evidence,
    )  # fmt: skip
    figures = {
        "checkpoint": str(ckpt),
        "weights": classifier.fingerprint,  # whose figures these are (model_facts reads it)
        "scores": score_rules(),  # and which rules made the relevance methods' scores
        "data": documents.description,
        **figures,
    }
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FAITHFULNESS_FILE).write_text(json.dumps(figures, indent=2) + "\n")
    tables = {removal: result["aopc"] for removal, result in figures["removal"].items()}
    save_png(removal_curves_figure(tables, FRACTIONS), folder / "faithfulness.png")
    meta = folder / REPORT_META
    if meta.is_file() and (folder / EXPLANATIONS).is_file():
        written = json.loads(meta.read_text(encoding="utf-8"))
        if written.get("weights") != classifier.fingerprint:
            log.warning("%s: the report there explains other weights; not rendered again", meta)
        elif written.get("scores") != score_rules():
            log.warning(
                "%s: the report there was explained under other rules (%s); not rendered again: "
                "make it again with 'docclass report', then measure again into it",
                meta,
                written.get("scores") or "older ones",
            )
        else:
            figures["report"] = str(rewrite_report(folder))
    elif (folder / "explanations.jsonl").is_file():
        log.warning(
            "%s: an older report (plain explanations.jsonl) is not rendered again; make it "
            "again with 'docclass report' to see these figures in it",
            folder,
        )
    _print_faithfulness(figures, out)
    return figures


def _print_faithfulness(figures: dict[str, Any], out: str) -> None:
    for removal, result in figures["removal"].items():
        print(f"removal by {removal} ({result['seconds']} s, {figures['documents']} documents):")
        table = result["aopc"]
        floor = max(table["random"]["comprehensiveness"], 1e-9)
        for name, row in sorted(table.items(), key=lambda kv: -kv[1]["comprehensiveness"]):
            print(
                f"  {method_label(name):24s} comprehensiveness {row['comprehensiveness']:.3f} "
                f"({row['comprehensiveness'] / floor:.1f}× random)  "
                f"sufficiency {row['sufficiency']:.3f}"
            )
    permuted = figures["permuted_pool"]
    print(
        f"permuted pool: median total variation {permuted['median_total_variation']}, "
        f"{100 * permuted['documents_any_label_change']:.1f} % of documents change label"
    )
    if "sample" in figures:
        sample = figures["sample"]
        stages = sample["randomised_weights"]
        last = list(stages)[-1]
        print(f"sample of {sample['documents']} documents: τ vs leave-one-out, ρ all randomised")
        for name, row in sample["kendall_tau_vs_leave_one_out"].items():
            rho = stages[last].get(name, {}).get("mean", float("nan"))
            print(
                f"  {method_label(name):24s} τ {row['mean']:+.2f} ± {row['std']:.2f}   ρ {rho:+.2f}"
            )
    print(f"→ {out}/faithfulness.json, {out}/faithfulness.png")
    if "report" in figures:
        print(f"→ {figures['report']} (rendered again with these figures)")
