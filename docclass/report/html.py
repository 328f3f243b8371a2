"""Standalone HTML reports from explanation records: ``index.html`` plus one page per document.

Pages open from ``file://`` with nothing fetched: CSS and JavaScript are inline, figures are
PNG data URIs, and a Content-Security-Policy forbids every network load. Every piece of
document text goes through Jinja's autoescaping (attributes included) or, in scripts, through
``textContent``; the per-document data travels as JSON inside a ``<script type=
"application/json">`` block, where ``tojson`` escapes ``<``, ``>`` and ``&``.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, PackageLoader, StrictUndefined

from docclass.interpret.default_method import DefaultMethod, default_method
from docclass.interpret.records import (
    METHODS,
    RECORD_METHODS,
    REMOVAL_LABELS,
    SIGNED_METHODS,
    method_label,
    read_jsonl,
)
from docclass.metrics import classification_scores
from docclass.report.figures import (
    confusion_matrix_figure,
    entropy_histogram_figure,
    png_data_uri,
    removal_curves_figure,
    training_curves_figure,
)
from docclass.report.lexicon import class_lexicon, confusion_cells, contrastive_lexicon
from docclass.report.summaries import (
    LOW_CONFIDENCE,
    confusion,
    document_order,
    head_entropies,
    pool_heads_of,
    sentences,
)

# Documents with more words than this get the minimap and the sentence view.
LONG_DOCUMENT_WORDS = 150
MINIMAP_BINS = 80
TOP_SENTENCES = 8

REPORT_META = "report.json"
FAITHFULNESS_FILE = "faithfulness.json"


def _environment() -> Environment:
    return Environment(
        loader=PackageLoader("docclass.report", "templates"),
        autoescape=True,  # every template, whatever its name: no page may carry raw text
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _docclass_version() -> str:
    try:
        return version("docclass")
    except PackageNotFoundError:
        return "(source tree)"


def document_filename(position: int) -> str:
    """A page name that depends only on the record's position (ids may be arbitrary text)."""
    return f"doc-{position:05d}.html"


def _confidence(record: dict) -> float | None:
    predicted = record.get("predicted")
    return record["probs"][predicted] if predicted is not None else None


def _flags(record: dict) -> list[str]:
    flags = []
    confidence = _confidence(record)
    if confidence is None:
        flags.append("failed")
    else:
        if record.get("label") is not None and record["label"] != record["predicted"]:
            flags.append("error")
        if confidence < LOW_CONFIDENCE:
            flags.append("uncertain")
    if record.get("truncated"):
        flags.append("truncated")
    if record.get("disagree"):
        flags.append("disagree")
    return flags


def _method_options(record: dict, pool_heads: int) -> list[dict[str, str]]:
    scores = record.get("scores", {})
    options = [{"key": key, "label": method_label(key)} for key in RECORD_METHODS if key in scores]
    for name in record.get("contributions", {}):
        options.append({"key": f"contribution:{name}", "label": f"contribution to {name}"})
    if len(record.get("contributions", {})) > 1:
        options.append({"key": "contrast", "label": "why one class rather than another"})
    return options


def _bins(n_words: int) -> list[list[int]]:
    size = max(1, math.ceil(n_words / MINIMAP_BINS))
    return [[start, min(start + size, n_words)] for start in range(0, n_words, size)]


def _pieces(
    record: dict, scores: Sequence[float] | None, signed: bool, label: str
) -> list[dict[str, Any]]:
    """The text cut into gaps and words, each word with its initial shade and tooltip."""
    text, read = record["text"], record["words_read"]
    top = max((abs(s) for s in (scores or [])[:read]), default=0.0)
    order = sorted(range(read), key=lambda i: -scores[i]) if scores else []
    rank = {word: position + 1 for position, word in enumerate(order)}
    pieces: list[dict[str, Any]] = []
    cursor = 0
    for i, (start, end) in enumerate(record["spans"]):
        if start > cursor:
            pieces.append({"kind": "gap", "text": text[cursor:start]})
        if i == read and record.get("truncated"):
            pieces.append({"kind": "cut"})
        piece: dict[str, Any] = {"kind": "word", "i": i, "text": text[start:end]}
        if i >= read or not scores:
            piece.update(unread=True, neg=False, s=0, title="not read: past the token limit")
        else:
            value = scores[i]
            piece.update(
                unread=False,
                neg=signed and value < 0,
                s=f"{abs(value) / top:.3f}" if top > 0 else "0",
                title=f"{label} {value:.4f} · rank {rank[i]} of {read}",
            )
        pieces.append(piece)
        cursor = max(cursor, end)
    if cursor < len(text):
        pieces.append({"kind": "gap", "text": text[cursor:]})
    return pieces


