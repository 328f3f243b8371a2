"""The corpus's words as the model weighs them: per class, per confused pair, per error.

Computed from explanation records alone. Every list adds up one signed word score per
occurrence over the documents considered and ranks words by the **mean per occurrence**, among
words found in a few documents at least; the total and the document count are shown beside it.
Ranking by the total instead lists "to", "the", "of" first: with a self-attention block below
the pool, every token state carries some of the document's topic, so frequent words pile up a
large total from small shares. A word's score toward a class is its contribution to that class
minus its mean contribution to all classes (softmax ignores what a word adds to every logit
alike). The contrast of two classes uses ``contribution(a) − contribution(b)``, which is exact:
the difference of two logits is linear in the token states after the pool.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from docclass.report.summaries import word_key

# Documents listed under a word when a reader opens it.
DOCUMENTS_PER_WORD = 5
# A word counts as a class's evidence when it weighs in this many of the class's documents, or
# in FEW_DOCUMENTS_THRESHOLD where the class has fewer than FEW_DOCUMENTS: a test split of short
# requests often holds two or three documents a class, where no word reaches three.
MIN_DOCUMENTS = 3
FEW_DOCUMENTS = 10
FEW_DOCUMENTS_THRESHOLD = 2


def evidence_threshold(documents: int) -> int:
    """Documents a word must weigh in to be listed, for a class (or pair) of ``documents``."""
    return MIN_DOCUMENTS if documents >= FEW_DOCUMENTS else FEW_DOCUMENTS_THRESHOLD


def is_word(word: str) -> bool:
    # Punctuation marks are words to the tokenizer; a reader looks for words.
    return any(ch.isalnum() for ch in word)


def _tally(
    records: Sequence[dict],
    chosen: Sequence[int],
    word_scores: Callable[[dict], Sequence[float] | None],
    k: int,
    min_documents: int,
    hrefs: Sequence[str],
    per_word: int = DOCUMENTS_PER_WORD,
) -> list[dict[str, Any]]:
    """The ``k`` words with the largest mean score per occurrence over the chosen records
    (among words in ``min_documents`` documents or more), each with its total, how many
    documents hold it and the documents where it weighed most."""
    total: dict[str, float] = defaultdict(float)
    occurrences: dict[str, int] = defaultdict(int)
    per_document: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for number in chosen:
        record = records[number]
        scores = word_scores(record)
        if scores is None:
            continue
        read = record["words_read"]
        for word, score in zip(record["words"][:read], scores[:read], strict=True):
            if score is None or not is_word(word):
                continue
            key = word_key(word)
            total[key] += score
            occurrences[key] += 1
            per_document[key][number] += score
    rows = [
        {
            "word": key,
            "mean": total[key] / occurrences[key],
            "total": total[key],
            "documents": len(per_document[key]),
            "top_documents": [
                {"id": str(records[n]["id"]), "href": hrefs[n], "score": score, "position": n}
                for n, score in sorted(per_document[key].items(), key=lambda kv: -kv[1])[:per_word]
            ],
        }
        for key in total
        if len(per_document[key]) >= min_documents and total[key] > 0
    ]
    rows.sort(key=lambda row: (-row["mean"], row["word"]))
    return rows[:k]


def _class_scores(record: dict, name: str, method: str) -> Sequence[float] | None:
    """Scores toward class ``name``: with every class's contributions, the word's contribution
    to ``name`` minus its mean contribution to all classes (softmax ignores what a word adds
    to every logit alike: "the" adds much to each, and decides nothing); else the method's own
    scores when ``name`` is the prediction."""
    contributions = record.get("contributions", {})
    if method == "contribution" and name in contributions:
        # Over every class, not only the ones the record keeps: explain_documents stores it.
        mean = record["contribution_mean"]
        return [own - average for own, average in zip(contributions[name], mean, strict=True)]
    if record.get("predicted") == name:
        return record.get("scores", {}).get(method)
    return None


def class_lexicon(
    records: Sequence[dict],
    label_names: Sequence[str],
    hrefs: Sequence[str],
    method: str = "contribution",
    k: int = 12,
    per_word: int = DOCUMENTS_PER_WORD,
) -> dict[str, dict[str, Any]]:
    """Per class predicted at least once: over the documents predicted as that class, the words
    with the largest mean ``method`` score toward it (signed methods: only what pushed toward
    the class counts), among words in :func:`evidence_threshold` documents. Each class gives
    ``rows``, ``documents``, ``min_documents`` and, when it has no rows, the ``reason``."""
    lexicon = {}
    for name in label_names:
        chosen = [i for i, r in enumerate(records) if r.get("predicted") == name]
        if not chosen:
            continue
        threshold = evidence_threshold(len(chosen))
        rows = _tally(
            records,
            chosen,
            lambda r, n=name: _class_scores(r, n, method),
            k,
            threshold,
            hrefs,
            per_word,
        )
        reason = None
        if len(chosen) < threshold:
            reason = (
                f"only {len(chosen)} document is predicted as this class; a word needs "
                f"{threshold} to count as evidence"
            )
        elif not rows:
            reason = (
                f"no word pushed toward this class in {threshold} of its {len(chosen)} documents"
            )
        lexicon[name] = {
            "rows": rows,
            "documents": len(chosen),
            "min_documents": threshold,
            "reason": reason,
        }
    return lexicon


def class_difference(record: dict, a: str, b: str) -> list[float] | None:
    contributions = record.get("contributions", {})
    if a not in contributions or b not in contributions:
        return None
    return [x - y for x, y in zip(contributions[a], contributions[b], strict=True)]


def confused_pairs(
    records: Sequence[dict], label_names: Sequence[str], n_pairs: int = 3
) -> list[tuple[str, str, int]]:
    """The class pairs the model mixes up most (errors in both directions), most first."""
    count: dict[tuple[str, str], int] = defaultdict(int)
    for record in records:
        true, predicted = record.get("label"), record.get("predicted")
        if true in label_names and predicted in label_names and true != predicted:
            count[tuple(sorted((true, predicted)))] += 1  # type: ignore[index]
    ranked = sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(a, b, n) for (a, b), n in ranked[:n_pairs]]


def contrastive_lexicon(
    records: Sequence[dict],
    label_names: Sequence[str],
    hrefs: Sequence[str],
    k: int = 10,
    n_pairs: int = 3,
) -> list[dict[str, Any]]:
    """For the most confused pairs (a, b): over the documents labelled or predicted as either,
    the words that pushed toward a rather than b, and toward b rather than a (among the
    documents that keep both classes' contributions)."""
    pairs = []
    for a, b, errors in confused_pairs(records, label_names, n_pairs):
        chosen = [
            i
            for i, r in enumerate(records)
            if {r.get("label"), r.get("predicted")} & {a, b}
            and r.get("predicted") is not None
            and {a, b} <= set(r.get("contributions", {}))
        ]
        min_documents = evidence_threshold(len(chosen))
        pairs.append(
            {
                "a": a,
                "b": b,
                "errors": errors,
                "documents": len(chosen),
                "min_documents": min_documents,
                "toward_a": _tally(
                    records, chosen, lambda r, a=a, b=b: class_difference(r, a, b), k,
                    min_documents, hrefs,
                ),
                "toward_b": _tally(
                    records, chosen, lambda r, a=a, b=b: class_difference(r, b, a), k,
                    min_documents, hrefs,
                ),
            }
        )  # fmt: skip
    return pairs


def confusion_cells(
    records: Sequence[dict], label_names: Sequence[str], hrefs: Sequence[str], k: int = 5
) -> list[dict[str, Any]]:
    """Every off-diagonal cell of the confusion matrix: its documents, each with the words that
    pushed it toward the wrong label rather than the true one (largest first)."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for number, record in enumerate(records):
        true, predicted = record.get("label"), record.get("predicted")
        if true not in label_names or predicted not in label_names or true == predicted:
            continue
        difference = class_difference(record, predicted, true)
        words: list[dict[str, Any]] = []
        if difference is not None:
            read = record["words_read"]
            ranked = sorted(range(read), key=lambda i: -difference[i])
            seen: set[str] = set()
            for i in ranked:
                word = record["words"][i]
                # Each word once, at its strongest: "internet" three times filled the list.
                if difference[i] > 0 and is_word(word) and word.casefold() not in seen:
                    seen.add(word.casefold())
                    words.append({"word": word, "score": difference[i]})
            words = words[:k]
        cells[(true, predicted)].append(
            {
                "id": str(record["id"]),
                "href": hrefs[number],
                "p": record["probs"][predicted],
                "words": words,
            }
        )
    order = {name: i for i, name in enumerate(label_names)}
    return [
        {"true": true, "predicted": predicted, "documents": docs}
        for (true, predicted), docs in sorted(
            cells.items(), key=lambda kv: (-len(kv[1]), order[kv[0][0]], order[kv[0][1]])
        )
    ]
