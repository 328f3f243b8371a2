"""Method agreement per document: Kendall τ and top-10 overlap, and the flag on the worst."""

import pytest

from docclass.evaluate.agreement import add_agreement, document_agreement


def record(attention, contribution):
    n = len(attention)
    return {"words_read": n, "scores": {"attention": attention, "contribution": contribution}}


def test_identical_and_reversed_rankings():
    same = document_agreement(record([0.1, 0.2, 0.3], [1.0, 2.0, 3.0]))
    assert same == {"attention|contribution": {"tau": 1.0, "top10": 1.0}}
    reversed_ = document_agreement(record([0.1, 0.2, 0.3], [3.0, 2.0, 1.0]))
    assert reversed_["attention|contribution"]["tau"] == pytest.approx(-1.0)
    # 12 words, top 10 of each: the reversed orders share 8 of them.
    scores = [float(i) for i in range(12)]
    wide = document_agreement(record(scores, scores[::-1]))
    assert wide["attention|contribution"]["top10"] == pytest.approx(0.8)


def test_documents_whose_methods_agree_least_are_flagged():
    records = [record([0.1, 0.2, 0.3], [1.0, 2.0, 3.0]) for _ in range(3)]
    records.append(record([0.1, 0.2, 0.3], [3.0, 2.0, 1.0]))
    summary = add_agreement(records, flagged=1)
    assert [bool(r.get("disagree")) for r in records] == [False, False, False, True]
    assert summary["documents"] == 4
    assert summary["pairs"]["attention|contribution"]["tau"]["mean"] == pytest.approx(0.5)


def test_no_more_than_a_tenth_of_the_documents_are_flagged():
    # Ten documents, the tenth the least alike: it alone is flagged (all ten were).
    records = [record([0.1, 0.2, 0.3, 0.4], [1.0, 2.0, 3.0, 4.0]) for _ in range(9)]
    records.append(record([0.1, 0.2, 0.3, 0.4], [4.0, 3.0, 2.0, 1.0]))
    add_agreement(records)
    assert [bool(r.get("disagree")) for r in records] == [False] * 9 + [True]
    many = [record([0.1, 0.2, 0.3, 0.4], [1.0, 2.0, 3.0, 4.0]) for _ in range(213)]
    add_agreement(many)
    assert sum(bool(r.get("disagree")) for r in many) == 10  # the report's ten, as before
