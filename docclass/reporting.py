"""``docclass report``: explain a set of documents with a checkpoint and write the HTML report.

Glue between the parts that never meet: documents come from a config's split or from a data
source, word scores from :mod:`docclass.explain`, pages from :mod:`docclass.report.html`. The
records are written as ``explanations.jsonl`` beside the pages, so the pages can be rebuilt
(or analysed) without the model.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from docclass.checkpoint import TrainedClassifier, load_classifier
from docclass.data import DocDataModule
from docclass.errors import DataError
from docclass.explain import explain_documents, write_jsonl
from docclass.faithfulness import document_faithfulness
from docclass.report.html import FAITHFULNESS_FILE, write_report
from docclass.sources import SourceSpec, load_source

log = logging.getLogger(__name__)

CONFIG_SUFFIXES = (".yaml", ".yml")


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


def _documents_from_config(path: Path, ckpt: str, split: str) -> Documents:
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise DataError(f"{path}: not a readable YAML config ({error})") from error
    section: dict[str, Any] = dict(config.get("data") or {})
    # The checkpoint's own tokenizer and label order replace whatever the config trains.
    section.pop("tokenizer", None)
    section["tokenizer_from"] = ckpt
    try:
        datamodule = DocDataModule(**section)
    except TypeError as error:
        raise DataError(f"{path}: the data section does not fit docclass ({error})") from error
    return documents_from_datamodule(datamodule, split)


def _documents_from_source(
    source: str, split: str, text_column: str, label_column: str | None
) -> Documents:
    loaded = load_source(
        SourceSpec(source=source, text_column=text_column, label_column=label_column)
    )
    chosen = split if split in loaded.splits else "train"
    if chosen != split:
        log.info("%s has no %r split: explaining all %s documents", source, split, chosen)
    dataset = loaded.splits[chosen]
    if "label" in dataset.column_names:
        names = loaded.label_names
        labels = [names[v] if names else str(v) for v in dataset["label"]]
    else:
        labels = [None] * len(dataset)
    return Documents(
        texts=list(dataset["text"]),
        ids=[str(i) for i in dataset["id"]],
        labels=labels,
        description=f"{source} · {chosen} ({len(dataset)} documents)",
    )


def load_documents(
    data: str,
    ckpt: str,
    split: str = "test",
    text_column: str = "text",
    label_column: str | None = "label",
) -> Documents:
    """Documents named by ``data``: a YAML config (its split, as training made it) or a source."""
    path = Path(data)
    if path.suffix.lower() in CONFIG_SUFFIXES:
        if not path.is_file():
            raise DataError(f"{data}: config not found; pass a file from configs/ or a data file")
        return _documents_from_config(path, ckpt, split)
    return _documents_from_source(data, split, text_column, label_column)


def make_report(
    classifier: TrainedClassifier,
    documents: Documents,
    out_dir: str | Path,
    run_dir: str | Path | None = None,
    title: str = "docclass report",
    limit: int | None = None,
    batch_size: int = 16,
    all_classes: bool = False,
    device: str = "cpu",
    faithfulness: bool = True,
) -> dict[str, Any]:
    """Explain ``documents`` and write ``explanations.jsonl``, ``index.html`` and the pages.

    With ``faithfulness``, every document also gets ERASER comprehensiveness and sufficiency
    for each method and a random ranking, removing words from the attention mask
    (:func:`docclass.faithfulness.document_faithfulness`): the pages' badges and the index's
    table. It costs about as much again as explaining the words.

    Returns:
        What was written and how long each stage took (also logged).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = out_dir / FAITHFULNESS_FILE
    if stale.is_file():
        # Its figures describe the model and documents of the report being replaced.
        stale.unlink()
        log.info("removed %s: run 'docclass faithfulness' again for the new report", stale)
    texts, ids, labels = documents.texts, documents.ids, documents.labels
    if limit is not None:
        texts, ids, labels = texts[:limit], ids[:limit], labels[:limit]
    started = time.perf_counter()
    records = explain_documents(
        classifier,
        texts,
        doc_ids=ids,
        labels=labels,
        batch_size=batch_size,
        all_classes=all_classes,
        device=device,
    )
    explained = time.perf_counter()
    if faithfulness:
        for text, record in zip(texts, records, strict=True):
            figures = document_faithfulness(classifier, text, record, "mask", device=device)
            if figures:
                record["faithfulness"] = {"removal": "mask", "methods": figures}
    measured = time.perf_counter()
    write_jsonl(records, out_dir / "explanations.jsonl")
    index = write_report(
        records,
        out_dir,
        classifier.label_names,
        title=title,
        subtitle=documents.description,
        run_dir=run_dir,
    )
    finished = time.perf_counter()
    summary = {
        "index": str(index),
        "documents": len(records),
        "explain_s": round(explained - started, 2),
        "faithfulness_s": round(measured - explained, 2),
        "pages_s": round(finished - measured, 2),
        "total_s": round(finished - started, 2),
    }
    log.info(
        "report: %d documents explained in %.1f s, faithfulness %.1f s, pages %.1f s → %s",
        len(records),
        summary["explain_s"],
        summary["faithfulness_s"],
        summary["pages_s"],
        index,
    )
    return summary


def run_dir_of(ckpt: str | Path) -> Path | None:
    """The training run's folder for a checkpoint saved as ``<run>/checkpoints/<name>.ckpt``."""
    path = Path(ckpt).resolve()
    return path.parent.parent if path.parent.name == "checkpoints" else None


def report_command(
    ckpt: str,
    data: str,
    out: str,
    split: str = "test",
    text_column: str = "text",
    label_column: str | None = "label",
    limit: int | None = None,
    batch_size: int = 16,
    all_classes: bool = False,
    device: str = "cpu",
    faithfulness: bool = True,
) -> dict[str, Any]:
    """What ``docclass report`` runs: checkpoint + documents → report folder."""
    classifier = load_classifier(ckpt)
    documents = load_documents(data, ckpt, split, text_column, label_column)
    return make_report(
        classifier,
        documents,
        out,
        run_dir=run_dir_of(ckpt),
        title=f"docclass report · {Path(ckpt).name}",
        limit=limit,
        batch_size=batch_size,
        all_classes=all_classes,
        device=device,
        faithfulness=faithfulness,
    )


def time_report(
    ckpt: str, data: str, split: str = "test", repeats: int = 3, device: str = "cpu"
) -> dict[str, Any]:
    """Median seconds to explain ``data`` and write its report, over ``repeats`` runs.

    Loading the checkpoint and the documents is timed once, apart: it is the same for any
    report and does not grow with the number of methods.
    """
    import statistics
    import tempfile

    import torch

    from docclass.callbacks import machine_summary

    started = time.perf_counter()
    classifier = load_classifier(ckpt)
    documents = load_documents(data, ckpt, split)
    load_s = time.perf_counter() - started
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            runs.append(make_report(classifier, documents, out, device=device))
    words = sum(len(text.split()) for text in documents.texts)
    return {
        "checkpoint": str(ckpt),
        "data": documents.description,
        "documents": len(documents.texts),
        "whitespace_words": words,
        "methods": "attention (mean + every head), contribution, rollout, gradient x input; "
        "ERASER comprehensiveness and sufficiency of each, masked removal",
        "repeats": repeats,
        "load_s": round(load_s, 2),
        **{
            f"median_{key}": round(statistics.median(run[key] for run in runs), 2)
            for key in ("explain_s", "faithfulness_s", "pages_s", "total_s")
        },
        "all_total_s": [run["total_s"] for run in runs],
        "torch_threads": torch.get_num_threads(),
        "machine": machine_summary(),
    }
