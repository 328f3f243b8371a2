"""Integrated gradients (Sundararajan et al. 2017), through Captum.

The gradient of the predicted logit is integrated along the straight path from a baseline to
the token embeddings. The baseline is a zero word vector at every position (a from-scratch
model's padding embedding; a pre-trained encoder's [PAD] vector is not zero), with the
positions kept, so the attributions explain the words, not where they stand.
Captum's implementation, with its convergence delta (how far the attributions miss
``f(x) − f(baseline)``) reported. Dozens of passes per document: measured on samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from docclass.interpret.inputs import document_inputs, float32_model
from docclass.interpret.records import compact

IG_METHOD = "integrated_gradients"


def integrated_gradients(
    classifier,
    text: str,
    record: dict,
    steps: int = 32,
    internal_batch_size: int = 16,
    device: str = "cpu",
) -> tuple[list[float], float]:
    """One document's integrated-gradients score per word read, and the convergence delta
    relative to ``|f(x) − f(baseline)|``."""
    from captum.attr import IntegratedGradients

    ids, token_words, predicted = document_inputs(classifier, text, record)
    model = float32_model(classifier.model.to(device).eval())
    ids = ids[None].to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)

    def predicted_logits(token_vectors: torch.Tensor) -> torch.Tensor:
        rows = len(token_vectors)
        # The model adds the positions: the baseline keeps them.
        out = model(ids.expand(rows, -1), mask.expand(rows, -1), token_vectors=token_vectors)
        return out.logits

    with torch.no_grad():
        token_vectors = model.token_vectors(ids)
    baseline = torch.zeros_like(token_vectors)
    attributions, delta = IntegratedGradients(predicted_logits).attribute(
        token_vectors,
        baselines=baseline,
        target=predicted,
        n_steps=steps,
        internal_batch_size=internal_batch_size,
        return_convergence_delta=True,
    )
    with torch.no_grad():
        gap = (predicted_logits(token_vectors) - predicted_logits(baseline))[0, predicted]
    per_token = attributions[0].sum(dim=-1).double().cpu().numpy()
    per_word = np.bincount(token_words, weights=per_token, minlength=record["words_read"])
    relative_delta = abs(float(delta[0])) / max(abs(float(gap)), 1e-12)
    return compact(per_word), relative_delta


def add_integrated_gradients(
    classifier, texts: Sequence[str], records: list[dict], steps: int = 32, device: str = "cpu"
) -> list[float]:
    """Put integrated gradients into each record's ``scores`` (words past the cut get 0, as
    with every method); returns each document's relative convergence delta."""
    deltas = []
    for text, record in zip(texts, records, strict=True):
        if record.get("error") or not record["words_read"]:
            continue
        scores, delta = integrated_gradients(classifier, text, record, steps, device=device)
        record["scores"][IG_METHOD] = scores + [0.0] * (len(record["words"]) - len(scores))
        deltas.append(delta)
    return deltas
