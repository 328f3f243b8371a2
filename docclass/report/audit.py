"""The label audit's page: the documents whose given label the model doubts, ranked, each with
the words that speak for the given label and for the model's.

The words are the contrast of the two classes by the fold model's default word-score method:
each word's push toward the model's label rather than the given one (``audit_contrast`` in the
record, from :func:`docclass.interpret.explain.class_contrast`); the words for the given label
are those with the most negative push. Every word and id goes through the templates'
autoescaping.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from docclass.files import write_atomically
from docclass.interpret.default_method import DefaultMethod
from docclass.interpret.records import method_label
from docclass.report.html import ASSETS_DIR, page_common, template_environment, write_document_pages
from docclass.report.lexicon import is_word

WORDS_PER_SIDE = 8


def contrast_words(
    record: dict[str, Any], toward: str, against: str, k: int = WORDS_PER_SIDE
) -> list[dict[str, Any]]:
    """The ``k`` words read that push ``record`` most toward ``toward`` rather than ``against``
    (positive pushes only, largest first, each word once whatever its case), from the record's
    ``audit_contrast`` of the same two classes in either direction; empty when it has none."""
    contrast = record.get("audit_contrast") or {}
    if (contrast.get("toward"), contrast.get("against")) == (toward, against):
        push = list(contrast["scores"])
    elif (contrast.get("toward"), contrast.get("against")) == (against, toward):
        push = [-score for score in contrast["scores"]]
    else:
        return []
    read = min(record["words_read"], len(push))
    ranked = sorted(range(read), key=lambda i: -push[i])
    words, seen = [], set()
    for i in ranked:
        word = record["words"][i]
        # A name repeated through an article would fill the list: each word once, at its
        # strongest occurrence.
        if push[i] > 0 and is_word(word) and word.lower() not in seen:
            seen.add(word.lower())
            words.append({"word": word, "score": push[i]})
    return words[:k]


def audit_rows(
    flagged: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]], hrefs: Sequence[str]
) -> list[dict[str, Any]]:
    """One table row per flagged document, in rank order: ``flagged[i]`` (``rank, id, split,
    given, suggested, score, p_given, p_suggested, fold``) explained by ``records[i]``."""
    rows = []
    for entry, record, href in zip(flagged, records, hrefs, strict=True):
        if str(record["id"]) != str(entry["id"]):
            raise ValueError(f"record {record['id']!r} does not explain entry {entry['id']!r}")
        given, suggested = entry["given"], entry["suggested"]
        rows.append(
            {
                **entry,
                "href": href,
                "for_suggested": contrast_words(record, suggested, given),
                "for_given": contrast_words(record, given, suggested),
            }
        )
    return rows


def write_audit_report(
    flagged: Sequence[dict[str, Any]],
    records: Sequence[dict[str, Any]],
    summary: dict[str, Any],
    out_dir: str | Path,
    method: DefaultMethod,
    documents_dir: str = "docs",
) -> Path:
    """``index.html`` (the ranked table) and a page per flagged document in ``out_dir``.

    Args:
        flagged: the flagged documents, most likely wrong first (see :func:`audit_rows`).
        records: their explanation records, same order, by the model that did not train on
            them, each with its ``audit_contrast`` of the suggested class against the given.
        summary: what the page's heading says: ``documents`` audited, ``folds``, ``filter_by``,
            ``flagged``, ``out_of_sample_accuracy``, per-class counts ``by_class``, after a
            re-training ``retrain`` (each run's training and validation documents, and how
            many flagged ones were ``removed``), and the other audits averaged in,
            ``with_audits`` (with ``averaged_out_of_sample_accuracy``).
        out_dir: folder to write into (created).
        method: the word-score method of the contrasts, and why; the document pages open on it.
        documents_dir: sub-folder of the document pages.
    """
    out_dir = Path(out_dir)
    common = page_common()
    hrefs = write_document_pages(records, out_dir, documents_dir, method, common, given_labels=True)
    rows = audit_rows(flagged, records, hrefs)
    page = (
        template_environment()
        .get_template("audit.html.j2")
        .render(
            rows=rows,
            summary=summary,
            method=method,
            method_name=method_label(method.method),
            assets=f"{ASSETS_DIR}/",
            **common,
        )
    )
    # Whole or not at all: a half-written page is no page of any run.
    write_atomically(out_dir / "index.html", page)
    return out_dir / "index.html"
