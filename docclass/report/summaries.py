"""Corpus- and document-level summaries computed from explanation records alone.

Nothing here sees the model: every function takes the JSON records that
:func:`docclass.interpret.explain.explain_documents` writes, so a report can be rebuilt from a
JSONL file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

# Below this top-class probability a document is listed among the uncertain ones.
LOW_CONFIDENCE = 0.6
# A sentence ends at . ! ? (optionally followed by closing quotes or brackets) before
# whitespace, or at a line break.
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*(?=\s)|\n")


def confusion(records: Sequence[dict], label_names: list[str]) -> np.ndarray | None:
    """``[C,C]`` counts (true rows, predicted columns) over labelled records; None if none are."""
    index = {name: i for i, name in enumerate(label_names)}
    matrix = np.zeros((len(label_names), len(label_names)), dtype=np.int64)
    labelled = 0
    for record in records:
        if record.get("label") in index and record.get("predicted") in index:
            matrix[index[record["label"]], index[record["predicted"]]] += 1
            labelled += 1
    return matrix if labelled else None


def document_order(records: Sequence[dict]) -> list[int]:
    """Record indices for the index table: failures, then errors (most confident first), then
    the rest from least to most confident, so what needs a look comes first."""

    def key(i: int) -> tuple[int, float]:
        record = records[i]
        if record.get("predicted") is None:
            return (0, 0.0)
        confidence = record["probs"][record["predicted"]]
        wrong = record.get("label") is not None and record["label"] != record["predicted"]
        return (1, -confidence) if wrong else (2, confidence)

    return sorted(range(len(records)), key=key)


def word_key(word: str) -> str:
    """How a word is counted across documents: case-folded."""
    return word.casefold()


def normalised_entropy(weights: Sequence[float]) -> float:
    """Entropy of a weight distribution over words divided by log2(number of words), in [0, 1]."""
    if len(weights) < 2:
        return 0.0
    entropy = -sum(w * math.log2(w) for w in weights if w > 0)
    return min(1.0, max(0.0, entropy / math.log2(len(weights))))


def head_entropies(records: Sequence[dict], pool_heads: int) -> dict[str, list[float]]:
    """Normalised attention entropy of every pool head (and their mean) for every document."""
    names = ["attention", *(f"attention_head{h}" for h in range(pool_heads))]
    result: dict[str, list[float]] = {name: [] for name in names}
    for record in records:
        scores = record.get("scores", {})
        read = record.get("words_read", 0)
        for name in names:
            if name in scores and read:
                result[name].append(normalised_entropy(scores[name][:read]))
    return result


def sentences(record: dict) -> list[tuple[int, int]]:
    """Word-index ranges ``[first, end)`` of the document's sentences.

    A rule-based split (sentence punctuation before a space, or a line break): good enough to
    sum scores by sentence, and it never drops or reorders a word.
    """
    spans = record["spans"]
    if not spans:
        return []
    ends = sorted({match.end() for match in _SENTENCE_END.finditer(record["text"])})
    ranges, first, cursor = [], 0, 0
    for w, (start, _end) in enumerate(spans):
        # Start a new sentence at the first word that begins after a sentence end.
        while cursor < len(ends) and ends[cursor] <= start:
            if w > first:
                ranges.append((first, w))
                first = w
            cursor += 1
    ranges.append((first, len(spans)))
    return ranges


def pool_heads_of(records: Sequence[dict]) -> int:
    """How many pool heads the records carry scores for."""
    for record in records:
        heads = [name for name in record.get("scores", {}) if name.startswith("attention_head")]
        if heads:
            return len(heads)
    return 0


def times_random(value: float, floor: float) -> str:
    """A method's comprehensiveness as a multiple of random's, or "—" where random's is at
    most 0.001: a ratio to a floor that small (or negative) is noise, 210× or −400,000×."""
    return f"{value / floor:.1f}×" if floor > 1e-3 else "—"
