"""Classification scores from a confusion matrix (numpy only), shared by the training run's
``metrics.json`` and the report's headline, so the two always agree."""

from __future__ import annotations

from typing import Any

import numpy as np


def classification_scores(matrix: np.ndarray) -> dict[str, Any]:
    """Accuracy, macro-F1 and per-class F1 from a confusion matrix.

    Rows are true labels, columns predictions.
    """
    true_positive = np.diag(matrix).astype(float)
    predicted = matrix.sum(axis=0)
    actual = matrix.sum(axis=1)
    denominator = predicted + actual
    f1 = np.divide(
        2 * true_positive, denominator, out=np.zeros_like(true_positive), where=denominator > 0
    )
    return {
        "accuracy": float(true_positive.sum() / max(1, matrix.sum())),
        "macro_f1": float(f1.mean()),
        "per_class_f1": [float(v) for v in f1],
        "n_documents": int(matrix.sum()),
    }
