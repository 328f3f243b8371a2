"""The generated corpora: deterministic, the promised shape, and as hard as they claim."""

from collections import Counter

import pytest

from docclass.data.synthetic import intent_corpus


def test_intent_corpus_is_deterministic_given_its_seed():
    assert intent_corpus(n_classes=20, n_per_class=5) == intent_corpus(n_classes=20, n_per_class=5)
    assert intent_corpus(n_classes=20, n_per_class=5) != intent_corpus(
        n_classes=20, n_per_class=5, seed=1
    )


def test_intent_corpus_has_every_class_its_share_of_short_distinct_requests():
    rows = intent_corpus(n_classes=150, n_per_class=12, words_per_document=(5, 11))
    counts = Counter(row["label"] for row in rows)
    assert len(counts) == 150 and set(counts.values()) == {12}
    assert len({row["text"] for row in rows}) == len(rows)
    lengths = [len(row["text"].split()) for row in rows]
    assert min(lengths) == 5 and max(lengths) == 11
    assert 7 <= sum(lengths) / len(lengths) <= 9  # about 8 words, like intent corpora


def test_intent_class_names_are_realistic_some_long():
    names = {row["label"] for row in intent_corpus(n_classes=150, n_per_class=1)}
    assert all(name.count("_") >= 1 and len(name) <= 40 for name in names)
    assert sum(len(name) > 30 for name in names) >= 10  # the report's long-label handling
    assert sum(len(name) <= 15 for name in names) >= 30


def test_intent_requests_need_room_for_their_signature_words():
    with pytest.raises(ValueError, match="at least 4 words"):
        intent_corpus(n_classes=2, n_per_class=1, words_per_document=(3, 5))


def test_intent_corpus_is_learnable_but_not_trivially():
    svm = pytest.importorskip("sklearn.svm")
    text = pytest.importorskip("sklearn.feature_extraction.text")
    rows = intent_corpus(n_classes=150, n_per_class=60)
    train, test = rows[:7500], rows[7500:]
    vectorizer = text.CountVectorizer()
    model = svm.LinearSVC().fit(
        vectorizer.fit_transform([r["text"] for r in train]), [r["label"] for r in train]
    )
    accuracy = model.score(
        vectorizer.transform([r["text"] for r in test]), [r["label"] for r in test]
    )
    assert 0.5 < accuracy < 0.95, accuracy  # chance is 1/150
