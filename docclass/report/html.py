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
import string
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, PackageLoader, StrictUndefined
from jinja2.utils import htmlsafe_json_dumps

from docclass.interpret.default_method import DefaultMethod, default_method
from docclass.interpret.records import (
    HEAD_PREFIX,
    METHODS,
    RECORD_METHODS,
    REMOVAL_LABELS,
    SIGNED_METHODS,
    contribution_totals,
    method_label,
    read_jsonl,
)
from docclass.metrics import classification_scores
from docclass.report.classes import MATRIX_CLASSES, class_rows, matrix_view, pair_rows
from docclass.report.figures import (
    entropy_histogram_figure,
    png_data_uri,
    reliability_figure,
    removal_curves_figure,
    risk_coverage_figure,
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
    times_random,
)

# Page scores are integers up to this size relative to the largest of their method, each
# written as two of these 64 digits (packed()); document.js reads them back.
SCORE_STEPS = 2047
PACK_DIGITS = string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/"
# Past this many classes a page shows the TOP_BARS most probable and one bar for the rest.
MANY_BARS = 8
TOP_BARS = 5
# Style sheet and scripts, written once into the report folder and shared by every page.
ASSETS_DIR = "assets"
ASSETS = ("report.css", "document.js", "index.js")
METHODS_SCRIPT = "methods.js"

# Median document length (words) at or below which a top-10 overlap says nothing.
SHORT_FOR_TOP_10 = 20
# Documents with more words than this get the minimap and the sentence view.
LONG_DOCUMENT_WORDS = 150
MINIMAP_BINS = 80
TOP_SENTENCES = 8

REPORT_META = "report.json"
# The records the pages were made from, one JSON object per line, compressed.
EXPLANATIONS = "explanations.jsonl.gz"
FAITHFULNESS_FILE = "faithfulness.json"