def _document_page(
    environment: Environment,
    record: dict,
    pool_heads: int,
    index_href: str,
    common: dict[str, Any],
    shown_first: DefaultMethod,
) -> str:
    scores = dict(record.get("scores", {}))
    for name, values in record.get("contributions", {}).items():
        scores[f"contribution:{name}"] = values
    # Four significant digits are what a tooltip shows; the JSONL keeps the full record.
    scores = {name: [float(f"{v:.4g}") for v in values] for name, values in scores.items()}
    long_view = record["words_read"] > LONG_DOCUMENT_WORDS or len(record["words"]) > (
        LONG_DOCUMENT_WORDS
    )
    data = _page_data(record, scores, long_view)
    depths = record.get("rollout_depths") or []
    probs = sorted(record.get("probs", {}).items(), key=lambda item: -item[1])
    first = shown_first.method if shown_first.method in scores else "attention"
    signed = first in SIGNED_METHODS
    return environment.get_template("document.html.j2").render(
        record={**record, "error": record.get("error"), "tokens_read": _tokens_read(record)},
        confidence=_confidence(record),
        probs=probs,
        methods=_method_options(record, pool_heads),
        pool_heads=pool_heads,
        rollout_depths=len(depths),
        long_view=long_view,
        bin_words=data["bins"][0][1] if data["bins"] else 0,
        contrast_classes=list(record.get("contributions", {})),
        runner_up=probs[1][0] if len(probs) > 1 else None,
        method_labels={key: info.label for key, info in METHODS.items()},
        pieces=_pieces(record, scores.get(first), signed=signed, label=method_label(first)),
        initial_signed=signed,
        shown_first=shown_first,
        first_method=first,
        data=data,
        index_href=index_href,
        **common,
    )


def _page_data(record: dict, scores: dict[str, list[float]], long_view: bool) -> dict[str, Any]:
    """What a document page's script reads: its scores (``scores`` gains the rollout depths),
    logits, sentences of a long document, faithfulness and layer maps."""
    data: dict[str, Any] = {
        "logits": record.get("logits", {}),
        "bias": record.get("contribution_bias", {}),
        "n_words": len(record["words"]),
        "words_read": record["words_read"],
        "scores": scores,
        "signed": list(SIGNED_METHODS),
        "help": {key: METHODS[key].help for key in RECORD_METHODS},
        "top_sentences": TOP_SENTENCES,
        "bins": _bins(len(record["words"])) if long_view else [],
        "sentences": [],
    }
    if long_view:
        spans, text = record["spans"], record["text"]
        for first, end in sentences(record):
            sentence = text[spans[first][0] : spans[end - 1][1]]
            data["sentences"].append([first, end, " ".join(sentence.split())[:300]])
    if record.get("faithfulness"):
        data["faithfulness"] = _page_faithfulness(record["faithfulness"]["methods"])
    depths = record.get("rollout_depths") or []
    for depth, values in enumerate(depths, start=1):
        scores[f"rollout_depth{depth}"] = values
    if record.get("layer_maps"):
        # Drawn by the page on <canvas>: a matplotlib figure per document, with a tick label per
        # word, took about a second each, too slow for corpora of short texts.
        data["layer_maps"] = record["layer_maps"]
        data["map_words"] = record["words"][: record["words_read"]]
    return data


def _page_faithfulness(figures: dict[str, Any]) -> dict[str, Any]:
    """A document's comprehensiveness per method beside random's, for the page's badge."""
    return {
        "random": figures["random"]["comprehensiveness"],
        "methods": {
            name: {"value": row["comprehensiveness"], "beats": row.get("beats_random", False)}
            for name, row in figures.items()
            if name != "random"
        },
    }


def _tokens_read(record: dict) -> int:
    return record.get("tokens_read", record.get("n_tokens", 0))


