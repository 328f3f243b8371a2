"""Matplotlib figures for runs and reports (PNG files or data URIs; never a display)."""

from __future__ import annotations

import base64
import csv
import io
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from docclass.interpret.records import REMOVAL_LABELS  # noqa: E402


def save_png(figure: plt.Figure, path: str | Path) -> None:
    """Write ``figure`` as a PNG file and free it."""
    figure.savefig(path, dpi=120)
    plt.close(figure)


def png_data_uri(figure: plt.Figure) -> str:
    """``figure`` as a ``data:image/png;base64,…`` URI, so a page needs no side files."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def confusion_matrix_figure(
    matrix: np.ndarray, label_names: list[str], split: str = "test"
) -> plt.Figure:
    """Counts with true labels down the rows and predictions across, each cell annotated."""
    size = max(4.0, 0.7 * len(label_names) + 2)
    figure, axes = plt.subplots(figsize=(size, size))
    axes.imshow(matrix, cmap="Blues")
    ticks = range(len(label_names))
    # Label names as written: matplotlib reads text between two dollar signs as math, which
    # drew "costs $5-$10" as "costs 5 − 10" and failed the whole figure on "$\money$ talk".
    axes.set_xticks(ticks, label_names, rotation=45, ha="right", parse_math=False)
    axes.set_yticks(ticks, label_names, parse_math=False)
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
    # Two lines: one line overflowed the figure when there are few classes (a narrow figure).
    axes.set_title(f"{split} confusion matrix\naccuracy {accuracy:.3f}, n={int(matrix.sum())}")
    figure.tight_layout()
    return figure


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


def training_curves_figure(metric_log: str | Path) -> plt.Figure:
    """Loss (train per step and per epoch, validation) and validation accuracy / macro-F1."""
    series = read_metric_log(metric_log)
    # Wide, for the index's full width: at half a column its labels could not be read.
    figure, (loss_axes, score_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, style in (("train/loss_step", ":"), ("train/loss_epoch", "-o"), ("val/loss", "-s")):
        if key in series:
            steps, values = zip(*series[key], strict=True)
            loss_axes.plot(steps, values, style, label=key, alpha=0.6 if style == ":" else 1.0)
    loss_axes.set_xlabel("optimiser step")
    loss_axes.set_ylabel("cross-entropy")
    loss_axes.set_title("loss")
    if loss_axes.get_legend_handles_labels()[0]:
        loss_axes.legend()
    for key in ("val/acc", "val/f1"):
        if key in series:
            steps, values = zip(*series[key], strict=True)
            score_axes.plot(steps, values, "-o", label=key)
    score_axes.set_xlabel("optimiser step")
    score_axes.set_title("validation")
    if score_axes.get_legend_handles_labels()[0]:
        score_axes.legend()
    figure.tight_layout()
    return figure


def entropy_histogram_figure(normalised_entropy: dict[str, Sequence[float]]) -> plt.Figure:
    """One histogram per pool head of its attention entropy over documents.

    Entropies are divided by log2(words in the document): 0 = all weight on one word,
    1 = spread evenly, so documents of different lengths share one axis.
    """
    names = list(normalised_entropy)
    figure, axes_row = plt.subplots(
        1, len(names), figsize=(2.6 * len(names) + 1, 2.8), sharey=True, squeeze=False
    )
    for axes, name in zip(axes_row[0], names, strict=True):
        values = np.asarray(normalised_entropy[name], dtype=float)
        axes.hist(values, bins=20, range=(0, 1), color="#d9822b")
        axes.set_title(f"{name}\nmedian {np.median(values):.2f}" if values.size else name)
        axes.set_xlabel("entropy / log2(words)")
    axes_row[0][0].set_ylabel("documents")
    figure.tight_layout()
    return figure


def removal_curves_figure(tables: dict[str, dict], fractions: Sequence[float]) -> plt.Figure:
    """Fraction of words removed vs. drop in the predicted class's probability, one curve per
    method (heads left out for legibility), one panel per removal mode."""
    figure, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 4), squeeze=False)
    for axis, (removal, table) in zip(axes[0], tables.items(), strict=True):
        for name, row in table.items():
            if name.startswith("attention_head"):
                continue
            style = {"color": "grey", "linestyle": "--"} if name == "random" else {}
            axis.plot([100 * f for f in fractions], row["curve"], marker="o", label=name, **style)
        axis.set_title(f"words removed by {REMOVAL_LABELS[removal]}")
        axis.set_xlabel("% of the document's words removed, most important first")
        axis.set_ylabel("drop in p(predicted class)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


# The reliability diagram's bar for documents whose top probability is exactly 1.
EXACTLY_ONE_WIDTH = 0.03


def reliability_figure(split_figures: dict, temperature: float, where: str = "") -> plt.Figure:
    """Reliability diagram of one split before and after the temperature: per confidence bin,
    the share right (bars) against the mean top probability (the diagonal is perfect), and
    how many documents fall in each bin. ``where`` names the documents it covers (a report's
    pages may show others)."""
    figure, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    # T = 1 exactly: none was fitted (no temperature in range beat the raw softmax).
    after = f"calibrated (T = {temperature:.3f})" if temperature != 1.0 else "no temperature fitted"
    panels = (("before", "raw softmax"), ("after", after))
    for axis, (key, name) in zip(axes, panels, strict=True):
        bins = split_figures["reliability"][key]
        widths = [b["high"] - b["low"] for b in bins]
        # A top probability of exactly 1 is a bin of its own (low == high == 1): a thin bar
        # just right of 1, not one over the last bin's (and not of zero width, as it was when
        # every document was sure: the bars took the first bin's width).
        centres = [
            (b["low"] + b["high"]) / 2 if w else 1 + EXACTLY_ONE_WIDTH / 2
            for b, w in zip(bins, widths, strict=True)
        ]
        axis.bar(centres, [b["accuracy"] for b in bins],
                 width=[0.9 * w if w else EXACTLY_ONE_WIDTH for w in widths], color="#4c78a8",
                 label="share right")  # fmt: skip
        axis.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], "o",
                  color="#d9822b", label="(mean top probability, share right)")  # fmt: skip
        axis.plot([0, 1], [0, 1], "--", color="grey", linewidth=1)
        for centre, b in zip(centres, bins, strict=True):
            axis.annotate(str(b["documents"]), (centre, 0.02), ha="center", fontsize=7)
        axis.set_title(f"{name}: ECE {split_figures[key]['ece']:.3f}")
        axis.set_xlabel("top probability")
        axis.set_xlim(0, 1 + EXACTLY_ONE_WIDTH if any(w == 0 for w in widths) else 1)
        axis.set_ylim(0, 1.02)
    axes[0].set_ylabel("share of documents labelled right")
    axes[0].legend(fontsize=8, loc="upper left")
    if where:
        figure.suptitle(where, fontsize=10)
    figure.tight_layout()
    return figure


def risk_coverage_figure(
    curve: Sequence[dict], targets: dict[str, dict], where: str = ""
) -> plt.Figure:
    """Share of documents accepted (most sure first) against the error rate among them, with
    the coverage each validation-chosen threshold gives on this split (``where``, named in
    the title)."""
    figure, axis = plt.subplots(figsize=(5.5, 4))
    if where:
        axis.set_title(where, fontsize=10)
    axis.plot([p["coverage"] for p in curve], [p["risk"] for p in curve], color="#4c78a8")
    for name, target in targets.items():
        accepted = target.get("test")
        if accepted and accepted["documents"]:
            risk = 1 - accepted["precision"]
            axis.plot([accepted["coverage"]], [risk], "o", label=f"threshold for {name} precision")
    axis.set_xlabel("share of documents labelled automatically (most sure first)")
    axis.set_ylabel("error rate among them")
    axis.set_xlim(0, 1)
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def write_run_figures(run_dir: str | Path, metrics_file: str = "metrics.json") -> list[Path]:
    """``confusion_matrix.png`` and ``training_curves.png`` of a run, from its ``metrics.json``
    (and the CSV metric log it names); returns the files written. For the figures of a
    checkpoint tested in its run's folder (``metrics.best.json``), ``confusion_matrix.best.png``
    alone: the fit's figures stay those of the weights it tested."""
    run_dir = Path(run_dir)
    metrics = json.loads((run_dir / metrics_file).read_text())
    test = metrics["test"]
    of_the_fit = metrics_file == "metrics.json"
    suffix = "" if of_the_fit else Path(metrics_file).stem.removeprefix("metrics")
    written = [run_dir / f"confusion_matrix{suffix}.png"]
    save_png(
        confusion_matrix_figure(np.asarray(test["confusion_matrix"]), test["label_names"]),
        written[0],
    )
    metric_log = metrics.get("metric_log")
    if of_the_fit and metric_log and Path(metric_log).is_file():
        written.append(run_dir / "training_curves.png")
        save_png(training_curves_figure(metric_log), written[1])
    return written
