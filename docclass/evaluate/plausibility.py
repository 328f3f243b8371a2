"""Plausibility: how well each method's words match the evidence people marked.

Rationales are read in ERASER's JSONL format (DeYoung et al. 2020): one line per annotation,
``{"annotation_id", "evidences": [[{"docid", "start_token", "end_token", ...}, ...]], ...}``,
token offsets counting the document's whitespace-separated tokens, ``end_token`` exclusive.
Each evidence marks the words of docclass's own segmentation that overlap it. Per method:

- **token F1**: the method's top k words (k = the document's evidence words) against the
  evidence words, F1 per document, averaged;
- **IOU F1**: the top-k words' contiguous spans against the evidence spans; a span matches when
  their intersection over union is at least 0.5 (ERASER's threshold), F1 over all spans;
- **AUPRC**: the average precision of the method's scores at finding evidence words, averaged
  over documents (no threshold).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from docclass.errors import UserError
from docclass.interpret.records import RECORD_METHODS

log = logging.getLogger(__name__)

IOU_THRESHOLD = 0.5


def read_rationales(path: str | Path) -> dict[str, list[tuple[int, int]]]:
    """``{document id: [(start_token, end_token), ...]}`` from an ERASER JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"rationales file {path} not found: give ERASER-format JSONL")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text: save the rationales as UTF-8 JSONL") from None
    spans: dict[str, list[tuple[int, int]]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            annotation = json.loads(line)
            for group in annotation["evidences"]:
                for evidence in group:
                    docid = str(evidence.get("docid") or annotation["annotation_id"])
                    span = (int(evidence["start_token"]), int(evidence["end_token"]))
                    if not 0 <= span[0] <= span[1]:
                        # A negative offset would index from the document's end and mark
                        # its last words as evidence.
                        raise ValueError(f"token span {list(span)} is not 0 <= start <= end")
                    spans.setdefault(docid, []).append(span)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise UserError(
                f"{path} line {number} is not an ERASER annotation ({error}): each line needs "
                '"annotation_id" and "evidences": [[{"docid", "start_token", "end_token"}]]'
            ) from None
    return spans


def evidence_words(record: dict, token_spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Bool per word read: does the word overlap an evidence span (whitespace-token offsets)?"""
    tokens = [m.span() for m in re.finditer(r"\S+", record["text"])]
    marked = np.zeros(record["words_read"], dtype=bool)
    for start_token, end_token in token_spans:
        if start_token >= end_token or start_token >= len(tokens):
            continue
        start = tokens[start_token][0]
        end = tokens[min(end_token, len(tokens)) - 1][1]
        for i, (word_start, word_end) in enumerate(record["spans"][: record["words_read"]]):
            if word_start < end and word_end > start:
                marked[i] = True
    return marked


def _runs(marked: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` runs of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], marked.astype(np.int8), [0]])))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


def _iou(a: tuple[int, int], b: tuple[int, int]) -> float:
    overlap = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    return overlap / (max(a[1], b[1]) - min(a[0], b[0]))


def average_precision(scores: np.ndarray, gold: np.ndarray) -> float:
    """Area under the precision-recall curve as the mean precision at each gold item's rank."""
    order = np.argsort(-scores, kind="stable")
    hits = gold[order]
    if not hits.any():
        return 0.0
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(precision[hits].mean())


def plausibility(
    records: Sequence[dict],
    rationales: dict[str, list[tuple[int, int]]],
    methods: Sequence[str] = RECORD_METHODS,
) -> dict[str, Any]:
    """Per method: token F1, IOU F1 and AUPRC over the records that have evidence."""
    token_f1: dict[str, list[float]] = {m: [] for m in methods}
    auprc: dict[str, list[float]] = {m: [] for m in methods}
    spans = {m: {"matched_pred": 0, "pred": 0, "matched_gold": 0, "gold": 0} for m in methods}
    matched = 0
    for record in records:
        token_spans = rationales.get(str(record["id"]))
        if not token_spans or record.get("error") or not record.get("words_read"):
            continue
        gold = evidence_words(record, token_spans)
        if not gold.any():
            continue
        matched += 1
        record["rationale"] = np.flatnonzero(gold).tolist()
        k = int(gold.sum())
        gold_runs = _runs(gold)
        for method in methods:
            scores = np.asarray(record["scores"][method][: len(gold)], dtype=np.float64)
            predicted = np.zeros(len(gold), dtype=bool)
            predicted[np.argsort(-scores, kind="stable")[:k]] = True
            hits = int((predicted & gold).sum())
            token_f1[method].append(2 * hits / (predicted.sum() + k))
            auprc[method].append(average_precision(scores, gold))
            pred_runs = _runs(predicted)
            tally = spans[method]
            tally["pred"] += len(pred_runs)
            tally["gold"] += len(gold_runs)
            tally["matched_pred"] += sum(
                any(_iou(p, g) >= IOU_THRESHOLD for g in gold_runs) for p in pred_runs
            )
            tally["matched_gold"] += sum(
                any(_iou(p, g) >= IOU_THRESHOLD for p in pred_runs) for g in gold_runs
            )
    if not matched:
        # The page then has no plausibility section: say why, with ids of both sides, since
        # ids a person typed for a file (train/0) and the file's own (1) differ silently.
        log.warning(
            "rationales: none of the %d annotated documents (%s) is among the %d explained "
            "(%s); ids are a data file's id column, else its rows numbered from 1, or "
            "<split>/<row> from 0 for a folder or hub dataset",
            len(rationales), ", ".join(list(rationales)[:3]), len(records),
            ", ".join(str(record["id"]) for record in records[:3]),
        )  # fmt: skip
        return {"documents": 0, "annotated": len(rationales), "methods": {}}
    table = {}
    for method in methods:
        tally = spans[method]
        precision = tally["matched_pred"] / tally["pred"] if tally["pred"] else 0.0
        recall = tally["matched_gold"] / tally["gold"] if tally["gold"] else 0.0
        iou_f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        table[method] = {
            "token_f1": round(float(np.mean(token_f1[method])), 4),
            "iou_f1": round(iou_f1, 4),
            "auprc": round(float(np.mean(auprc[method])), 4),
        }
    return {"documents": matched, "annotated": len(rationales), "methods": table}
