"""The index's per-class views, readable at 5 classes and at 150: a table of every class's
precision, recall and F1, the confusion matrix as an HTML table (only the classes with the most
errors past :data:`MATRIX_CLASSES`), and the confused pairs ranked.

Computed from the confusion matrix alone; the figures are those of
:func:`docclass.metrics.classification_scores`, so the index and ``metrics.json`` agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from docclass.metrics import classification_scores

# A matrix wider than this is unreadable on a page: past it, the classes with the most errors.
MATRIX_CLASSES = 20
# The ranked table of confused pairs lists this many; every pair keeps its entry below it.
PAIR_ROWS = 30


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def class_rows(matrix: np.ndarray, label_names: Sequence[str]) -> list[dict[str, Any]]:
    """Every class in the split (true or predicted) with its precision, recall, F1, support
    and predicted count, worst F1 first."""
    f1 = classification_scores(matrix)["per_class_f1"]
    hits, predicted, support = np.diag(matrix), matrix.sum(axis=0), matrix.sum(axis=1)
    rows = [
        {
            "name": name,
            "precision": _share(hits[c], predicted[c]),
            "recall": _share(hits[c], support[c]),
            "f1": f1[c],
            "support": int(support[c]),
            "predicted": int(predicted[c]),
        }
        for c, name in enumerate(label_names)
        if f1[c] is not None
    ]
    rows.sort(key=lambda row: (row["f1"], -row["support"], row["name"]))
    return rows


def matrix_view(matrix: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
    """The confusion matrix as rows of cells for an HTML table: every class up to
    :data:`MATRIX_CLASSES`, else that many: the classes with the most errors (as true or
    predicted class), then the largest, in the model's order; each cell its count, shade and
    tooltip."""
    errors = matrix.sum(axis=0) + matrix.sum(axis=1) - 2 * np.diag(matrix)
    support = matrix.sum(axis=1)
    present = [c for c in range(len(label_names)) if matrix[c].sum() or matrix[:, c].sum()]
    shown = present
    if len(present) > MATRIX_CLASSES:
        ranked = sorted(present, key=lambda c: (-errors[c], -support[c], c))
        shown = sorted(ranked[:MATRIX_CLASSES])
    top = max(1, int(matrix[np.ix_(shown, shown)].max())) if shown else 1
    rows = []
    for r in shown:
        cells = []
        for c in shown:
            count = int(matrix[r, c])
            share = count / support[r] if support[r] else 0.0
            cells.append(
                {
                    "count": count,
                    "shade": f"{count / top:.2f}",
                    "diagonal": r == c,
                    "title": f"true {label_names[r]} → predicted {label_names[c]}: {count} of "
                    f"{int(support[r])} ({100 * share:.0f} %)",
                }
            )
        rows.append({"name": label_names[r], "support": int(support[r]), "cells": cells})
    return {
        "names": [label_names[c] for c in shown],
        "rows": rows,
        "hidden": len(present) - len(shown),
        "present": len(present),
    }


def pair_rows(cells: Sequence[dict[str, Any]], matrix: np.ndarray, label_names: Sequence[str]):
    """The most frequent confusions (true → predicted), most first: count and share of the true
    class, each pointing at its entry in the list of errors (``#cell-N``, 1-based)."""
    index = {name: c for c, name in enumerate(label_names)}
    support = matrix.sum(axis=1)
    rows = []
    for number, cell in enumerate(cells[:PAIR_ROWS], start=1):
        count = len(cell["documents"])
        rows.append(
            {
                "true": cell["true"],
                "predicted": cell["predicted"],
                "count": count,
                "share": _share(count, support[index[cell["true"]]]),
                "anchor": f"cell-{number}",
            }
        )
    return rows
