"""Temperature scaling and the calibration scores, against references computed another way."""

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss
from torchmetrics.functional.classification import multiclass_calibration_error

from docclass.calibration import (
    ECE_BINS,
    TEMPERATURE_RANGE,
    calibration_scores,
    fit_temperature,
    reliability_bins,
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


def test_a_split_the_model_gets_entirely_right_stops_at_the_lower_bound():
    logits = torch.tensor([[4.0, 0.0], [0.0, 3.0], [5.0, 1.0]])
    labels = torch.tensor([0, 1, 0])
    assert fit_temperature(logits, labels) == pytest.approx(TEMPERATURE_RANGE[0])
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


def test_the_diagrams_bins_add_up_to_the_expected_calibration_error():
    logits, labels = miscalibrated(1_000, 4, 0.6, seed=4)
    probs = torch.softmax(logits, -1)
    assert probs.max() < 1  # a top probability of exactly 1 has a bin of its own in torchmetrics
    bins = reliability_bins(probs, labels)
    assert sum(b["documents"] for b in bins) == 1_000
    assert all(b["low"] <= b["confidence"] < b["high"] for b in bins)
    ece = sum(b["documents"] / 1_000 * abs(b["accuracy"] - b["confidence"]) for b in bins)
    assert ece == pytest.approx(calibration_scores(probs, labels)["ece"], abs=1e-5)
