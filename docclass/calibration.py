"""Whether a model's probabilities mean what they say, and the temperature that makes them.

Training leaves probabilities uncalibrated (label smoothing, which the recipes use, pulls them
towards uniform; long training pushes them to 0 and 1). Temperature scaling (Guo et al. 2017,
"On Calibration of Modern Neural Networks") divides every logit by one number ``T`` fitted on
held-out documents by log-likelihood. It changes no label (the largest logit stays the
largest) and no word score, only how sure each probability says the model is.

The scores: expected calibration error over 15 equal-width confidence bins (torchmetrics'
top-label ``multiclass_calibration_error``), the Brier score (the mean over documents of the
squared distance between the probability vector and the one-hot label) and the negative
log-likelihood.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torchmetrics.functional.classification import multiclass_calibration_error

ECE_BINS = 15
# A temperature is fitted within these bounds, and a stored one must lie within them: a
# validation split the model gets entirely right has no finite best temperature (the
# likelihood keeps rising as T falls), and one it gets entirely wrong none either.
TEMPERATURE_RANGE = (0.05, 20.0)
# Probabilities are shown, and compared with a threshold, rounded to this many decimals.
SHOWN_DECIMALS = 6


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float | None:
    """The temperature ``T`` that maximises the likelihood of ``labels`` under
    ``softmax(logits / T)``; None when the best lies outside :data:`TEMPERATURE_RANGE`.

    A split the model gets entirely right has no best temperature (the likelihood keeps rising
    as T falls to 0, every probability towards 1); one on which a bound wins says as little.
    Applying the bound would make every probability, the errors' included, nearly 1 or
    uniform: the caller keeps the raw probabilities instead.

    Args:
        logits: ``[N, C]`` of held-out documents (never the test split).
        labels: ``[N]`` class indices.
    """
    if len(logits) == 0:
        raise ValueError("no documents to fit a temperature on")
    logits, labels = logits.detach().double().cpu(), labels.detach().long().cpu()
    if not torch.isfinite(logits).all():
        # Every slope would be NaN, every comparison false: the bisection ran to the upper
        # bound and returned T = 20 as if the likelihood had chosen it.
        raise ValueError("non-finite logits: no temperature can be fitted to them")
    true_logit = logits.gather(1, labels[:, None]).squeeze(1)

    def slope(inverse: float) -> float:
        """d NLL / d(1/T): the mean of E_p[logit] - true logit under softmax(logits / T)."""
        probs = torch.softmax(logits * inverse, dim=-1)
        return float(((probs * logits).sum(dim=1) - true_logit).mean())

    # The negative log-likelihood is convex in 1/T, so its slope rises with 1/T: bisection
    # finds where it crosses zero (or the bound it never crosses before) to float precision.
    low, high = 1 / TEMPERATURE_RANGE[1], 1 / TEMPERATURE_RANGE[0]
    if slope(low) >= 0 or slope(high) <= 0:
        return None
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if slope(middle) < 0 else (low, middle)
    return 1 / ((low + high) / 2)


def scaled_probabilities(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``softmax(logits / temperature)`` in float32 or wider."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def calibration_scores(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """ECE (15 bins), Brier score, negative log-likelihood and accuracy of ``probs [N, C]``
    against ``labels [N]``."""
    probs, labels = probs.detach().double().cpu(), labels.detach().long().cpu()
    n, classes = probs.shape
    one_hot = torch.nn.functional.one_hot(labels, classes).double()
    picked = probs.gather(1, labels[:, None]).squeeze(1)
    # A probability of exactly 0 for the true class would make the NLL infinite: it is floored at
    # float64's smallest normal number, so one overconfident error reads as about 708 nats.
    floor = torch.finfo(torch.float64).tiny
    return {
        "ece": round(float(multiclass_calibration_error(probs, labels, classes, ECE_BINS)), 6),
        "brier": round(float(((probs - one_hot) ** 2).sum(dim=1).mean()), 6),
        "nll": round(float(-picked.clamp_min(floor).log().mean()), 6),
        "accuracy": round(float((probs.argmax(dim=1) == labels).double().mean()), 6),
        "documents": n,
    }


def reliability_bins(probs: torch.Tensor, labels: torch.Tensor) -> list[dict[str, Any]]:
    """The reliability diagram's bars, binned as torchmetrics bins the ECE: for each of
    :data:`ECE_BINS` equal-width bins of the top probability (in float32; a top probability
    of exactly 1 is a bin of its own, ``low == high == 1``), the documents in it, their mean
    top probability and their accuracy (empty bins left out). The bars' accuracy gaps,
    weighted by their documents, add up to :func:`calibration_scores`' ECE."""
    confidence, correct = _confidence_and_correct(probs, labels)
    confidence = confidence.float()  # torchmetrics' precision, edges and binning
    edges = torch.linspace(0, 1, ECE_BINS + 1, dtype=torch.float32)
    index = torch.bucketize(confidence, edges, right=True) - 1
    confidence = confidence.double()
    bins = []
    for b in range(ECE_BINS + 1):
        members = index == b
        count = int(members.sum())
        if count:
            bins.append(
                {
                    "low": round(float(edges[b]), 6),
                    "high": round(float(edges[min(b + 1, ECE_BINS)]), 6),
                    "documents": count,
                    "confidence": round(float(confidence[members].mean()), 6),
                    "accuracy": round(float(correct[members].mean()), 6),
                }
            )
    return bins