def _run_metrics(run_dir: Path | None) -> dict[str, Any] | None:
    path = run_dir / "metrics.json" if run_dir else None
    if not path or not path.is_file():
        return None
    metrics = json.loads(path.read_text())
    test, val = metrics.get("test") or {}, metrics.get("val") or {}

    def fmt(value: Any, pattern: str = "{:.3f}") -> str:
        return pattern.format(value) if isinstance(value, int | float) else "—"

    return {
        "source": path.name,
        "test_accuracy": fmt(test.get("accuracy")),
        "test_macro_f1": fmt(test.get("macro_f1")),
        "val_accuracy": fmt(val.get("acc")),
        "train_time": fmt(metrics.get("train_time_s"), "{:.0f} s"),
        "epochs": metrics.get("epochs_trained", "—"),
    }


def _metric_log(run_dir: Path | None) -> Path | None:
    if not run_dir:
        return None
    logs = sorted(
        (run_dir / "logs").glob("version_*/metrics.csv"),
        key=lambda p: int(p.parent.name.split("_")[-1]),
    )
    return logs[-1] if logs else None


def _summary(
    records: Sequence[dict], label_names: list[str], population: dict[str, Any] | None = None
) -> dict[str, Any]:
    matrix = confusion(records, label_names)
    summary: dict[str, Any] = {
        "documents": len(records),
        "accuracy": None,
        "macro_f1": None,
        "errors": 0,
        "uncertain": sum("uncertain" in _flags(r) for r in records),
        "truncated": sum(bool(r.get("truncated")) for r in records),
        "failed": sum(r.get("predicted") is None for r in records),
    }
    if matrix is not None:
        # The same definition as the run's metrics.json, so the two pages agree.
        scores = classification_scores(matrix)
        summary["accuracy"], summary["macro_f1"] = scores["accuracy"], scores["macro_f1"]
        summary["errors"] = int(matrix.sum() - np.trace(matrix))
    if population:
        # A sample chosen errors first would make its own accuracy look far worse than it is.
        summary.update({key: population.get(key) for key in ("documents", "accuracy", "macro_f1")})
        summary["errors"] = population.get("errors", 0)
    return summary


