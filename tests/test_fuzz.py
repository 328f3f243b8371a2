"""Property-based: arbitrary Unicode through tokenizer → model → word scores → HTML → rows.

Hypothesis draws the texts (derandomized, so the suite is the same on every run): control
characters, NUL, bidirectional marks, combining marks, emoji, surrogate-free planes, runs of
whitespace, very long words. Nothing may crash, no score may be NaN, every word must be the
exact characters of the input at its span, pages must show the text and never markup, and
classification must give one row per document.
"""

import math

import pytest
from helpers import LABELS, assert_only_the_reports_own_scripts, parsed_page, tiny_classifier
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from docclass.inference.classifier import DocClassifier
from docclass.inference.classify import InputDocument, classify_documents
from docclass.interpret.explain import explain_documents
from docclass.report.html import document_filename, write_report

NASTY = [
    "\x00", "\x07", "\x1b[31m", "\r\n", "\t", "\u202e", "\u200f", "\u200b", "\ufeff", "\u0301",
    "e\u0301", "🙂", "👩🏽‍💻", "🇫🇷", "<", ">", "&", '"', "'", "</script>", "<!--", "{{", "}}",
    "\\", "\u2028", "\u00a0", "Ω", "ß", "İ", "ﬁ", "…", "Ｆ", "٣", "漢字", "\U0010fffd",
]  # fmt: skip
CHUNKS = st.one_of(
    st.sampled_from(NASTY),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
    st.text("ab ", min_size=1, max_size=5),
)
TEXTS = st.lists(CHUNKS, max_size=40).map("".join)
FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CLASSIFIER = tiny_classifier(n_layers=1, max_tokens=256)


def _check_record(text: str, record: dict) -> None:
    assert record["text"] == text
    if record.get("error"):
        assert not record["words"] and record["predicted"] is None
        return
    assert [text[s:e] for s, e in record["spans"]] == record["words"]
    assert all(0 <= s < e <= len(text) for s, e in record["spans"])
    assert 0 < record["words_read"] <= len(record["words"])
    for method, values in record["scores"].items():
        assert len(values) == len(record["words"]), method
        assert all(math.isfinite(v) for v in values), method
    assert all(math.isfinite(p) for p in record["probs"].values())
    assert record["predicted"] in LABELS


@pytest.mark.fault(
    "arbitrary Unicode (NUL, control, bidi, combining marks, emoji, a "
    "100,000-character word) through word scores",
    "no crash, finite scores, every word the input's exact characters",
)
@FUZZ
@given(TEXTS)
@example("a" * 100_000)  # one 100,000-character word
@example("\x00" * 50)
@example(" \n\t\u200b\ufeff ")
def test_word_scores_for_any_text(text):
    (record,) = explain_documents(CLASSIFIER, [text])
    _check_record(text, record)


@pytest.mark.fault(
    "arbitrary Unicode as document text and id in the HTML report",
    "shown exactly as text, never as markup",
)
@FUZZ
@given(st.lists(TEXTS, min_size=1, max_size=4))
def test_report_pages_show_any_text_exactly_and_never_as_markup(tmp_path, texts):
    records = explain_documents(CLASSIFIER, texts, doc_ids=texts)
    out = tmp_path / "report"
    write_report(records, out, LABELS, title="fuzz")
    for position, (text, record) in enumerate(zip(texts, records, strict=True)):
        page_path = out / "docs" / document_filename(position)
        html = page_path.read_text(encoding="utf-8")
        assert "</script>" not in html.split("<script", 1)[0]  # nothing before the report's own
        assert_only_the_reports_own_scripts(html)
        if record.get("error"):
            continue
        page = parsed_page(page_path)
        read = record["words_read"]
        assert [page.words[i]["text"] for i in sorted(page.words)] == record["words"][:read]
        shown = "".join(page.text_parts)
        if record["truncated"]:
            cut = shown.index("✂")
            shown = shown[:cut] + shown[shown.index("not seen.", cut) + 9 :]
        assert shown == text.replace("\r\n", "\n").replace("\r", "\n") or shown == text


@pytest.mark.fault(
    "arbitrary Unicode through classify",
    "one row per document, probabilities summing to 1",
)
@FUZZ
@given(st.lists(TEXTS, min_size=1, max_size=8))
def test_classify_gives_one_row_per_document_for_any_text(texts):
    classifier = DocClassifier(CLASSIFIER, device="cpu")
    documents = [InputDocument(f"doc{i}", text) for i, text in enumerate(texts)]
    rows = list(classify_documents(classifier, documents, batch_size=3))
    assert [row["id"] for row in rows] == [d.id for d in documents]
    for text, row in zip(texts, rows, strict=True):
        if row.get("error"):
            assert row["label"] is None and not text.strip() or "empty" in row["error"]
        else:
            assert row["label"] in LABELS
            assert math.isclose(sum(row["probs"].values()), 1.0, abs_tol=1e-4)


@pytest.mark.parametrize("text", NASTY)
def test_every_nasty_character_alone(text):
    (record,) = explain_documents(CLASSIFIER, [text])
    _check_record(text, record)