def _confidence_and_correct(probs: torch.Tensor, labels: torch.Tensor):
    probs, labels = probs.detach().double().cpu(), labels.detach().long().cpu()
    confidence, predicted = probs.max(dim=1)
    return confidence, (predicted == labels).double()


def least_documents(target: float) -> int:
    """The fewest accepted documents a threshold for ``target`` precision may rest on: enough
    that one error among them would still be within the target (20 for 95 %, 100 for 99 %).
    On fewer, a threshold would mean the handful of surest documents happened to be right."""
    return math.ceil(1 / (1 - target) - 1e-9)


def precision_threshold(
    probs: torch.Tensor, labels: torch.Tensor, target: float, decimals: int = 4
) -> float | None:
    """The lowest threshold ``t`` (a multiple of ``10**-decimals``, so that it can be written
    down and passed to ``classify --min_probability`` as it is) at which the documents whose
    top probability, as shown (:data:`SHOWN_DECIMALS`), is at least ``t`` are labelled right at
    least ``target`` of the time, and number at least :func:`least_documents`: the threshold
    that accepts the most documents at that precision. None when none reaches it.

    Choose it on validation: on the split it is scored on it would be fitted to its noise."""
    confidence, correct = _confidence_and_correct(probs, labels)
    # In integer millionths (as shown), so that rounding down to the grid is exact: 0.6587 ·
    # 1e4 is 6586.999… in binary, and flooring it would miss the threshold 0.6587.
    shown = (confidence * 10**SHOWN_DECIMALS).round().long()
    confidence = shown.double() / 10**SHOWN_DECIMALS
    scale = 10**decimals
    # Every accepted set a grid threshold can make: each document's probability rounded down
    # to the grid (it and everything above it), and 1.
    steps = torch.unique(
        torch.cat([shown // 10 ** (SHOWN_DECIMALS - decimals), torch.tensor([scale])])
    )
    grid = steps.double() / scale
    order = torch.argsort(confidence, descending=True, stable=True)
    right = torch.cat([torch.zeros(1).double(), correct[order].cumsum(0)])
    # How many documents each threshold accepts: those at or above it.
    accepted = torch.searchsorted(-confidence[order], -grid, right=True)
    # A hair of slack: 0.95 · 20 need not be 19 in binary, and 19 of 20 right reaches 95 %.
    reaching = (accepted >= least_documents(target)) & (right[accepted] >= target * accepted - 1e-9)
    return round(float(grid[reaching].min()), decimals) if reaching.any() else None


def accepted_at(probs: torch.Tensor, labels: torch.Tensor, threshold: float | None) -> dict:
    """Coverage (the share of documents whose top probability, as shown, is at least
    ``threshold``) and the precision among them (None when none are)."""
    confidence, correct = _confidence_and_correct(probs, labels)
    confidence = confidence.round(decimals=SHOWN_DECIMALS)
    accepted = (
        confidence >= threshold if threshold is not None else torch.zeros_like(correct).bool()
    )
    count = int(accepted.sum())
    return {
        "coverage": round(count / max(1, len(correct)), 6),
        "precision": round(float(correct[accepted].mean()), 6) if count else None,
        "documents": count,
    }


def risk_coverage(probs: torch.Tensor, labels: torch.Tensor, points: int = 100) -> list[dict]:
    """The risk–coverage curve: accepting documents from the most sure down, the share accepted
    against the error rate among them, at about ``points`` coverages (and the last). Inside a
    tie of shown probabilities the error rate is the tie's own, whatever the input order."""
    confidence, correct = _confidence_and_correct(probs, labels)
    confidence = confidence.round(decimals=SHOWN_DECIMALS)
    order = torch.argsort(confidence, descending=True, stable=True)
    shown = confidence[order]
    errors = (1 - correct[order]).cumsum(0)
    n = len(order)
    # Documents of one shown probability are accepted together by any threshold: within such
    # a tie a point takes the tie's own error rate (the expected one in a random order), not
    # that of whichever tied documents the split happens to list first.
    _, sizes = torch.unique_consecutive(shown, return_counts=True)
    ends = sizes.cumsum(0)
    starts = ends - sizes
    before = torch.cat([errors.new_zeros(1), errors])[starts]
    tie_rate = (errors[ends - 1] - before) / sizes
    tie_of = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    steps = sorted({min(n, max(1, round(n * i / points))) for i in range(1, points + 1)})
    points_out = []
    for k in steps:
        tie = int(tie_of[k - 1])
        wrong = float(before[tie]) + (k - int(starts[tie])) * float(tie_rate[tie])
        points_out.append(
            {
                "coverage": round(k / n, 6),
                "risk": round(wrong / k, 6),
                "threshold": float(shown[k - 1]),
            }
        )
    return points_out


def ece_if_calibrated(probs: torch.Tensor, draws: int = 200, seed: int = 0) -> float:
    """The ECE these probabilities would show on this many documents if they were exactly
    right: labels drawn from the probabilities themselves (``draws`` times, seeded), scored
    like the real ones. Binning a few hundred documents leaves this much even for a perfect
    model, so an ECE near it is as good as the split can tell."""
    probs = probs.detach().double().cpu()
    generator = torch.Generator().manual_seed(seed)
    classes = probs.shape[1]
    values = [
        float(
            multiclass_calibration_error(
                probs,
                torch.multinomial(probs, 1, generator=generator).squeeze(1),
                classes,
                ECE_BINS,
            )
        )
        for _ in range(draws)
    ]
    return round(sum(values) / draws, 6)
