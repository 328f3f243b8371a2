"""One macro-F1: over the classes in the split's labels or predictions, wherever it is computed."""

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score

from docclass.metrics import classification_scores
from docclass.train.lit_module import DocClassifierModule


def confusion(labels: list[int], predictions: list[int], classes: int) -> np.ndarray:
    matrix = np.zeros((classes, classes), dtype=int)
    np.add.at(matrix, (labels, predictions), 1)
    return matrix


def test_a_class_absent_from_labels_and_predictions_has_no_f1_and_no_weight():
    scores = classification_scores(confusion([0, 0, 1, 1], [0, 0, 1, 0], classes=3))
    # Class 0: 2 TP, 1 FP → 4/5; class 1: 1 TP, 1 FN → 2/3; class 2: never seen nor predicted.
    assert scores["per_class_f1"] == pytest.approx([4 / 5, 2 / 3, None])
    assert scores["macro_f1"] == pytest.approx((4 / 5 + 2 / 3) / 2)  # 0.733, not 0.489
    # Predicted but never true is present, and scores 0.
    predicted_only = classification_scores(confusion([0, 0, 1, 1], [0, 2, 1, 1], classes=3))
    assert predicted_only["per_class_f1"] == pytest.approx([2 / 3, 1.0, 0.0])
    assert predicted_only["macro_f1"] == pytest.approx((2 / 3 + 1.0) / 3)


CASES = {
    "absent class": ([0, 0, 1, 1], [0, 0, 1, 0], 3),
    "predicted only": ([0, 0, 1, 1], [0, 2, 1, 1], 3),
    "true only, never predicted": ([0, 1, 2, 2], [0, 1, 1, 1], 4),
    "every class": ([0, 1, 2, 0, 1, 2, 1], [0, 2, 2, 1, 1, 2, 1], 3),
}


@pytest.mark.parametrize("labels, predictions, classes", CASES.values(), ids=CASES.keys())
def test_the_logged_f1_and_the_svm_anchors_agree_with_metrics_json(labels, predictions, classes):
    """``val/f1`` and ``test/f1`` (the module's torchmetrics objects, fed batch by batch as in
    validation), scikit-learn's (the SVM anchor's) and ``metrics.json``'s are one number."""
    module = DocClassifierModule(
        vocab_size=50, num_classes=classes, d_model=16, n_heads=2, pool_heads=2
    )
    expected = classification_scores(confusion(labels, predictions, classes))["macro_f1"]
    for stage in ("val", "test"):
        metric = module.metrics[f"{stage}_f1"]
        half = len(labels) // 2
        for part in (slice(None, half), slice(half, None)):
            metric.update(torch.tensor(predictions[part]), torch.tensor(labels[part]))
        assert float(metric.compute()) == pytest.approx(expected)
    assert f1_score(labels, predictions, average="macro") == pytest.approx(expected)