def write_report(
    records: Sequence[dict],
    out_dir: str | Path,
    label_names: list[str],
    title: str = "docclass report",
    subtitle: str = "",
    run_dir: str | Path | None = None,
    documents_dir: str = "docs",
    faithfulness: dict[str, Any] | None = None,
    population: dict[str, Any] | None = None,
    checks: dict[str, Any] | None = None,
    weights: str | None = None,
) -> Path:
    """Write ``index.html`` and ``<documents_dir>/doc-NNNNN.html`` for every record.

    Args:
        records: explanation records (:func:`docclass.interpret.explain.explain_documents`).
        out_dir: folder to write into (created).
        label_names: the model's classes, in its order.
        title: the index page's heading.
        subtitle: one line under it (what data, which checkpoint).
        run_dir: the training run's folder; its ``metrics.json`` and CSV log, when present,
            add the run's figures and training curves.
        documents_dir: sub-folder for the per-document pages.
        faithfulness: the records' faithfulness over documents, as
            :func:`docclass.evaluate.erasure.aggregate_faithfulness` gives it under ``methods``,
            with ``fractions`` and ``documents``; None when not measured.
        population: when the records are a sample of a larger set: that set's ``documents``,
            ``accuracy``, ``macro_f1``, ``errors`` and how the sample was drawn (``selection``);
            the headline shows these instead of the sample's own.
        checks: summaries over the records of ``counterfactual`` (how often one exists),
            ``agreement`` (between methods, per pair) and ``plausibility`` (against human
            rationales), each None when not measured.
        weights: the fingerprint of the weights explained, kept in ``report.json`` so its
            table is only ever read for those weights.

    Returns:
        The path of ``index.html``.
    """
    out_dir = Path(out_dir)
    (out_dir / documents_dir).mkdir(parents=True, exist_ok=True)
    run_dir = Path(run_dir) if run_dir else None
    environment = _environment()
    common = {
        "version": _docclass_version(),
        "written": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }
    pool_heads = pool_heads_of(records)
    measured = faithfulness or {}
    # A page outside the measured sample says why it has no faithfulness badge.
    common["faithfulness_sample"] = measured.get("sample")
    shown_first = default_method(measured.get("methods"), measured.get("documents", 0))
    hrefs = [f"{documents_dir}/{document_filename(p)}" for p in range(len(records))]
    for position, record in enumerate(records):
        page = _document_page(environment, record, pool_heads, "../index.html", common, shown_first)
        (out_dir / documents_dir / document_filename(position)).write_text(page, encoding="utf-8")
    index = environment.get_template("index.html.j2").render(
        title=title,
        subtitle=subtitle,
        summary=_summary(records, label_names, population),
        population=population,
        low_confidence=LOW_CONFIDENCE,
        run_metrics=_run_metrics(run_dir),
        figures=_index_figures(records, label_names, run_dir, faithfulness, pool_heads, population),
        method_help=[
            {"name": METHODS[key].label, "text": METHODS[key].help} for key in RECORD_METHODS
        ],
        lexicon=class_lexicon(records, label_names, hrefs, shown_first.method),
        contrasts=contrastive_lexicon(records, label_names, hrefs),
        confusion_cells=confusion_cells(records, label_names, hrefs),
        label_names=label_names,
        rows=_index_rows(records, documents_dir),
        trust=_trust_section(faithfulness, out_dir, weights),
        shown_first=shown_first,
        checks=_checks_section(checks or {}),
        method_labels={key: METHODS[key].label for key in METHODS},
        **common,
    )
    (out_dir / "index.html").write_text(index, encoding="utf-8")
    # What rewrite_report needs to render the same report again from explanations.jsonl.
    meta = dict(title=title, subtitle=subtitle, label_names=label_names, run_dir=run_dir)
    meta.update(run_dir=str(run_dir) if run_dir else None, documents_dir=documents_dir)
    meta.update(faithfulness=faithfulness, population=population, checks=checks, weights=weights)
    (out_dir / REPORT_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out_dir / "index.html"


def _index_figures(
    records: Sequence[dict],
    label_names: list[str],
    run_dir: Path | None,
    faithfulness: dict[str, Any] | None,
    pool_heads: int,
    population: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The index's figures as PNG data URIs: confusion matrix, training curves, removal curves
    and the pool heads' attention entropy, each when its data exists."""
    figures: dict[str, str] = {}
    matrix = confusion(records, label_names)
    if matrix is not None:
        shown = "shown sample" if population else "report"
        figures["confusion"] = png_data_uri(confusion_matrix_figure(matrix, label_names, shown))
    metric_log = _metric_log(run_dir)
    if metric_log is not None:
        figures["curves"] = png_data_uri(training_curves_figure(metric_log))
    if faithfulness and faithfulness.get("methods"):
        figures["faithfulness"] = png_data_uri(
            removal_curves_figure({"mask": faithfulness["methods"]}, faithfulness["fractions"])
        )
    entropies = head_entropies(records, pool_heads)
    if any(entropies.values()):
        figures["entropy"] = png_data_uri(entropy_histogram_figure(entropies))
    return figures


def _index_rows(records: Sequence[dict], documents_dir: str) -> list[dict[str, Any]]:
    """One row per document for the index table, what needs a look first."""
    rows = []
    for position in document_order(records):
        record = records[position]
        confidence = _confidence(record)
        rows.append(
            {
                "id": record["id"],
                "href": f"{documents_dir}/{document_filename(position)}",
                "label": record.get("label"),
                "predicted": record.get("predicted"),
                "confidence": f"{confidence:.3f}" if confidence is not None else "—",
                "words": len(record["words"]),
                "flags": _flags(record),
                "error": record.get("error", ""),
                "search": " ".join(
                    str(part).lower()
                    for part in (record["id"], record.get("label"), record.get("predicted"))
                    if part is not None
                ),
            }
        )
    return rows


def rewrite_report(out_dir: str | Path) -> Path:
    """Render a written report again from its ``explanations.jsonl`` (after
    ``docclass faithfulness`` has added its figures to the folder, say)."""
    out_dir = Path(out_dir)
    meta = json.loads((out_dir / REPORT_META).read_text(encoding="utf-8"))
    return write_report(read_jsonl(out_dir / "explanations.jsonl"), out_dir, **meta)


def _checks_section(checks: dict[str, Any]) -> dict[str, Any]:
    """Counterfactual, agreement and plausibility summaries as strings for the index."""
    section: dict[str, Any] = {}
    counterfactual = checks.get("counterfactual")
    if counterfactual and counterfactual["documents"]:
        section["counterfactual"] = {
            "method": method_label(counterfactual["method"]),
            "percent": f"{100 * counterfactual['share']:.0f} %",
            "flipped": counterfactual["flipped"],
            "documents": counterfactual["documents"],
            "fraction": f"{100 * counterfactual['max_fraction']:.0f} %",
            "median": counterfactual["median_words"],
        }
    agreement = checks.get("agreement")
    if agreement and agreement["documents"]:
        section["agreement"] = {
            "documents": agreement["documents"],
            "rows": [
                (
                    " · ".join(method_label(name) for name in pair.split("|")),
                    f"{values['tau']['mean']:.2f} ± {values['tau']['std']:.2f}",
                    f"{values['top10']['mean']:.2f}",
                )
                for pair, values in agreement["pairs"].items()
            ],
        }
    plausible = checks.get("plausibility")
    if plausible and plausible["methods"]:
        section["plausibility"] = {
            "documents": plausible["documents"],
            "rows": [
                (method_label(name), f"{row['token_f1']:.3f}", f"{row['iou_f1']:.3f}",
                 f"{row['auprc']:.3f}")
                for name, row in sorted(
                    plausible["methods"].items(), key=lambda kv: -kv[1]["auprc"]
                )
            ],
        }  # fmt: skip
    return section


def _ratio(value: float, floor: float) -> str:
    return f"{value / floor:.1f}×" if floor > 1e-3 else "—"


def _trust_section(
    faithfulness: dict[str, Any] | None, out_dir: Path, weights: str | None = None
) -> dict[str, Any] | None:
    """The index's faithfulness figures: the records' own (mask removal, every document) and,
    when ``docclass faithfulness`` wrote into this folder for the same weights, its checks."""
    table = (faithfulness or {}).get("methods")
    path = out_dir / FAITHFULNESS_FILE
    extra = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if extra and weights and extra.get("weights") != weights:
        extra = None  # measured on another checkpoint: not this report's model
    if not table and not extra:
        return None
    section: dict[str, Any] = {"rows": [], "documents": 0, "extra": None}
    if table:
        floor = table["random"]["comprehensiveness"]
        section["documents"] = faithfulness["documents"]
        section["sample"] = faithfulness.get("sample")
        section["random"] = table["random"]
        for name, row in sorted(table.items(), key=lambda kv: -kv[1]["comprehensiveness"]):
            section["rows"].append(
                {
                    "name": method_label(name),
                    "comprehensiveness": f"{row['comprehensiveness']:.3f}",
                    "ratio": "" if name == "random" else _ratio(row["comprehensiveness"], floor),
                    "sufficiency": f"{row['sufficiency']:.3f}",
                    "beats": "—" if name == "random" else f"{100 * row['beats_random']:.0f} %",
                }
            )
    if extra:
        section["extra"] = _extra_rows(extra)
    return section


def _extra_rows(figures: dict[str, Any]) -> dict[str, Any]:
    """``faithfulness.json``'s sample checks as rows of plain strings."""
    extra: dict[str, Any] = {"documents": figures.get("documents"), "removal": []}
    for removal, result in figures.get("removal", {}).items():
        table = result["aopc"]
        floor = table["random"]["comprehensiveness"]
        rows = []
        for name, row in sorted(table.items(), key=lambda kv: -kv[1]["comprehensiveness"]):
            ratio = "" if name == "random" else _ratio(row["comprehensiveness"], floor)
            rows.append(
                (
                    method_label(name),
                    f"{row['comprehensiveness']:.3f}",
                    ratio,
                    f"{row['sufficiency']:.3f}",
                )
            )
        extra["removal"].append({"removal": REMOVAL_LABELS[removal], "rows": rows})
    sample = figures.get("sample")
    if sample:
        rank = sample.get("kendall_tau_vs_leave_one_out", {})
        stages = sample.get("randomised_weights", {})
        extra["sample"] = {
            "documents": sample["documents"],
            "ig_steps": sample.get("integrated_gradients_steps"),
            "ig_delta": sample.get("integrated_gradients_relative_delta", {}).get("max"),
            "stages": list(stages),
            "rows": [
                {
                    "name": method_label(name),
                    "aopc": sample.get("aopc_mask", {}).get(name, {}).get("comprehensiveness"),
                    "tau": f"{rank[name]['mean']:.2f} ± {rank[name]['std']:.2f}",
                    "rho": [
                        f"{stages[stage][name]['mean']:.2f}" if name in stages[stage] else "—"
                        for stage in stages
                    ],
                }
                for name in rank
            ],
        }
    extra["permuted_pool"] = figures.get("permuted_pool")
    return extra
