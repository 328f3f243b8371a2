"""A counterfactual per document: the fewest top-ranked words whose removal flips the label.

The words are taken in the order a method ranks them (the report's default method), one more
at a time, and removed as in the faithfulness measures (masked out: the model never sees them,
every other token keeps its position). The first k whose removal changes the predicted class
is the counterfactual; none within ``max_fraction`` of the words read says the decision does
not rest on a few words.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from docclass.data.tokenizer import unknown_id
from docclass.evaluate.erasure import keep_distributions, rank_words
from docclass.interpret.inputs import document_inputs, float32_classifier

MAX_FRACTION = 0.2
# Removal counts tried per batch: most flips that exist come within the first few words, so
# small batches first save the long tail of a document that never flips.
FIRST_BATCH = 8


def document_counterfactual(
    classifier,
    text: str,
    record: dict,
    method: str,
    max_fraction: float = MAX_FRACTION,
    removal: str = "mask",
    device: str = "cpu",
) -> dict[str, Any] | None:
    """``{"method", "k", "words", "indices", "label", "p", "tried"}`` for one explained
    document (``k`` None when no removal of up to ``max_fraction`` of its words flips it); None
    for a document with nothing to rank."""
    if record.get("error") or record["words_read"] < 2 or method not in record["scores"]:
        return None
    n_words = record["words_read"]
    ranking = rank_words(record["scores"][method][:n_words], zlib.crc32(text.encode("utf-8")))
    limit = max(1, math.floor(max_fraction * n_words))
    ids, token_words, predicted = document_inputs(classifier, text, record)
    result: dict[str, Any] = {"method": method, "k": None, "tried": limit}
    start, size = 1, FIRST_BATCH
    while start <= limit:
        counts = list(range(start, min(limit, start + size - 1) + 1))
        masks = []
        for k in counts:
            keep = np.ones(n_words, dtype=bool)
            keep[ranking[:k]] = False
            masks.append(keep)
        distributions = keep_distributions(
            classifier.model, ids, token_words, masks, removal, device=device,
            unk_id=unknown_id(classifier.tokenizer),
        )  # fmt: skip
        for k, distribution in zip(counts, distributions, strict=True):
            label = int(distribution.argmax())
            if label != predicted:
                removed = sorted(ranking[:k])
                result.update(
                    k=k,
                    indices=removed,
                    words=[record["words"][i] for i in ranking[:k]],
                    label=classifier.label_names[label],
                    p=round(float(distribution[label]), 4),
                )
                return result
        start, size = counts[-1] + 1, size * 2
    return result


def add_counterfactuals(
    classifier,
    texts: Sequence[str],
    records: Sequence[dict],
    method: str,
    max_fraction: float = MAX_FRACTION,
    device: str = "cpu",
) -> dict[str, Any]:
    """Store each record's counterfactual under ``counterfactual``; return how often one exists
    (``documents`` tried, ``flipped``, their ``share``, and the median words removed)."""
    classifier = float32_classifier(classifier)
    found = []
    tried = 0
    for text, record in zip(texts, records, strict=True):
        counterfactual = document_counterfactual(
            classifier, text, record, method, max_fraction, device=device
        )
        if counterfactual is None:
            continue
        record["counterfactual"] = counterfactual
        tried += 1
        if counterfactual["k"] is not None:
            found.append(counterfactual["k"])
    return {
        "method": method,
        "max_fraction": max_fraction,
        "documents": tried,
        "flipped": len(found),
        "share": len(found) / tried if tried else None,
        "median_words": float(np.median(found)) if found else None,
    }
