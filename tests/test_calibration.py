"""Temperature scaling and the calibration scores, against references computed another way."""

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss
from torchmetrics.functional.classification import multiclass_calibration_error

from docclass.calibration import (
    ECE_BINS,
    TEMPERATURE_RANGE,
    accepted_at,
    calibration_scores,
    ece_if_calibrated,
    fit_temperature,
    least_documents,
    precision_threshold,
    reliability_bins,
    risk_coverage,
    scaled_probabilities,
)


def miscalibrated(n: int, classes: int, true_temperature: float, seed: int = 0):
    """Logits whose labels are drawn from softmax(logits / true_temperature): a model that
    reports ``logits`` is miscalibrated by exactly that temperature."""
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(n, classes, generator=generator, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(logits / true_temperature, -1), 1, generator=generator)
    return logits, labels.squeeze(1)


@pytest.mark.parametrize("true_temperature", [0.5, 2.5])
def test_the_fitted_temperature_recovers_the_one_the_labels_were_drawn_with(true_temperature):
    logits, labels = miscalibrated(20_000, 5, true_temperature)
    assert fit_temperature(logits, labels) == pytest.approx(true_temperature, rel=0.05)


def test_the_fitted_temperature_is_the_likelihood_maximum_a_grid_search_finds():
    logits, labels = miscalibrated(2_000, 4, 1.7, seed=1)
    grid = np.exp(np.linspace(np.log(0.2), np.log(8), 4_001))
    nll = [torch.nn.functional.cross_entropy(logits / float(t), labels).item() for t in grid]
    assert fit_temperature(logits, labels) == pytest.approx(grid[int(np.argmin(nll))], rel=2e-3)


def test_a_split_the_model_gets_entirely_right_has_no_temperature():
    logits = torch.tensor([[4.0, 0.0], [0.0, 3.0], [5.0, 1.0]])
    labels = torch.tensor([0, 1, 0])
    assert fit_temperature(logits, labels) is None  # not the bound: every probability near 1
    # Entirely wrong: the best is past the upper bound, uniform probabilities.
    assert fit_temperature(logits, 1 - labels) is None
    # One error makes the best temperature finite, inside the range.
    one_wrong = torch.tensor([0, 1, 1])
    assert TEMPERATURE_RANGE[0] < fit_temperature(logits, one_wrong) < TEMPERATURE_RANGE[1]
    with pytest.raises(ValueError, match="no documents"):
        fit_temperature(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))


def test_scaling_changes_no_label():
    logits, _ = miscalibrated(500, 6, 1.0, seed=2)
    for temperature in (0.1, 0.7, 3.0):
        scaled = scaled_probabilities(logits, temperature)
        assert torch.equal(scaled.argmax(-1), logits.argmax(-1))
        assert torch.allclose(scaled.sum(-1), torch.ones(len(logits), dtype=scaled.dtype))


def test_the_scores_match_references_computed_another_way():
    logits, labels = miscalibrated(300, 3, 2.0, seed=3)
    probs = torch.softmax(logits, -1)
    scores = calibration_scores(probs, labels)
    p, y = probs.numpy(), labels.numpy()
    brier = np.mean([sum((p[i, c] - (c == y[i])) ** 2 for c in range(3)) for i in range(len(y))])
    assert scores["brier"] == pytest.approx(brier, abs=1e-6)
    assert scores["nll"] == pytest.approx(log_loss(y, p, labels=[0, 1, 2]), abs=1e-6)
    assert scores["accuracy"] == pytest.approx(np.mean(p.argmax(1) == y), abs=1e-6)
    reference = multiclass_calibration_error(probs.float(), labels, 3, n_bins=ECE_BINS)
    assert scores["ece"] == pytest.approx(float(reference), abs=1e-6)
    assert scores["documents"] == 300


