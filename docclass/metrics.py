"""Classification scores from a confusion matrix (numpy only), shared by the training run's
``metrics.json`` and the report's headline, so the two always agree.

There is one macro-F1: the mean F1 over the classes present in the split, in its labels or its
predictions. A class with neither has no F1 (0/0); counting it as 0 would lower the score for
a class the split never asked about. torchmetrics' ``MulticlassF1Score(average="macro")``, which
the training run logs as ``val/f1`` and ``test/f1``, and scikit-learn's ``f1_score`` (the
SVM anchor's) average over the same classes (``tests/test_metrics.py`` holds them to it).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def classification_scores(matrix: np.ndarray) -> dict[str, Any]:
    """Accuracy, macro-F1 and per-class F1 from a confusion matrix.

    Rows are true labels, columns predictions. ``per_class_f1`` holds None for a class with no
    documents and no predictions in the split; ``macro_f1`` is the mean of the others (0 when
    there are no documents at all, as is ``accuracy``).
    """
    true_positive = np.diag(matrix).astype(float)
    predicted = matrix.sum(axis=0)
    actual = matrix.sum(axis=1)
    denominator = predicted + actual
    present = denominator > 0
    f1 = np.divide(2 * true_positive, denominator, out=np.zeros_like(true_positive), where=present)
    return {
        "accuracy": float(true_positive.sum() / max(1, matrix.sum())),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "per_class_f1": [float(v) if p else None for v, p in zip(f1, present, strict=True)],
        "n_documents": int(matrix.sum()),
    }
