"""Matplotlib figures for a run: confusion matrix and training curves (PNG, no display)."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_confusion_matrix(matrix: np.ndarray, label_names: list[str], path: str | Path) -> None:
    """Counts with true labels down the rows and predictions across, each cell annotated."""
    size = max(4.0, 0.7 * len(label_names) + 2)
    figure, axes = plt.subplots(figsize=(size, size))
    axes.imshow(matrix, cmap="Blues")
    ticks = range(len(label_names))
    axes.set_xticks(ticks, label_names, rotation=45, ha="right")
    axes.set_yticks(ticks, label_names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    threshold = matrix.max() / 2 if matrix.size else 0
    for row in ticks:
        for col in ticks:
            value = int(matrix[row, col])
            axes.text(
                col,
                row,
                str(value),
                ha="center",
                va="center",
                color="white" if value > threshold else "black",
            )
    accuracy = np.trace(matrix) / max(1, matrix.sum())
    axes.set_title(f"test confusion matrix (accuracy {accuracy:.3f}, n={int(matrix.sum())})")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def read_metric_log(path: str | Path) -> dict[str, list[tuple[float, float]]]:
    """Read Lightning's CSVLogger ``metrics.csv`` into ``{metric: [(step, value), ...]}``."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            step = float(row.get("step") or 0)
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in ("", None):
                    series[key].append((step, float(value)))
    return dict(series)


def plot_training_curves(metric_log: str | Path, path: str | Path) -> None:
    """Loss (train per step and per epoch, validation) and validation accuracy / macro-F1."""
    series = read_metric_log(metric_log)
    figure, (loss_axes, score_axes) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("train/loss_step", ":"), ("train/loss_epoch", "-o"), ("val/loss", "-s")):
        if key in series:
            steps, values = zip(*series[key], strict=True)
            loss_axes.plot(steps, values, style, label=key, alpha=0.6 if style == ":" else 1.0)
    loss_axes.set_xlabel("optimiser step")
    loss_axes.set_ylabel("cross-entropy")
    loss_axes.set_title("loss")
    loss_axes.legend()
    for key in ("val/acc", "val/f1"):
        if key in series:
            steps, values = zip(*series[key], strict=True)
            score_axes.plot(steps, values, "-o", label=key)
    score_axes.set_xlabel("optimiser step")
    score_axes.set_title("validation")
    score_axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
