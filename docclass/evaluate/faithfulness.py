"""Every faithfulness figure of a set of documents, as one computation (no files written here).

The whole set gets ERASER's table per removal kind and the permuted-pool check; a fixed random
sample gets the checks too slow for a whole split: integrated gradients beside every method's
AOPC, Kendall τ with leave-one-word-out, and cascading weight randomisation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from docclass.artifacts.load import TrainedClassifier
from docclass.evaluate import sanity
from docclass.evaluate.erasure import FRACTIONS, faithfulness_table
from docclass.evaluate.plausibility import plausibility
from docclass.interpret.explain import explain_documents
from docclass.interpret.inputs import float32_classifier
from docclass.interpret.integrated_gradients import add_integrated_gradients

RANDOM_SEEDS = 5


def sample_indices(n_documents: int, size: int, seed: int = 0) -> list[int]:
    """A fixed random sample of document positions, in order (splits are often grouped by
    class, so the first N would be one class)."""
    if size >= n_documents:
        return list(range(n_documents))
    return sorted(np.random.default_rng(seed).choice(n_documents, size, replace=False).tolist())


def _measurable(record: dict[str, Any]) -> bool:
    """Whether a document is in the tables: :func:`docclass.evaluate.erasure.
    document_faithfulness` (and τ and ρ) leave out one that failed or has under two words."""
    return not record.get("error") and record["words_read"] >= 2


def sample_checks(
    classifier: TrainedClassifier, texts: Sequence[str], ig_steps: int = 32, device: str = "cpu"
) -> dict[str, Any]:
    """Integrated gradients beside every method's AOPC, Kendall τ with leave-one-word-out, and
    cascading weight randomisation, on ``texts`` (a sample)."""
    records = explain_documents(classifier, list(texts), device=device)
    measured = sum(_measurable(record) for record in records)
    started = time.perf_counter()
    deltas = (
        add_integrated_gradients(classifier, texts, records, ig_steps, device=device)
        if ig_steps
        else []
    )
    ig_seconds = time.perf_counter() - started
    started = time.perf_counter()
    aopc_mask = faithfulness_table(classifier, texts, records, "mask", device=device)
    tau = sanity.loo_agreement(classifier, texts, records, device=device)
    tau_seconds = time.perf_counter() - started
    started = time.perf_counter()
    randomised = sanity.randomised_weights(classifier, texts, records, ig_steps, device=device)
    return {
        # The documents every figure here can cover: one too short to rank, or that failed, is
        # in none of them (τ and ρ per method say their own count beside it).
        "documents": measured,
        "documents_given": len(texts),
        "integrated_gradients_steps": ig_steps,
        "integrated_gradients_relative_delta": {
            "max": float(max(deltas, default=0.0)),
            "mean": float(np.mean(deltas)) if deltas else 0.0,
        },
        "aopc_mask": aopc_mask,
        "kendall_tau_vs_leave_one_out": tau,
        "randomised_weights": randomised,
        "seconds": {
            "integrated_gradients": round(ig_seconds, 1),
            "aopc_and_leave_one_out": round(tau_seconds, 1),
            "randomised_weights": round(time.perf_counter() - started, 1),
        },
    }


def faithfulness_figures(
    classifier: TrainedClassifier,
    texts: Sequence[str],
    removals: Sequence[str] = ("mask", "delete", "unk"),
    sample: int = 20,
    ig_steps: int = 32,
    permutations: int = 20,
    device: str = "cpu",
    ids: Sequence[Any] | None = None,
    rationales: dict[str, list[tuple[int, int]]] | None = None,
) -> dict[str, Any]:
    """ERASER tables per removal kind, the permuted pool, and the sample checks; with
    ``rationales`` (evidence spans by document id, :func:`docclass.evaluate.plausibility.
    read_rationales`), each method's plausibility too."""
    classifier = float32_classifier(classifier)
    texts = list(texts)
    records = explain_documents(classifier, texts, ids, device=device)
    figures: dict[str, Any] = {
        # The documents the tables average over (as the report's own summary counts them), not
        # those given: one too short to rank, or that failed, is in no table.
        "documents": sum(_measurable(record) for record in records),
        "documents_given": len(texts),
        "fractions": list(FRACTIONS),
        "random_seeds": RANDOM_SEEDS,
        "removal": {},
    }
    for removal in removals:
        started = time.perf_counter()
        table = faithfulness_table(
            classifier, texts, records, removal, RANDOM_SEEDS, FRACTIONS, device
        )
        figures["removal"][removal] = {
            "seconds": round(time.perf_counter() - started, 1),
            "aopc": table,
        }
    if rationales is not None:
        figures["plausibility"] = plausibility(records, rationales)
    started = time.perf_counter()
    figures["permuted_pool"] = sanity.permuted_pool(
        classifier, texts, permutations=permutations, device=device
    )
    figures["permuted_pool"]["seconds"] = round(time.perf_counter() - started, 1)
    if sample:
        chosen = sample_indices(len(texts), sample)
        figures["sample"] = sample_checks(classifier, [texts[i] for i in chosen], ig_steps, device)
        figures["sample"]["indices"] = chosen
    return figures
