"""Reference accuracies on docclass's own split, so its figures have something to stand beside.

A TF-IDF + linear SVM (scikit-learn, the ``bench`` extra) is trained on the same de-duplicated
train split the attention model sees and scored on the same validation and test documents.
"""

from __future__ import annotations

import time

from docclass.train.datamodule import DocDataModule


def tfidf_svm_anchor(datamodule: DocDataModule) -> dict[str, float]:
    """Fit word 1–2-gram TF-IDF (sublinear tf, min_df 2) + LinearSVC on the train split."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics import f1_score
    from sklearn.svm import LinearSVC

    datamodule.prepare()
    train, val, test = (datamodule.splits[s] for s in ("train", "val", "test"))
    started = time.perf_counter()
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)
    classifier = LinearSVC().fit(vectorizer.fit_transform(train["text"]), train["label"])
    fit_seconds = time.perf_counter() - started

    def predict(split):
        return classifier.predict(vectorizer.transform(split["text"]))

    started = time.perf_counter()
    test_predictions = predict(test)
    test_seconds = time.perf_counter() - started
    return {
        "val_acc": float((predict(val) == val["label"]).mean()),
        "test_acc": float((test_predictions == test["label"]).mean()),
        "test_macro_f1": float(f1_score(test["label"], test_predictions, average="macro")),
        "fit_s": fit_seconds,
        "test_documents": len(test),
        "test_documents_per_s": len(test) / test_seconds,
    }
