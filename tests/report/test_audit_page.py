"""The label audit's page: the words for each label are the contrast of the two classes, each
entry links its document's page, and every id and word is escaped."""

import re

import pytest
from markupsafe import escape

from docclass.interpret.default_method import default_method
from docclass.report.audit import contrast_words, write_audit_report

UNMEASURED = default_method(None)


def _record(words, push):
    """A record whose audit contrast pushes each word toward "model" rather than "given" by
    ``push`` (negative: toward "given")."""
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
        "scores": {"attention": [1 / len(words)] * len(words), "conservative": push},
        "audit_contrast": {
            "method": "conservative", "toward": "model", "against": "given", "scores": push
        },
    }  # fmt: skip


def test_contrast_words_are_the_pushes_toward_each_class():
    words = ["alpha", "beta", ",", "gamma", "Beta"]
    record = _record(words, [-0.4, 0.4, 0.9, 0.0, 0.6])
    toward_model = contrast_words(record, "model", "given")
    # "," is no word, gamma no push, beta once (at its strongest).
    assert [w["word"] for w in toward_model] == ["Beta"]
    assert toward_model[0]["score"] == pytest.approx(0.6)
    # The other direction reads the same contrast negated.
    assert [w["word"] for w in contrast_words(record, "given", "model")] == ["alpha"]
    assert contrast_words(record, "given", "model")[0]["score"] == pytest.approx(0.4)
    assert contrast_words(record, "given", "absent") == []


ENTRY = {"rank": 1, "id": "doc<1>", "split": "val", "given": "given", "suggested": "model",
         "score": 0.1, "p_given": 0.1, "p_suggested": 0.9, "fold": 0}  # fmt: skip


def _summary(flagged, by_class=()):
    return {"config": "c<b>.yaml", "documents": 10, "folds": 2, "filter_by": "both",
            "flagged": flagged, "out_of_sample_accuracy": 0.9, "retrain": None,
            "by_class": list(by_class), "with_audits": []}  # fmt: skip


def test_audit_page_escapes_every_word_and_links_each_entry(tmp_path):
    record = _record(["<script>alert(1)</script>", "plain"], [-0.9, 0.7])
    entry = ENTRY
    summary = _summary(1, [{"label": "<i>given</i>", "documents": 5, "flagged": 1}])
    summary["retrain"] = {
        "test_documents": 200, "removed": 1,
        "baseline": {"accuracy": 0.955, "macro_f1": 0.95, "documents": 200, "train_documents": 9,
                     "val_documents": 3},
        "cleaned": {"accuracy": 0.975, "macro_f1": 0.97, "documents": 200, "train_documents": 8,
                    "val_documents": 3},
    }  # fmt: skip
    index = write_audit_report([entry], [record], summary, tmp_path / "report", UNMEASURED)
    page = index.read_text()
    # Each label's cell holds the words that pushed toward it rather than the other.
    cells = re.search(
        r"<b>given</b> p 0\.100</td>\s*<td>(.*?)</td>\s*<td><b>model</b> p 0\.900</td>"
        r"\s*<td>(.*?)</td>",
        page,
        re.S,
    )
    assert cells.groups() == ("<i>&lt;script&gt;alert(1)&lt;/script&gt;</i>", "<i>plain</i>")
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "doc&lt;1&gt;" in page and "c&lt;b&gt;.yaml" in page and "<i>given</i>" not in page
    href = re.search(r'<a href="(docs/doc-[0-9]+\.html)">doc&lt;1&gt;', page).group(1)
    assert (tmp_path / "report" / href).is_file()
    assert "<script>alert" not in (tmp_path / "report" / href).read_text()
    assert "are shown" not in page  # every flagged document has its entry
    # The re-training's two runs, each with its own figures, and what one test document weighs.
    table = re.search(r'<table class="small" id="retrain-table">(.*?)</table>', page, re.S)
    rows = re.findall(r"<tr><td>(.*?)</td><td class=\"num\">(\d+)</td><td class=\"num\">"
                      r"(\d+)</td><td class=\"num\">([0-9.]+)</td>", table.group(1))  # fmt: skip
    assert rows == [("the config's whole training and validation splits", "9", "3", "0.9550"),
                    ("the same without the flagged ones", "8", "3", "0.9750")]  # fmt: skip
    assert '<b id="retrain-removed">1</b> flagged document removed' in page
    assert "one document is 0.50 points of accuracy" in page
    # The page names the method of its words, and the document page opens on it.
    assert "conservative propagation" in re.search(r'id="contrast-method">(.*?)<', page).group(1)
    document = (tmp_path / "report" / href).read_text()
    # The document's label is the given one, perhaps wrong: not "true", and no "wrong" badge.
    assert re.search(r'given label <b id="label">given</b>', document)
    assert "true label" not in document and ">wrong<" not in document
    assert "the model disagrees with the given label" in document
    assert str(escape(UNMEASURED.reason)) in re.search(
        r'id="shown-first">(.*?)</p>', document
    ).group(1)


def test_audit_page_says_how_it_flagged_and_whose_probabilities(tmp_path):
    record = _record(["one", "two"], [-0.2, 0.3])
    summary = _summary(1)
    page = write_audit_report([ENTRY], [record], summary, tmp_path / "a", UNMEASURED).read_text()
    how = re.search(r'id="how-flagged">(.*?)</p>', page, re.S).group(1)
    assert "confidently gives another class" in how and "with-audits" not in how
    summary["filter_by"] = "calibrated_count_by_self_confidence"
    summary["with_audits"] = [{"out": "a", "config": "m<1>.yaml"}, {"out": "b", "config": "s.yaml"}]
    summary["averaged_out_of_sample_accuracy"] = 0.95
    page = write_audit_report([ENTRY], [record], summary, tmp_path / "b", UNMEASURED).read_text()
    how = re.search(r'id="how-flagged">(.*?)</p>', page, re.S).group(1)
    assert "given label got the lowest probability" in how and "confidently gives" not in how
    assert "mean of this audit's and 2 other audits" in how
    assert "<code>m&lt;1&gt;.yaml</code>, <code>s.yaml</code>" in how and "m<1>" not in page
    assert "0.950" in re.search(r'id="averaged-accuracy">(.*?)</div>', page).group(1)
    summary["with_audits"] = summary["with_audits"][:1]
    page = write_audit_report([ENTRY], [record], summary, tmp_path / "c", UNMEASURED).read_text()
    assert "mean of this audit's and 1 other audit of" in page


def test_audit_page_says_when_it_shows_only_the_first_flagged(tmp_path):
    record = _record(["one", "two"], [-0.2, 0.3])
    summary = _summary(3)
    page = write_audit_report([ENTRY], [record], summary, tmp_path / "a", UNMEASURED).read_text()
    assert "The first 1 of the 3 flagged documents are shown" in page
    page = write_audit_report([], [], summary, tmp_path / "b", UNMEASURED).read_text()
    assert "The first 0 of the 3" in page and "No document was flagged" not in page
