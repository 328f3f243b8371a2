"""The counterfactual search: doubling the words removed, then halving, against a stand-in model
whose label is known for every count."""

import numpy as np
import pytest
from helpers import LABELS

from docclass.evaluate import counterfactual
from docclass.evaluate.counterfactual import document_counterfactual, doubling_counts


class Classifier:
    label_names = LABELS
    tokenizer = None
    model = None
    temperature = 1.0  # uncalibrated: a counterfactual's p is the copy's softmax


@pytest.fixture()
def flips_when(monkeypatch):
    """Install a stand-in model: removing k top words predicts class 1 when ``flips(k)``."""
    asked: list[int] = []

    def install(flips):
        def distributions(model, ids, token_words, masks, removal, **_):
            rows = []
            for keep in masks:
                k = int((~keep).sum())
                asked.append(k)
                rows.append([0.2, 0.7, 0.1] if flips(k) else [0.8, 0.1, 0.1])
            return np.array(rows)

        monkeypatch.setattr(counterfactual, "keep_distributions", distributions)
        monkeypatch.setattr(counterfactual, "unknown_id", lambda tokenizer: 1)
        monkeypatch.setattr(
            counterfactual, "document_inputs", lambda classifier, text, record: (None, None, 0)
        )
        return asked

    return install


RECORD = {"words_read": 100, "words": [f"w{i}" for i in range(100)],
          "scores": {"contribution": list(np.linspace(1, 0, 100))}}  # fmt: skip


def test_doubling_then_halving_finds_the_count_where_the_label_changes(flips_when):
    asked = flips_when(lambda k: k >= 5)
    found = document_counterfactual(Classifier(), "text", RECORD, "contribution")
    assert found["k"] == 5 and found["label"] == "sport" and found["p"] == 0.7
    assert found["words"] == ["w0", "w1", "w2", "w3", "w4"]  # the five best-scored words
    # 1, 2 first; then 4, 8, 16, 20 (20 % of 100 words); then 6 and 5 between 4 and 8.
    assert asked == [1, 2, 4, 8, 16, 20, 6, 5] and found["counts"] == [1, 2, 4, 5, 6, 8, 16, 20]


def test_a_first_word_that_flips_costs_two_passes(flips_when):
    asked = flips_when(lambda k: True)
    assert document_counterfactual(Classifier(), "text", RECORD, "contribution")["k"] == 1
    assert asked == [1, 2]


def test_no_count_tried_flips_the_label(flips_when):
    asked = flips_when(lambda k: False)
    found = document_counterfactual(Classifier(), "text", RECORD, "contribution")
    assert found["k"] is None and found["tried"] == 20 and asked == [1, 2, 4, 8, 16, 20]


def test_copies_already_run_stand_in_for_the_doubling(flips_when):
    """Counts whose copies the faithfulness measure ran cost nothing; only the halving between
    the last that kept the label and the first that changed it runs (here 7, then 5)."""
    from docclass.evaluate.counterfactual import fewest_flipping

    asked = flips_when(lambda k: k >= 5)
    kept, flipped = np.array([0.8, 0.1, 0.1]), np.array([0.2, 0.7, 0.1])

    def removing(counts):
        asked.extend(counts)
        return np.array([flipped if k >= 5 else kept for k in counts])

    known = {1: kept, 4: kept, 10: flipped, 20: flipped, 30: flipped}
    k, tried = fewest_flipping(removing, 20, 0, known)
    assert k == 5 and asked == [7, 5]
    assert sorted(tried) == [1, 4, 5, 7, 10, 20]  # 30 is beyond the limit: not a count tried
    asked.clear()
    # None of the known counts flips: the limit itself is tried once, not the doubling.
    assert fewest_flipping(removing, 4, 0, {1: kept, 2: kept})[0] is None and asked == [4]


def test_copies_of_another_removal_or_ranking_are_not_read(flips_when):
    """Copies run under masking are no answer for a search by [UNK]; a copy without words that
    are not the ranking's top k is no count of it: the search doubles as if it had none."""
    asked = flips_when(lambda k: k >= 5)
    keep = np.ones(100, dtype=bool)
    keep[:10] = False  # the top 10 of RECORD's ranking (its scores fall with the position)
    other = np.ones(100, dtype=bool)
    other[[0, 50]] = False  # two words, but not the top two
    flipped = np.array([0.2, 0.7, 0.1])
    copies = {("mask", keep.tobytes()): flipped, ("unk", other.tobytes()): flipped}
    found = document_counterfactual(
        Classifier(), "text", RECORD, "contribution", removal="unk", copies=copies
    )
    assert found["k"] == 5 and asked == [1, 2, 4, 8, 16, 20, 6, 5]
    asked.clear()
    found = document_counterfactual(
        Classifier(), "text", RECORD, "contribution", removal="mask", copies=copies
    )
    # Under masking the top-10 copy is read: halving from 10 alone, no doubling.
    assert found["k"] == 5 and asked == [5, 2, 3, 4] and 10 in found["counts"]


def test_counts_double_up_to_the_limit():
    assert doubling_counts(1) == [1] and doubling_counts(3) == [1, 2, 3]
    assert doubling_counts(96) == [1, 2, 4, 8, 16, 32, 64, 96]
