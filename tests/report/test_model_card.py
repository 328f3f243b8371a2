"""The model card's scores: a class the test split never saw gets no F1, not a 0."""

import re

import numpy as np

from docclass.metrics import classification_scores
from docclass.report.model_card import _faithfulness_section, _scores_section


def test_a_class_with_no_test_documents_is_said_to_have_none():
    # "sport" is neither true nor predicted for any test document.
    test = classification_scores(np.array([[2, 0, 0], [1, 1, 0], [0, 0, 0]]))
    card = "\n".join(_scores_section({"test": test, "labels": ["news", "tech", "sport"]}))
    assert "| news | 0.800 |" in card and "| tech | 0.667 |" in card
    assert "| sport | no documents |" in card
    assert "macro-F1 **0.7333**" in card


def _faithfulness_table(random_comprehensiveness: float) -> str:
    methods = {
        "random": {"comprehensiveness": random_comprehensiveness, "sufficiency": 0.1},
        "conservative": {"comprehensiveness": 0.006, "sufficiency": 0.05},
    }
    facts = {"faithfulness": {"report": {"methods": methods, "documents": 20}}}
    return "\n".join(_faithfulness_section(facts))


def test_the_cards_times_random_is_blank_where_random_removes_almost_nothing():
    # Random's 0.00003 made conservative propagation's 0.006 read "210.4" times random, where
    # the report's own table says "—"; a negative floor gave -400000.
    for floor in (0.00003, -0.000015):
        card = _faithfulness_table(floor)
        assert "| conservative propagation | 0.006 | — | 0.050 |" in card
        assert f"| random | {floor:.3f} |  | 0.100 |" in card
    card = _faithfulness_table(0.002)
    assert "| conservative propagation | 0.006 | 3.0× | 0.050 |" in card
    assert "| random | 0.002 |  | 0.100 |" in card


def test_a_carriage_return_in_a_class_name_starts_no_markdown_line():
    # Markdown ends a line at a lone carriage return too: "sport\r# Approved…" made a heading.
    test = classification_scores(np.array([[2, 0], [1, 1]]))
    names = ["news", "sport\r# Approved by the regulator\r\n- and a list"]
    card = "\n".join(_scores_section({"test": test, "labels": names}))
    lines = re.split(r"\r\n?|\n", card)
    assert not any(line.startswith(("# Approved", "- and")) for line in lines)
    assert any("sport # Approved by the regulator - and a list" in line for line in lines)
