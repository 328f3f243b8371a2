"""The label audit's page: the documents whose given label the model doubts, ranked, each with
the words that speak for the given label and for the model's.

The words are the contrast of the two classes by class contribution (``contribution(model's)
− contribution(given)`` per word, exact because the read-out after the pool is linear), read
from explanation records that keep both classes' contributions. Every word and id goes through
the templates' autoescaping.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from docclass.interpret.default_method import DefaultMethod
from docclass.report.html import ASSETS_DIR, page_common, template_environment, write_document_pages
from docclass.report.lexicon import class_difference, is_word

WORDS_PER_SIDE = 8


def contrast_words(
    record: dict[str, Any], toward: str, against: str, k: int = WORDS_PER_SIDE
) -> list[dict[str, Any]]:
    """The ``k`` words read that push ``record`` most toward ``toward`` rather than ``against``
    (positive differences only, largest first, each word once whatever its case); empty when
    the record lacks either class."""
    difference = class_difference(record, toward, against)
    if difference is None:
        return []
    read = record["words_read"]
    ranked = sorted(range(read), key=lambda i: -difference[i])
    words, seen = [], set()
    for i in ranked:
        word = record["words"][i]
        # A name repeated through an article would fill the list: each word once, at its
        # strongest occurrence.
        if difference[i] > 0 and is_word(word) and word.lower() not in seen:
            seen.add(word.lower())
            words.append({"word": word, "score": difference[i]})
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
    documents_dir: str = "docs",
) -> Path:
    """``index.html`` (the ranked table) and a page per flagged document in ``out_dir``.

    Args:
        flagged: the flagged documents, most likely wrong first (see :func:`audit_rows`).
        records: their explanation records, same order, by the model that did not train on
            them, each keeping the contributions of its given and suggested class.
        summary: what the page's heading says: ``documents`` audited, ``folds``, ``filter_by``,
            ``flagged``, ``out_of_sample_accuracy``, per-class counts ``by_class`` and, after a
            re-training, ``retrain``.
        out_dir: folder to write into (created).
        documents_dir: sub-folder of the document pages.
    """
    out_dir = Path(out_dir)
    common = page_common()
    shown_first = DefaultMethod(
        "contribution",
        "Class contribution is shown first: the audit's words are contributions, and the page "
        "can contrast the given label with the model's.",
    )
    hrefs = write_document_pages(records, out_dir, documents_dir, shown_first, common)
    rows = audit_rows(flagged, records, hrefs)
    page = (
        template_environment()
        .get_template("audit.html.j2")
        .render(rows=rows, summary=summary, assets=f"{ASSETS_DIR}/", **common)
    )
    (out_dir / "index.html").write_text(page, encoding="utf-8")
    return out_dir / "index.html"