@pytest.mark.parametrize("sharpness", [1, 12])
def test_the_diagrams_bins_add_up_to_the_expected_calibration_error(sharpness):
    logits, labels = miscalibrated(1_000, 4, 0.6, seed=4)
    # Sharpened, many top probabilities are exactly 1 in float32: torchmetrics bins them apart.
    probs = torch.softmax(sharpness * logits, -1)
    assert (probs.max(-1).values.float() == 1).any() == (sharpness > 1)
    bins = reliability_bins(probs, labels)
    assert sum(b["documents"] for b in bins) == 1_000
    assert all(b["low"] <= b["confidence"] < b["high"] or b["low"] == 1 for b in bins)
    ece = sum(b["documents"] / 1_000 * abs(b["accuracy"] - b["confidence"]) for b in bins)
    assert ece == pytest.approx(calibration_scores(probs, labels)["ece"], abs=1e-5)


@pytest.mark.parametrize("target", [0.8, 0.95, 0.99])
def test_the_precision_threshold_is_the_lowest_on_its_grid_that_reaches_the_target(target):
    logits, labels = miscalibrated(400, 3, 1.0, seed=5)
    # Rounded probabilities, so that some documents tie at a threshold.
    probs = (torch.softmax(logits, -1) * 50).round() / 50
    threshold = precision_threshold(probs, labels, target)
    confidence = probs.max(-1).values
    correct = (probs.argmax(-1) == labels).double()
    reference = None
    for t in np.arange(10_001) / 10_000:  # every multiple of 1e-4, lowest first
        accepted = confidence >= t
        enough = accepted.sum() >= least_documents(target)
        if enough and correct[accepted].mean() >= target:
            reference = float(t)
            break
    assert (threshold is None) == (reference is None)
    if threshold is not None:
        # The same documents accepted; written as the lowest accepted probability, rounded down.
        assert accepted_at(probs, labels, threshold) == accepted_at(probs, labels, reference)
        lowest = float(confidence[confidence >= threshold].min())
        assert threshold == np.floor(lowest * 10_000) / 10_000
        assert accepted_at(probs, labels, threshold)["precision"] >= target


def test_a_threshold_never_rests_on_a_handful_of_documents():
    assert [least_documents(t) for t in (0.8, 0.95, 0.99)] == [5, 20, 100]
    # The 98 surest documents are right, the rest wrong: 98 are too few to vouch for 99 %, and
    # any more are under 99 % right.
    confidence = torch.linspace(0.999, 0.501, 200, dtype=torch.float64)
    probs = torch.stack([confidence, 1 - confidence], dim=1)
    labels = (torch.arange(200) >= 98).long()
    assert precision_threshold(probs, labels, 0.99) is None
    assert accepted_at(probs, labels, precision_threshold(probs, labels, 0.95)) == {
        "coverage": 0.515, "precision": pytest.approx(98 / 103, abs=1e-6), "documents": 103
    }  # fmt: skip


def test_no_threshold_reaches_a_precision_above_the_best_documents():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]], dtype=torch.float64)
    labels = torch.tensor([1, 0, 0])  # the surest document is wrong
    assert precision_threshold(probs, labels, 0.99) is None
    assert accepted_at(probs, labels, None) == {"coverage": 0.0, "precision": None, "documents": 0}
    assert precision_threshold(probs, labels, 0.6) == 0.7
    assert accepted_at(probs, labels, 0.7) == {
        "coverage": 1.0, "precision": pytest.approx(2 / 3, abs=1e-6), "documents": 3
    }  # fmt: skip


