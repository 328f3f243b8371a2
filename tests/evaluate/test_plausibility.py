"""Plausibility against ERASER rationales: hand-computed token F1, IOU F1 and AUPRC."""

import json

import pytest

from docclass.errors import UserError
from docclass.evaluate.plausibility import average_precision, plausibility, read_rationales


def record(doc_id, text, scores):
    words = text.split()
    spans, cursor = [], 0
    for word in words:
        start = text.index(word, cursor)
        spans.append([start, start + len(word)])
        cursor = start + len(word)
    return {"id": doc_id, "text": text, "words": words, "spans": spans,
            "words_read": len(words), "scores": {"attention": scores}}  # fmt: skip


def test_metrics_match_a_hand_computed_example():
    # Evidence: whitespace tokens 1-2 ("central bank"). Top 2 by score: "bank" (right) and
    # "rates" (wrong) → token F1 = 2·1/(2+2) = 0.5. Predicted spans [2,3) and [4,5) against
    # the evidence span [1,3): IOU 1/2 for the first (a match at 0.5), 0 for the second →
    # precision 1/2, recall 1/1, IOU F1 = 2/3. Ranks of evidence words: bank 1st, central 3rd
    # → AUPRC = (1/1 + 2/3) / 2.
    text = "the central bank held rates"
    records = [record("a", text, [0.0, 0.2, 0.5, 0.1, 0.3])]
    table = plausibility(records, {"a": [(1, 3)]}, methods=["attention"])
    row = table["methods"]["attention"]
    assert table["documents"] == 1
    assert row["token_f1"] == pytest.approx(0.5)
    assert row["iou_f1"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["auprc"] == pytest.approx((1 + 2 / 3) / 2, abs=1e-4)
    assert records[0]["rationale"] == [1, 2]


@pytest.mark.fault(
    "rationales keyed by ids the explained documents do not carry (`train/0` for a file whose "
    "rows are numbered from 1)",
    "a warning naming ids of both sides (the page's plausibility section was dropped without "
    "a word)",
)
def test_rationales_matching_no_document_are_said(caplog):
    records = [record("1", "the central bank held rates", [0.0, 0.2, 0.5, 0.1, 0.3])]
    with caplog.at_level("WARNING", logger="docclass"):
        table = plausibility(records, {"train/0": [(1, 3)]}, methods=["attention"])
    assert table == {"documents": 0, "annotated": 1, "methods": {}}
    assert "none of the 1 annotated documents (train/0) is among the 1 explained (1)" in caplog.text


def test_evidence_offsets_count_whitespace_tokens_not_the_tokenizers_words():
    # docclass splits "rates," into two words; ERASER's token 3 is "rates," as one token.
    text = "the bank held rates, again"
    words = ["the", "bank", "held", "rates", ",", "again"]
    spans = [[0, 3], [4, 8], [9, 13], [14, 19], [19, 20], [21, 26]]
    doc = {"id": "a", "text": text, "words": words, "spans": spans, "words_read": 6,
           "scores": {"attention": [0, 0, 0, 1.0, 0.5, 0]}}  # fmt: skip
    table = plausibility([doc], {"a": [(3, 4)]}, methods=["attention"])
    assert doc["rationale"] == [3, 4]
    assert table["methods"]["attention"]["token_f1"] == 1.0


def test_average_precision_of_a_perfect_and_a_reversed_ranking():
    gold = [False, True, True, False]
    import numpy as np

    assert average_precision(np.array([0.0, 0.9, 0.8, 0.1]), np.array(gold)) == 1.0
    assert average_precision(np.array([0.9, 0.0, 0.1, 0.8]), np.array(gold)) == pytest.approx(
        (1 / 3 + 2 / 4) / 2
    )


def test_rationales_file_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_rationales(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"annotation_id": "a", "evidences": [[{"docid": "a"}]]}) + "\n")
    with pytest.raises(UserError, match=r"line 1 is not an ERASER annotation"):
        read_rationales(bad)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes("café".encode("latin-1"))
    with pytest.raises(UserError, match="is not UTF-8 text"):
        read_rationales(latin)


@pytest.mark.fault(
    "an ERASER evidence span with a negative token offset or its end before its start",
    "one line naming the file and line; never the document's last words marked as evidence",
)
@pytest.mark.parametrize("span", [(-1, 0), (-2, 5), (4, 2)])
def test_a_rationale_span_out_of_order_is_refused(tmp_path, span):
    path = tmp_path / "rationales.jsonl"
    evidence = {"docid": "a", "start_token": span[0], "end_token": span[1]}
    path.write_text(json.dumps({"annotation_id": "a", "evidences": [[evidence]]}) + "\n")
    with pytest.raises(UserError, match=r"line 1 is not an ERASER annotation \(token span"):
        read_rationales(path)
