"""How far the word-score methods agree with each other, document by document.

Per document and pair of methods: Kendall's τ-b between their scores over the words read, and
the overlap of their top 10 words (shared words / 10, or / the words read when fewer). Where
methods disagree, no single view deserves trust: the report flags those documents.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from docclass.interpret.records import RECORD_METHODS

TOP_WORDS = 10


def _top(values: np.ndarray, k: int) -> set[int]:
    return set(np.argsort(-values, kind="stable")[:k].tolist())


def document_agreement(
    record: dict, methods: Sequence[str] = RECORD_METHODS
) -> dict[str, dict[str, float]] | None:
    """``{"a|b": {"tau", "top10"}}`` for every pair of the record's methods; None for a
    document with fewer than two words read."""
    from scipy.stats import kendalltau

    read = record.get("words_read", 0)
    if record.get("error") or read < 2:
        return None
    scores = {
        name: np.asarray(record["scores"][name][:read], dtype=np.float64)
        for name in methods
        if name in record.get("scores", {})
    }
    k = min(TOP_WORDS, read)
    pairs = {}
    for a, b in itertools.combinations(scores, 2):
        tau = kendalltau(scores[a], scores[b]).statistic
        pairs[f"{a}|{b}"] = {
            # A constant ranking agrees with nothing: τ is undefined, counted as 0.
            "tau": round(float(tau), 4) if np.isfinite(tau) else 0.0,
            "top10": round(len(_top(scores[a], k) & _top(scores[b], k)) / k, 4),
        }
    return pairs


def add_agreement(records: Sequence[dict], flagged: int = 10) -> dict[str, Any]:
    """Store each record's pairwise agreement under ``agreement`` and its mean τ under
    ``agreement_tau``; flag (``disagree: true``) the documents whose methods agree least: the
    ``flagged`` lowest, and no more than a tenth of them (a report of ten documents had every
    one flagged, the flag then saying nothing). Returns the mean and spread of every pair over
    documents."""
    per_pair: dict[str, dict[str, list[float]]] = {}
    measured = []
    for position, record in enumerate(records):
        pairs = document_agreement(record)
        if not pairs:
            continue
        record["agreement"] = pairs
        record["agreement_tau"] = round(float(np.mean([p["tau"] for p in pairs.values()])), 4)
        measured.append(position)
        for pair, values in pairs.items():
            for key, value in values.items():
                per_pair.setdefault(pair, {}).setdefault(key, []).append(value)
    least = min(flagged, max(1, len(measured) // 10))
    for position in sorted(measured, key=lambda p: records[p]["agreement_tau"])[:least]:
        records[position]["disagree"] = True
    return {
        "documents": len(measured),
        "pairs": {
            pair: {
                key: {"mean": round(float(np.mean(v)), 4), "std": round(float(np.std(v)), 4)}
                for key, v in values.items()
            }
            for pair, values in per_pair.items()
        },
    }