def template_environment() -> Environment:
    environment = Environment(
        loader=PackageLoader("docclass.report", "templates"),
        autoescape=True,  # every template, whatever its name: no page may carry raw text
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # tojson without the space after every comma: one byte per number of a page's scores.
    environment.policies["json.dumps_kwargs"] = {"sort_keys": True, "separators": (",", ":")}
    return environment


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
    # The page's script adds "contribution to <class>" for each class of data.classes: class
    # names of 40 characters, written into three menus, were a fifth of a short request's page.
    options = [{"key": key, "label": method_label(key)} for key in RECORD_METHODS if key in scores]
    if len(record.get("contributions", {})) > 1:
        options.append({"key": "contrast", "label": "why one class rather than another"})
    return options


def _bin_words(n_words: int) -> int:
    return max(1, math.ceil(n_words / MINIMAP_BINS))


def _pieces(record: dict) -> list[dict[str, Any]]:
    """The text cut into gaps and the words read, then the cut and the unread rest as one
    piece. The page's script shades the words and writes their tooltips: a tooltip per word in
    the file doubled a long document's page, and a 5,000-word article read to its 980th word
    made a 450 KB page of words no score touches."""
    text, read = record["text"], record["words_read"]
    spans = record["spans"]
    pieces: list[dict[str, Any]] = []
    cursor = 0
    for i, (start, end) in enumerate(spans[:read]):
        if start > cursor:
            pieces.append({"kind": "gap", "text": text[cursor:start]})
        pieces.append({"kind": "word", "i": i, "text": text[start:end]})
        cursor = max(cursor, end)
    if read < len(spans):
        start = max(cursor, spans[read][0])
        if start > cursor:
            pieces.append({"kind": "gap", "text": text[cursor:start]})
        if record.get("truncated"):
            pieces.append({"kind": "cut"})
        pieces.append({"kind": "unread", "text": text[start:]})
    elif cursor < len(text):
        pieces.append({"kind": "gap", "text": text[cursor:]})
    return pieces


def packed(values: Sequence[float]) -> tuple[str, float]:
    """Scores as a string of two characters per word and the scale that turns them back.

    Each value becomes an integer ``q`` in ``[-SCORE_STEPS, SCORE_STEPS]`` relative to the
    largest magnitude (``value ≈ q · scale``), written as two base-64 digits of ``q +
    SCORE_STEPS + 1``: 1/2,047 of the largest (the page prints only the decimals that step
    supports), in two characters where a JSON float took seven to ten."""
    top = max((abs(v) for v in values), default=0.0)
    scale = top / SCORE_STEPS if top > 0 else 0.0
    codes = [round(v / scale) + SCORE_STEPS + 1 if scale else SCORE_STEPS + 1 for v in values]
    return "".join(PACK_DIGITS[code >> 6] + PACK_DIGITS[code & 63] for code in codes), scale


def _bars(probs: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The probability bars: every class, or past :data:`MANY_BARS` the top ones and one bar
    for the rest (a reader of a 150-class page wants the contenders, not 150 bars)."""
    if len(probs) <= MANY_BARS:
        return probs
    rest = probs[TOP_BARS:]
    return [*probs[:TOP_BARS], (f"{len(rest)} other classes", sum(p for _, p in rest))]


def _document_page(
    environment: Environment,
    record: dict,
    pool_heads: int,
    index_href: str,
    common: dict[str, Any],
    shown_first: DefaultMethod,
    given_labels: bool = False,
) -> str:
    scores = dict(record.get("scores", {}))
    for name, values in record.get("contributions", {}).items():
        # The predicted class's contributions are scores.contribution: the page aliases them.
        if name != record.get("predicted"):
            scores[f"contribution:{name}"] = values
    long_view = record["words_read"] > LONG_DOCUMENT_WORDS or len(record["words"]) > (
        LONG_DOCUMENT_WORDS
    )
    data = _page_data(record, scores, long_view)
    depths = record.get("rollout_depths") or []
    probs = sorted(record.get("probs", {}).items(), key=lambda item: -item[1])
    first = shown_first.method if shown_first.method in scores else "attention"
    return environment.get_template("document.html.j2").render(
        record={**record, "error": record.get("error"), "tokens_read": _tokens_read(record)},
        confidence=_confidence(record),
        probs=_bars(probs),
        methods=_method_options(record, pool_heads),
        pool_heads=pool_heads,
        rollout_depths=len(depths),
        long_view=long_view,
        bin_words=data["bin_words"],
        contrast_classes=list(record.get("contributions", {})),
        method_labels={key: info.label for key, info in METHODS.items()},
        pieces=_pieces(record),
        initial_signed=first in SIGNED_METHODS,
        shown_first=shown_first,
        first_method=first,
        given_labels=given_labels,
        data=data,
        index_href=index_href,
        assets="../" + ASSETS_DIR + "/",
        **common,
    )


def _page_data(record: dict, scores: dict[str, list[float]], long_view: bool) -> dict[str, Any]:
    """What a document page's script reads: its scores :func:`packed` with a scale each
    (``scores`` gains the rollout depths), logits, sentences of a long document, faithfulness
    and layer maps."""
    read = record["words_read"]
    # The page scores only what the model read (the rest is zero, and shown as plain text).
    scores = {name: values[:read] for name, values in scores.items()}
    depths = record.get("rollout_depths") or []
    for depth, values in enumerate(depths, start=1):
        scores[f"rollout_depth{depth}"] = values[:read]
    if any(name.startswith(HEAD_PREFIX) for name in scores):
        # Pool attention is the mean of its heads' (the page's script takes it again).
        scores.pop("attention", None)
    packs = {name: packed(values) for name, values in scores.items()}
    data: dict[str, Any] = {
        "predicted": record.get("predicted"),
        # The classes a reader can see the contributions to and contrast.
        "classes": list(record.get("contributions", {})),
        "runner_up": _runner_up(record),
        "logits": record.get("logits", {}),
        "bias": record.get("contribution_bias", {}),
        # Each class's words' total, for the page's contrast sum: summed before a record file
        # rounded the contributions when the record comes from one.
        "word_totals": contribution_totals(record),
        "n_words": len(record["words"]),
        "words_read": record["words_read"],
        "scores": {name: text for name, (text, _) in packs.items()},
        "scale": {name: scale for name, (_, scale) in packs.items()},
        "top_sentences": TOP_SENTENCES,
        # The minimap's words per cell; the page cuts the document into cells of this size.
        "bin_words": _bin_words(len(record["words"])) if long_view else 0,
        # [first word, end word) of each sentence read: the page takes their text from its own.
        "sentences": [[first, min(end, read)] for first, end in sentences(record) if first < read]
        if long_view
        else [],
    }
    if record.get("faithfulness"):
        data["faithfulness"] = _page_faithfulness(record["faithfulness"]["methods"])
    if record.get("layer_maps"):
        # Drawn by the page on <canvas>: a matplotlib figure per document, with a tick label per
        # word, took about a second each, too slow for corpora of short texts.
        data["layer_maps"] = [
            [packed(sum(head, [])) for head in layer] for layer in record["layer_maps"]
        ]
        data["map_words"] = record["words"][: record["words_read"]]
    return data


def _runner_up(record: dict) -> str | None:
    """The class the page contrasts with first: the most probable one after the prediction
    among those the record keeps contributions for (probabilities rounded in a file may tie)."""
    kept = [name for name in record.get("contributions", {}) if name != record.get("predicted")]
    return max(kept, key=lambda name: record["probs"].get(name, 0.0), default=None)


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


def _run_metrics(run_dir: Path | None, weights: str | None) -> dict[str, Any] | None:
    """The run's ``metrics.json``; its scores only where they were measured on ``weights``
    (a report of ``best.ckpt`` showed the tested ``last.ckpt``'s accuracy as its own)."""
    path = run_dir / "metrics.json" if run_dir else None
    if not path or not path.is_file():
        return None
    metrics = json.loads(path.read_text())
    test, val = metrics.get("test") or {}, metrics.get("val") or {}
    source = path.name
    if weights is not None and test.get("weights") != weights:
        source = path.name + (
            " (its scores are of other weights of this run)"
            if test.get("weights")
            else " (written before docclass named the weights it tested: its scores not shown)"
        )
        test, val = {}, {}

    def fmt(value: Any, pattern: str = "{:.3f}") -> str:
        return pattern.format(value) if isinstance(value, int | float) else "—"

    return {
        "source": source,
        "test_accuracy": fmt(test.get("accuracy")),
        "test_macro_f1": fmt(test.get("macro_f1")),
        "val_accuracy": fmt(val.get("acc")),
        "train_time": fmt(metrics.get("train_time_s"), "{:.0f} s"),
        "epochs": metrics.get("epochs_trained", "—"),
    }


def _metric_log(run_dir: Path | None) -> Path | None:
    """The CSV log of the fit the run's ``metrics.json`` describes, found in ``run_dir`` (which
    may have moved since). Not the newest log: ``docclass test`` in a run folder starts a log
    version of its own, test figures only, and the page's training curves came out empty."""
    path = run_dir / "metrics.json" if run_dir else None
    if not path or not path.is_file():
        return None
    named = json.loads(path.read_text()).get("metric_log")
    if not named:
        return None
    log = run_dir / "logs" / Path(named).parent.name / "metrics.csv"
    return log if log.is_file() else None


def _summary(
    records: Sequence[dict], label_names: list[str], population: dict[str, Any] | None = None
) -> dict[str, Any]:
    matrix = confusion(records, label_names)
    summary: dict[str, Any] = {
        "documents": len(records),
        "scored": 0,
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
        summary["scored"] = int(matrix.sum())
    if population:
        # A sample chosen errors first would make its own accuracy look far worse than it is.
        summary.update({key: population.get(key) for key in ("documents", "accuracy", "macro_f1")})
        # A population written before it counted them is taken as all labelled, as it was read.
        summary["scored"] = population.get("scored", population.get("documents"))
        summary["errors"] = population.get("errors", 0)
        # Counted over the split by a capped report; one written before it counted them keeps
        # the sample's.
        summary.update(
            {
                key: population[key]
                for key in ("uncertain", "truncated", "failed")
                if key in population
            }
        )
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
    calibration: dict[str, Any] | None = None,
    scores: str | None = None,
    model_default: dict[str, str] | None = None,
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
        calibration: the temperature these weights' probabilities are divided by and its
            scores before and after (``calibration.json``); None when uncalibrated.
        scores: what the records' relevance scores are (the rules and the explained quantity,
            :func:`docclass.interpret.methods.score_rules`), kept in ``report.json``.
        model_default: the method the model's other readers (predict, classify, serve)
            default to and why (``{method, reason}``), which a report measuring no
            faithfulness of its own shows first, so the pages and the API agree.

    Returns:
        The path of ``index.html``.
    """
    out_dir = Path(out_dir)
    run_dir = Path(run_dir) if run_dir else None
    environment = template_environment()
    common = page_common()
    measured = faithfulness or {}
    # A page outside the measured sample says why it has no faithfulness badge.
    common["faithfulness_sample"] = measured.get("sample")
    shown_first = first_method(measured, model_default)
    hrefs = write_document_pages(records, out_dir, documents_dir, shown_first, common)
    context = dict(title=title, subtitle=subtitle, population=population, run_dir=run_dir)
    context.update(faithfulness=faithfulness, checks=checks or {}, weights=weights, common=common)
    context.update(calibration=calibration, scores=scores, model_default=model_default)
    index = _index_page(environment, records, label_names, hrefs, documents_dir, out_dir, context)
    (out_dir / "index.html").write_text(index, encoding="utf-8")
    # What rewrite_report needs to render the same report again from its records.
    meta = dict(title=title, subtitle=subtitle, label_names=label_names, run_dir=run_dir)
    meta.update(run_dir=str(run_dir) if run_dir else None, documents_dir=documents_dir)
    meta.update(faithfulness=faithfulness, population=population, checks=checks, weights=weights)
    meta.update(calibration=calibration, scores=scores, model_default=model_default)
    (out_dir / REPORT_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out_dir / "index.html"


def page_common() -> dict[str, Any]:
    """What every page's footer names: the docclass version and when it was written."""
    return {
        "version": _docclass_version(),
        "written": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "faithfulness_sample": None,
    }


def write_document_pages(
    records: Sequence[dict],
    out_dir: Path,
    documents_dir: str,
    shown_first: DefaultMethod,
    common: dict[str, Any],
    given_labels: bool = False,
) -> list[str]:
    """The shared assets and ``<documents_dir>/doc-NNNNN.html`` for every record, each page
    linking back to ``index.html``; returns each page's path relative to ``out_dir``. With
    ``given_labels`` a record's label is the one the data gave, which may be wrong (the label
    audit's pages): it is not called the true label, and a disagreement is not a mistake."""
    environment = template_environment()
    (out_dir / documents_dir).mkdir(parents=True, exist_ok=True)
    _write_assets(environment, out_dir / ASSETS_DIR)
    pool_heads = pool_heads_of(records)
    for position, record in enumerate(records):
        page = _document_page(
            environment, record, pool_heads, "../index.html", common, shown_first, given_labels
        )
        (out_dir / documents_dir / document_filename(position)).write_text(page, encoding="utf-8")
    # A page of an earlier, larger report here (an audit that flags fewer documents now, a
    # report made again with fewer) is linked from nowhere but would still be served and read.
    for page in (out_dir / documents_dir).glob("doc-*.html"):
        number = page.name[len("doc-") : -len(".html")]
        if number.isdigit() and int(number) >= len(records):
            page.unlink()
    return [f"{documents_dir}/{document_filename(p)}" for p in range(len(records))]


def _index_page(
    environment: Environment,
    records: Sequence[dict],
    label_names: list[str],
    hrefs: list[str],
    documents_dir: str,
    out_dir: Path,
    context: dict[str, Any],
) -> str:
    """``index.html``: headline, trust, per-class views, word lists, errors and the table of
    documents (``context``: :func:`write_report`'s title, subtitle, population, run_dir,
    faithfulness, checks, weights and the pages' common fields)."""
    population, faithfulness = context["population"], context["faithfulness"]
    measured = faithfulness or {}
    shown_first = first_method(measured, context["model_default"])
    trust = _trust_section(faithfulness, out_dir, context["weights"], context["scores"])
    matrix = confusion(records, label_names)
    cells = confusion_cells(records, label_names, hrefs)
    # Past MATRIX_CLASSES classes the lists are shorter: 150 full lists made the index 1.1 MB.
    shorter = dict(k=8, per_word=3) if len(label_names) > MATRIX_CLASSES else {}
    lexicon = class_lexicon(records, label_names, hrefs, shown_first.method, **shorter)
    classes = class_rows(matrix, label_names) if matrix is not None else []
    return environment.get_template("index.html.j2").render(
        title=context["title"],
        subtitle=context["subtitle"],
        summary=_summary(records, label_names, population),
        population=population,
        low_confidence=LOW_CONFIDENCE,
        run_metrics=_run_metrics(context["run_dir"], context["weights"]),
        figures=_index_figures(records, context["run_dir"], faithfulness, pool_heads_of(records))
        | _calibration_figure(context["calibration"]),
        calibration=_calibration_rows(context["calibration"]),
        method_help=[
            {"name": METHODS[key].label, "text": METHODS[key].help} for key in RECORD_METHODS
        ],
        lexicon=lexicon,
        lexicon_data=_lexicon_data(lexicon, records, documents_dir) if shorter else None,
        lexicon_listed=sum(bool(entry["rows"]) for entry in lexicon.values()),
        lexicon_first=_first_listed(lexicon, classes),
        classes=classes,
        matrix=matrix_view(matrix, label_names) if matrix is not None else None,
        pairs=pair_rows(cells, matrix, label_names) if matrix is not None else [],
        contrasts=contrastive_lexicon(records, label_names, hrefs),
        confusion_cells=cells,
        label_names=label_names,
        rows=_index_rows(records, documents_dir),
        trust=trust,
        shown_first=_chosen_without(shown_first, measured, trust),
        checks=_checks_section(context["checks"], records),
        method_labels={key: METHODS[key].label for key in METHODS},
        assets=ASSETS_DIR + "/",
        **context["common"],
    )


def first_method(measured: dict[str, Any], model_default: dict[str, str] | None) -> DefaultMethod:
    """The method the pages show first: the one this report's faithfulness table trusts most,
    or, where it measured none, the model's own default (``model_default``), else docclass's
    unmeasured one."""
    if measured.get("methods") or not model_default:
        return default_method(measured.get("methods"), measured.get("documents", 0))
    return DefaultMethod(model_default["method"], model_default["reason"])


def _chosen_without(
    shown_first: DefaultMethod, measured: dict[str, Any], trust: dict[str, Any] | None
) -> DefaultMethod:
    """The default's reason where the report measured nothing but ``docclass faithfulness``
    wrote tables into its folder: "not measured" stood above a measured table."""
    if measured.get("methods") or not (trust and trust.get("extra")):
        return shown_first
    return DefaultMethod(
        shown_first.method,
        f"{method_label(shown_first.method)} is shown first: this report measured no "
        "faithfulness of its own (made with --faithfulness false), and the tables below, "
        "measured later by docclass faithfulness, do not choose the pages' default.",
    )


def _lexicon_data(
    lexicon: dict[str, dict[str, Any]], records: Sequence[dict], documents_dir: str
) -> dict[str, Any]:
    """Every class's word list for the many-class index's picker, compact: per class
    ``[documents, reason, rows]``, a row ``[word, mean, total, documents, [[position, score],
    …]]`` (3 significant digits), with the documents' ids by position."""

    def short(value: float) -> float:
        return float(f"{value:.3g}")

    return {
        "dir": documents_dir,
        "ids": [str(record["id"]) for record in records],
        "classes": {
            name: [
                entry["documents"],
                entry["reason"],
                [
                    [
                        row["word"],
                        short(row["mean"]),
                        short(row["total"]),
                        row["documents"],
                        [[doc["position"], short(doc["score"])] for doc in row["top_documents"]],
                    ]
                    for row in entry["rows"]
                ],
            ]
            for name, entry in lexicon.items()
        },
    }


def _first_listed(lexicon: dict[str, dict[str, Any]], classes: list[dict[str, Any]]) -> str | None:
    """The class whose word list a many-class index shows first: the worst F1 with a list."""
    for row in classes:
        if lexicon.get(row["name"], {}).get("rows"):
            return row["name"]
    return next(iter(lexicon), None)


def _write_assets(environment: Environment, folder: Path) -> None:
    """The style sheet and scripts every page loads: once per report, not once per page (14 KB
    a page, 14 MB over a 1,000-document report)."""
    folder.mkdir(exist_ok=True)
    for name in ASSETS:
        source, _, _ = environment.loader.get_source(environment, name)
        (folder / name).write_text(source, encoding="utf-8")
    shared = {
        "help": {key: METHODS[key].help for key in RECORD_METHODS},
        "signed": list(SIGNED_METHODS),
    }
    # The project's own strings; htmlsafe_json_dumps escapes < > & all the same.
    script = f"window.DOCCLASS_METHODS = {htmlsafe_json_dumps(shared)};\n"
    (folder / METHODS_SCRIPT).write_text(script, encoding="utf-8")


def _index_figures(
    records: Sequence[dict],
    run_dir: Path | None,
    faithfulness: dict[str, Any] | None,
    pool_heads: int,
) -> dict[str, str]:
    """The index's figures as PNG data URIs: training curves, removal curves and the pool
    heads' attention entropy, each when its data exists. (The confusion matrix is an HTML
    table: as a PNG it was 5.5 MB and unreadable at 150 classes.)"""
    figures: dict[str, str] = {}
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


def _calibration_figure(calibration: dict[str, Any] | None) -> dict[str, str]:
    """The reliability diagram of the test split (of validation when the test was not scored)."""
    if not calibration:
        return {}
    split = "test" if "test" in calibration else "validation"
    # Named on the figure itself: the run's split, whatever documents the pages show.
    count = calibration[split].get("before", {}).get("documents")
    where = f"the run's {split} split" + (f" ({count} documents)" if count else "")
    figure = reliability_figure(calibration[split], calibration["temperature"], where)
    figures = {"reliability": png_data_uri(figure)}
    curve = calibration[split].get("risk_coverage")
    if curve:
        targets = calibration.get("abstention") or {}
        figures["risk_coverage"] = png_data_uri(risk_coverage_figure(curve, targets, where))
    return figures


def _calibration_rows(calibration: dict[str, Any] | None) -> dict[str, Any] | None:
    """The calibration table: per split, each score before → after the temperature."""
    if not calibration:
        return None
    rows = [
        {
            "split": split,
            "documents": calibration[split]["after"]["documents"],
            "floor": f"{calibration[split]['ece_if_calibrated']:.3f}"
            if "ece_if_calibrated" in calibration[split]
            else "—",
            **{
                score: f"{calibration[split]['before'][score]:.3f} → "
                f"{calibration[split]['after'][score]:.3f}"
                for score in ("ece", "brier", "nll")
            },
        }
        for split in ("validation", "test")
        if split in calibration
    ]
    return {
        "temperature": f"{calibration['temperature']:.3f}",
        "fitted_on": calibration.get("fitted_on", "the validation split"),
        # Why the raw probabilities were kept, when no temperature fitted.
        "unfitted": None
        if calibration.get("fit", "likelihood") == "likelihood"
        else calibration["fit"],
        "bins": calibration.get("ece_bins", 15),
        "rows": rows,
        "test_shown": "test" in calibration,
        "abstention": _abstention_rows(calibration.get("abstention") or {}),
    }


def _abstention_rows(targets: dict[str, dict]) -> list[dict[str, str]]:
    """Per precision target: the validation-chosen threshold and what it accepts, as text."""

    def share(accepted: dict | None) -> str:
        if not accepted:
            return "—"
        if not accepted["documents"]:
            return "none"
        return f"{100 * accepted['coverage']:.1f} % at {100 * accepted['precision']:.1f} %"

    return [
        {
            "target": f"{100 * float(name):g} %",
            "threshold": "none reaches it"
            if target["threshold"] is None
            else f"{target['threshold']:.4f}",
            "validation": share(target.get("validation")),
            "test": share(target.get("test")),
        }
        for name, target in targets.items()
    ]


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
    """Render a written report again from its ``explanations.jsonl.gz`` (after
    ``docclass faithfulness`` has added its figures to the folder, say)."""
    out_dir = Path(out_dir)
    meta = json.loads((out_dir / REPORT_META).read_text(encoding="utf-8"))
    return write_report(read_jsonl(out_dir / EXPLANATIONS), out_dir, **meta)


def _checks_section(checks: dict[str, Any], records: Sequence[dict]) -> dict[str, Any]:
    """Counterfactual, agreement and plausibility summaries as strings for the index. The top-10
    overlap is left out where the median document has at most :data:`SHORT_FOR_TOP_10` words:
    there the top 10 is most of the words, and any two methods share it."""
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
        read = [r["words_read"] for r in records if r.get("predicted") is not None]
        median_words = int(np.median(read)) if read else 0
        section["agreement"] = {
            "documents": agreement["documents"],
            "median_words": median_words,
            "short": median_words <= SHORT_FOR_TOP_10,
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


def _trust_section(
    faithfulness: dict[str, Any] | None,
    out_dir: Path,
    weights: str | None = None,
    scores: str | None = None,
) -> dict[str, Any] | None:
    """The index's faithfulness figures: the records' own (mask removal, every document) and,
    when ``docclass faithfulness`` wrote into this folder for the same weights and score
    rules, its checks."""
    table = (faithfulness or {}).get("methods")
    path = out_dir / FAITHFULNESS_FILE
    extra = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if extra and weights and extra.get("weights") != weights:
        extra = None  # measured on another checkpoint: not this report's model
    if extra and scores and extra.get("scores") != scores:
        extra = None  # measured on scores made by other rules than the records' own
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
                    "ratio": ""
                    if name == "random"
                    else times_random(row["comprehensiveness"], floor),
                    "sufficiency": f"{row['sufficiency']:.3f}",
                    "beats": "—" if name == "random" else f"{100 * row['beats_random']:.0f} %",
                }
            )
    if extra:
        section["extra"] = _extra_rows(extra)
    return section


def _over(summary: dict[str, Any], documents: int) -> str:
    """What a τ or ρ cell's mean leaves out: the documents it does not cover (methods differ)
    and how many of its ρ are randomised scores that became constant (counted as 0)."""
    notes = []
    if summary.get("documents", documents) != documents:
        notes.append(f"{summary['documents']} documents")
    if summary.get("constant"):
        notes.append(f"{summary['constant']} constant")
    return f" ({', '.join(notes)})" if notes else ""


def _extra_rows(figures: dict[str, Any]) -> dict[str, Any]:
    """``faithfulness.json``'s sample checks as rows of plain strings."""
    extra: dict[str, Any] = {
        "documents": figures.get("documents"),
        "given": figures.get("documents_given"),
        # Only its weights and rules are matched: which documents it measured is said.
        "data": figures.get("data"),
        "removal": [],
    }
    for removal, result in figures.get("removal", {}).items():
        table = result["aopc"]
        floor = table["random"]["comprehensiveness"]
        rows = []
        for name, row in sorted(table.items(), key=lambda kv: -kv[1]["comprehensiveness"]):
            ratio = "" if name == "random" else times_random(row["comprehensiveness"], floor)
            rows.append(
                (
                    method_label(name),
                    f"{row['comprehensiveness']:.3f}",
                    ratio,
                    f"{row['sufficiency']:.3f}",
                )
            )
        extra["removal"].append({"removal": REMOVAL_LABELS[removal], "rows": rows})
    extra["sample"] = None  # the pages test it: a table measured without a sample has none
    sample = figures.get("sample")
    if sample:
        rank = sample.get("kendall_tau_vs_leave_one_out", {})
        stages = sample.get("randomised_weights", {})
        documents = sample["documents"]
        extra["sample"] = {
            "documents": documents,
            "given": sample.get("documents_given"),
            "ig_steps": sample.get("integrated_gradients_steps"),
            "ig_delta": sample.get("integrated_gradients_relative_delta", {}).get("max"),
            "stages": list(stages),
            "rows": [
                {
                    "name": method_label(name),
                    "aopc": sample.get("aopc_mask", {}).get(name, {}).get("comprehensiveness"),
                    "tau": f"{rank[name]['mean']:.2f} ± {rank[name]['std']:.2f}"
                    + _over(rank[name], documents),
                    "rho": [
                        f"{stages[stage][name]['mean']:.2f}" + _over(stages[stage][name], documents)
                        if name in stages[stage]
                        else "—"
                        for stage in stages
                    ],
                }
                for name in rank
            ],
        }
    extra["permuted_pool"] = figures.get("permuted_pool")
    return extra
