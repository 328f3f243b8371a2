"""Generated corpora whose right answer is known by construction.

The planted-keyword corpus: documents of random filler words in which exactly one planted
keyword decides the label, so a word-score method can be checked against the truth.

The intent corpus: short requests (about 8 words) in many classes with long names, shaped like
intent-detection corpora (CLINC150, BANKING77), for measuring reports with many classes.
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


# The intent corpus's words. A class is named topic_action[_qualifier...]; its signature words
# are its name's words and two details, and classes that share a topic, action, qualifier or
# detail overlap, so a model errs on requests that carry only shared words.
INTENT_TOPICS = (
    "card", "account", "transfer", "payment", "flight", "hotel", "booking", "car", "insurance",
    "loan", "pin", "password", "order", "refund", "delivery", "meeting", "alarm", "timer",
    "music", "weather", "recipe", "reminder", "calendar", "bill", "tax", "balance", "phone",
    "subscription", "mortgage", "luggage",
)  # fmt: skip
INTENT_ACTIONS = (
    "declined", "lost", "cancel", "change", "status", "limit", "activate", "freeze", "reset",
    "track", "dispute", "renew", "upgrade", "schedule", "confirm", "report", "request", "delay",
    "verify", "replace", "split", "pause", "compare", "extend", "refuse", "charge", "exchange",
    "expire", "transfer", "unlock",
)  # fmt: skip
INTENT_QUALIFIERS = (
    "abroad", "international", "payment", "pending", "recurring", "online", "contactless",
    "business", "joint", "virtual", "premium", "domestic", "overnight", "weekly", "family",
    "student", "foreign", "currency", "automatic", "express", "partial", "duplicate",
    "emergency", "travel",
)  # fmt: skip
INTENT_DETAILS = (
    "yesterday", "shop", "machine", "app", "website", "email", "branch", "statement", "fee",
    "code", "number", "receipt", "address", "station", "airport", "room", "driver", "ticket",
    "seat", "gate", "policy", "claim", "rate", "interest", "deposit", "salary", "invoice",
    "parcel", "courier", "tracking", "colleague", "office", "morning", "evening", "kitchen",
    "song", "playlist", "speaker", "forecast", "rain", "umbrella", "dinner", "oven", "birthday",
    "doctor", "dentist", "appointment", "contract", "form", "document", "signature", "photo",
    "screen", "battery", "charger", "network", "signal", "wallet", "cash", "coins", "cheque",
    "merchant", "restaurant", "taxi", "train", "bus", "suitcase", "passport", "visa", "border",
    "customs", "holiday", "weekend", "discount", "voucher", "points", "reward", "plan", "quote",
    "premium", "renewal", "deadline", "penalty", "overdraft", "savings", "pension", "landlord",
    "rent", "utility", "meter", "password", "login", "security", "fraud", "stolen", "broken",
)  # fmt: skip
# A request opens with one of these and carries its signature words among connecting words.
INTENT_OPENERS = (
    "can you help me with", "i need to", "how do i", "why was my", "please", "what is the",
    "i want to", "could you tell me about", "hi i would like to", "is there a way to",
    "help", "sorry but my", "tell me how to", "i have a problem with the", "when will my",
)  # fmt: skip
INTENT_CONNECTORS = (
    "my", "the", "for", "on", "again", "today", "now", "a", "with", "it", "this", "still",
    "last", "week", "our", "of", "in", "at", "from", "quickly", "urgent", "thanks", "please",
)  # fmt: skip


def intent_class_names(n_classes: int, rng: random.Random, longest: int = 40) -> list[str]:
    """``n_classes`` distinct names ``topic_action``; one in five grows qualifiers and a detail
    up to ``longest`` characters (``card_declined_abroad_international_fee``)."""
    pairs = [(t, a) for t in INTENT_TOPICS for a in INTENT_ACTIONS if t != a]
    if n_classes > len(pairs):
        raise ValueError(f"at most {len(pairs)} intent classes, asked for {n_classes}")
    names = []
    for topic, action in rng.sample(pairs, n_classes):
        name = f"{topic}_{action}"
        if rng.random() < 0.2:
            extra = rng.sample(INTENT_QUALIFIERS, 3) + [rng.choice(INTENT_DETAILS)]
            for word in extra:
                if len(name) + 1 + len(word) <= longest and word not in name.split("_"):
                    name = f"{name}_{word}"
        elif rng.random() < 0.4:
            name = f"{name}_{rng.choice(INTENT_QUALIFIERS)}"
        names.append(name)
    return names


def intent_corpus(
    n_classes: int = 150,
    n_per_class: int = 120,
    words_per_document: tuple[int, int] = (5, 11),
    seed: int = 0,
) -> list[dict]:
    """Short requests in many intent classes, like CLINC150: realistic in size and difficulty,
    for measuring what a report of many classes costs.

    Each class (named ``topic_action[_qualifier...]``, up to 40 characters) has signature words:
    its name's words (drawn twice as often) and two details. A request holds one to three of
    them after an opening (``can you help me with``) among connecting words. Topics, actions and
    details recur across classes, so requests carrying only shared words are ambiguous and a
    trained model errs on some of them: well above chance, well below 100 %.

    Returns:
        Rows ``{"text", "label"}``, every text distinct, shuffled; deterministic given ``seed``.
    """
    if words_per_document[0] < 4:
        raise ValueError("intent requests need at least 4 words: 3 signature words and 'please'")
    rng = random.Random(seed)
    names = intent_class_names(n_classes, rng)
    signatures = [name.split("_") * 2 + rng.sample(INTENT_DETAILS, 2) for name in names]
    openers = [opener.split() for opener in INTENT_OPENERS]
    rows, seen = [], set()
    for name, signature in zip(names, signatures, strict=True):
        made = 0
        while made < n_per_class:
            length = rng.randint(*words_per_document)
            # Distinct keys: a name's words are in the signature twice.
            keys = list(dict.fromkeys(rng.sample(signature, rng.choice((1, 2, 3, 3)))))
            opener = rng.choice([o for o in openers if len(o) <= length - len(keys)])
            words = rng.choices(INTENT_CONNECTORS, k=length - len(keys) - len(opener))
            for key in keys:
                words.insert(rng.randrange(len(words) + 1), key)
            words = opener + words
            text = " ".join(words)
            if text not in seen:
                seen.add(text)
                rows.append({"text": text, "label": name})
                made += 1
    rng.shuffle(rows)
    return rows