def test_the_risk_coverage_curve_ends_at_every_document_and_the_error_rate():
    logits, labels = miscalibrated(250, 4, 1.0, seed=6)
    probs = torch.softmax(logits, -1)
    curve = risk_coverage(probs, labels)
    assert [p["coverage"] for p in curve] == sorted(p["coverage"] for p in curve)
    assert curve[-1]["coverage"] == 1.0
    assert curve[-1]["risk"] == pytest.approx(1 - calibration_scores(probs, labels)["accuracy"])
    # At each point, accepting documents at or above its threshold gives its coverage.
    for point in curve[:: len(curve) // 5]:
        accepted = accepted_at(probs, labels, point["threshold"])
        assert accepted["coverage"] == pytest.approx(point["coverage"], abs=1e-6)
        assert 1 - accepted["precision"] == pytest.approx(point["risk"], abs=1e-6)


def test_inside_a_tie_the_curve_takes_the_ties_error_rate_whatever_the_input_order():
    """60 documents shown at a probability of 1 (10 of them wrong), 40 below: no threshold
    accepts part of the tie, so its points must not depend on which of them came first."""
    sure = torch.tensor([[1.0, 0.0]] * 60)
    unsure = torch.tensor([[0.8, 0.2]] * 40)
    probs = torch.cat([sure, unsure])
    wrong_first = torch.tensor([1] * 10 + [0] * 90)
    wrong_last = torch.tensor([0] * 50 + [1] * 10 + [0] * 40)
    first, last = risk_coverage(probs, wrong_first), risk_coverage(probs, wrong_last)
    assert first == last
    for point in first:
        if point["coverage"] <= 0.6:
            assert point["risk"] == pytest.approx(10 / 60, abs=1e-6)
    assert first[-1]["risk"] == pytest.approx(0.1)


def test_non_finite_logits_get_no_temperature():
    logits, labels = miscalibrated(200, 3, 1.5, seed=3)
    for bad in (float("nan"), float("inf")):
        broken = logits.clone()
        broken[5, 1] = bad
        with pytest.raises(ValueError, match="non-finite logits"):
            fit_temperature(broken, labels)


def test_a_precision_exactly_at_the_target_reaches_it():
    # 20 documents, the 10th surest wrong: all 20 are 95 % right, exactly the target.
    confidence = torch.linspace(0.99, 0.60, 20, dtype=torch.float64)
    probs = torch.stack([confidence, 1 - confidence], dim=1)
    labels = torch.zeros(20, dtype=torch.long)
    labels[9] = 1
    assert precision_threshold(probs, labels, 0.95) == 0.6
    # For 98 % (50 documents at least): the nine surest are all right but far too few, and all
    # 20 are too few too (and 95 % right).
    assert precision_threshold(probs, labels, 0.98) is None


def test_the_ece_a_perfect_model_would_show_shrinks_with_the_documents():
    logits, _ = miscalibrated(4_000, 5, 1.0, seed=7)
    probs = torch.softmax(logits, -1)
    few, many = ece_if_calibrated(probs[:250]), ece_if_calibrated(probs)
    assert 0 < many < few  # binning noise, about 1/sqrt(N)
    assert few / many == pytest.approx(4, rel=0.35)
    assert ece_if_calibrated(probs[:250]) == few  # seeded
    # Labels drawn from the probabilities: the ECE measured is of the floor's size.
    labels = torch.multinomial(probs[:250], 1, generator=torch.Generator().manual_seed(9))
    measured = calibration_scores(probs[:250], labels.squeeze(1))["ece"]
    assert measured < 2.5 * few
    sure = torch.nn.functional.one_hot(torch.arange(6) % 3, 3).double()
    assert ece_if_calibrated(sure) == 0.0


def test_a_threshold_on_a_value_binary_cannot_hold_exactly_is_still_found():
    # 0.6587 · 1e4 is 6586.999… in binary: flooring it would step below and miss the threshold.
    confidence = torch.tensor([0.99, 0.98, 0.97, 0.96, 0.95, 0.6587, 0.65865, 0.65865])
    probs = torch.stack([confidence, 1 - confidence], dim=1).double()
    labels = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])
    assert precision_threshold(probs, labels, 0.8) == 0.6587
    assert accepted_at(probs, labels, 0.6587) == {
        "coverage": 0.75,
        "precision": 1.0,
        "documents": 6,
    }
