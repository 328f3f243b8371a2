"""Generated corpora whose right answer is known by construction.

The planted-keyword corpus: documents of random filler words in which exactly one planted
keyword decides the label, so a word-score method can be checked against the truth.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def planted_keyword_corpus(
    n_per_class: int = 200,
    keywords: Sequence[str] = ("zorblax", "quintessa", "vermilox"),
    words_per_document: tuple[int, int] = (20, 40),
    seed: int = 0,
) -> list[dict]:
    """Documents of random filler words in which exactly one planted keyword decides the label.

    Returns rows ``{"text", "label", "keyword_position"}`` (label = the keyword's class name),
    shuffled. Filler words are made of syllables that never form a keyword.
    """
    rng = random.Random(seed)
    filler = sorted({"".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(800)})
    filler = [word for word in filler if word not in keywords]
    rows = []
    for label, keyword in enumerate(keywords):
        for _ in range(n_per_class):
            words = rng.choices(filler, k=rng.randint(*words_per_document))
            position = rng.randrange(len(words) + 1)
            words.insert(position, keyword)
            rows.append(
                {"text": " ".join(words), "label": keywords[label], "keyword_position": position}
            )
    rng.shuffle(rows)
    return rows


def eraser_rationales(rows: Sequence[dict], doc_ids: Sequence[str]) -> list[dict]:
    """The planted keyword of each row as an ERASER annotation (DeYoung et al. 2020): the
    human rationale of this corpus is known by construction. Token offsets count the text's
    whitespace-separated words, ``end_token`` exclusive, as ERASER's files do."""
    return [
        {
            "annotation_id": doc_id,
            "classification": row["label"],
            "evidences": [
                [
                    {
                        "docid": doc_id,
                        "start_token": row["keyword_position"],
                        "end_token": row["keyword_position"] + 1,
                        "start_sentence": -1,
                        "end_sentence": -1,
                        "text": row["label"],
                    }
                ]
            ],
            "query": "Which word decides the label?",
            "query_type": None,
        }
        for row, doc_id in zip(rows, doc_ids, strict=True)
    ]
