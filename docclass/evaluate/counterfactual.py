"""A counterfactual per document: few top-ranked words whose removal flips the label.

The words are taken in the order a method ranks them (the report's default method) and removed
as in the faithfulness measures (masked out: the model never sees them, every other token keeps
its position). The number removed is searched by doubling (the top 1, 2, 4, … words, up to
``max_fraction`` of the words read) and then halving between the last count that left the
label and the first that changed it, so a document costs a dozen forward passes, not one per
word: through a pre-trained encoder a pass costs as much as a whole from-scratch report page.
Where the faithfulness measure has run copies of the same ranking (the report: the top
``ceil(f·n)`` words removed for each fraction ``f``), those under the limit take the doubling's
place. The result is ``k`` words whose removal changes the predicted class while removing the
top ``k - 1`` does not; it is the fewest such ``k`` whenever removing more top words never
brings the label back (with the faithfulness counts, fewer small counts are tried). No change
at any count tried says the decision does not rest on a few words.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from docclass.data.tokenizer import unknown_id
from docclass.evaluate.erasure import Copies, keep_distributions, rank_words
from docclass.interpret.inputs import document_inputs, float32_classifier

MAX_FRACTION = 0.2


def search_limit(n_words: int, max_fraction: float = MAX_FRACTION) -> int:
    """The most top words the search removes from a document of ``n_words``: at least one."""
    return max(1, math.floor(max_fraction * n_words))


def doubling_counts(limit: int) -> list[int]:
    """1, 2, 4, … below ``limit``, then ``limit`` itself."""
    counts = [1 << i for i in range(max(1, limit).bit_length()) if 1 << i < limit]
    return [*counts, limit]


def fewest_flipping(
    removing: Callable[[list[int]], np.ndarray],
    limit: int,
    predicted: int,
    known: dict[int, np.ndarray] | None = None,
) -> tuple[int | None, dict[int, np.ndarray]]:
    """The fewest top words (at most ``limit``) whose removal changes the label ``predicted``,
    None when no count tried does, and every count tried with its distribution.
    ``removing(counts)`` gives the distributions with each count's top words removed;
    ``known`` holds counts whose distributions were already run (the report's faithfulness
    copies): they stand in for the doubling, so only the halving between them costs passes."""
    tried = {k: d for k, d in (known or {}).items() if 1 <= k <= limit}
    if tried:
        if not any(int(d.argmax()) != predicted for d in tried.values()) and limit not in tried:
            (tried[limit],) = removing([limit])
    else:
        # The first counts alone, then the rest: a label that falls with a word or two (the
        # most common case) costs two or three passes.
        doubling = doubling_counts(limit)
        for group in (doubling[:2], doubling[2:]):
            if not group:
                continue
            for k, distribution in zip(group, removing(group), strict=True):
                tried[k] = distribution
            if any(int(tried[k].argmax()) != predicted for k in group):
                break
    flips = [k for k in sorted(tried) if int(tried[k].argmax()) != predicted]
    if not flips:
        return None, tried
    high = flips[0]
    low = max((k for k in tried if k < high), default=0)
    while high - low > 1:  # every count tried below ``high`` kept the label
        middle = (low + high) // 2
        (distribution,) = removing([middle])
        tried[middle] = distribution
        if int(distribution.argmax()) != predicted:
            high = middle
        else:
            low = middle
    return high, tried


def document_counterfactual(
    classifier,
    text: str,
    record: dict,
    method: str,
    max_fraction: float = MAX_FRACTION,
    removal: str = "mask",
    device: str = "cpu",
    copies: Copies | None = None,
) -> dict[str, Any] | None:
    """``{"method", "k", "words", "indices", "label", "p", "tried", "counts"}`` for one
    explained document: ``k`` None when no count tried (``counts``, up to ``tried`` =
    ``max_fraction`` of its words) flips it. None for a document with nothing to rank.
    ``copies``: the document's copies already run (:func:`keep_distributions`); those that
    remove a count of this ranking's top words are read, not run again."""
    if record.get("error") or record["words_read"] < 2 or method not in record["scores"]:
        return None
    n_words = record["words_read"]
    ranking = rank_words(record["scores"][method][:n_words], zlib.crc32(text.encode("utf-8")))
    limit = search_limit(n_words, max_fraction)
    ids, token_words, predicted = document_inputs(classifier, text, record)
    unk = unknown_id(classifier.tokenizer)

    def without_top(k: int) -> np.ndarray:
        keep = np.ones(n_words, dtype=bool)
        keep[ranking[:k]] = False
        return keep

    def removing(counts: list[int]) -> np.ndarray:
        masks = [without_top(k) for k in counts]
        return keep_distributions(
            classifier.model, ids, token_words, masks, removal, device=device, unk_id=unk,
            copies=copies,
        )  # fmt: skip

    known = {}
    if copies:
        # A copy under this removal that removed exactly the top k words of this ranking
        # (the faithfulness measure ranks them the same way, ties broken by the same seed).
        rank_of = np.full(n_words, n_words, dtype=np.int64)
        rank_of[ranking] = np.arange(n_words)
        for (copy_removal, key), distribution in copies.items():
            removed = ~np.frombuffer(key, dtype=bool)
            k = int(removed.sum())
            if copy_removal == removal and len(removed) == n_words and 1 <= k <= limit:
                if rank_of[removed].max() == k - 1:
                    known[k] = distribution
    high, tried = fewest_flipping(removing, limit, predicted, known)
    result: dict[str, Any] = {"method": method, "k": None, "tried": limit, "counts": sorted(tried)}
    if high is None:
        return result
    label = int(tried[high].argmax())
    result.update(
        k=high,
        # Both most important first, pair for pair (indices were in position order and words
        # in rank order, so zipping them put each word at another's position).
        indices=[int(i) for i in ranking[:high]],
        words=[record["words"][i] for i in ranking[:high]],
        label=classifier.label_names[label],
        # The page shows it beside the record's calibrated probabilities: the copies' are raw.
        p=round(float(with_temperature(tried[high], classifier.temperature)[label]), 4),
        counts=sorted(tried),
    )
    return result


def with_temperature(distribution: np.ndarray, temperature: float) -> np.ndarray:
    """A softmax distribution as its logits divided by ``temperature`` would give it."""
    if temperature == 1.0:
        return distribution
    with np.errstate(divide="ignore"):  # a probability of 0 stays 0
        scaled = np.log(np.asarray(distribution, dtype=np.float64)) / temperature
    scaled = np.exp(scaled - scaled.max())
    return scaled / scaled.sum()


def add_counterfactuals(
    classifier,
    texts: Sequence[str],
    records: Sequence[dict],
    method: str,
    max_fraction: float = MAX_FRACTION,
    device: str = "cpu",
    positions: Sequence[int] | None = None,
    copies: dict[int, Copies] | None = None,
) -> dict[str, Any]:
    """Store each record's counterfactual under ``counterfactual`` (only the records at
    ``positions`` when given); return how often one exists (``documents`` tried, ``flipped``,
    their ``share``, and the median words removed). ``copies``: per record position, its
    perturbed copies already run through this model (see :func:`document_counterfactual`)."""
    classifier = float32_classifier(classifier)
    found = []
    tried = 0
    for position in range(len(records)) if positions is None else positions:
        record = records[position]
        # Each document's copies are read once, then freed.
        counterfactual = document_counterfactual(
            classifier, texts[position], record, method, max_fraction, device=device,
            copies=(copies or {}).pop(position, None),
        )  # fmt: skip
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
