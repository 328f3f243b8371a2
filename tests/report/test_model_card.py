"""The model card's scores: a class the test split never saw gets no F1, not a 0."""

import numpy as np

from docclass.metrics import classification_scores
from docclass.report.model_card import _scores_section


def test_a_class_with_no_test_documents_is_said_to_have_none():
    # "sport" is neither true nor predicted for any test document.
    test = classification_scores(np.array([[2, 0, 0], [1, 1, 0], [0, 0, 0]]))
    card = "\n".join(_scores_section({"test": test, "labels": ["news", "tech", "sport"]}))
    assert "| news | 0.800 |" in card and "| tech | 0.667 |" in card
    assert "| sport | no documents |" in card
    assert "macro-F1 **0.7333**" in card
