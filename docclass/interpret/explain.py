"""Word scores for documents: how much each word weighed in a trained classifier's decision.

Subword tokens are grouped into the pre-tokenizer's words with the tokenizer's character offsets
(:func:`docclass.data.tokenizer.align_words`), and every method's token scores
(:mod:`docclass.interpret.methods`) are summed over a word's pieces. Attention methods say where
the model looked, not why; how far each can be trusted is measured by :mod:`docclass.evaluate`.

A document longer than the model's ``max_tokens`` keeps all its words: those past the cut get
score 0 and ``words_read`` says how many words the model saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from docclass.artifacts.load import TrainedClassifier
from docclass.interpret.inputs import DocumentInput, batched, encode_documents, float32_model
from docclass.interpret.methods import (
    RELEVANCE_METHODS,
    ScoringPass,
    rollout_by_depth,
    scoring_pass,
    token_scores,
    word_relevance,
)
from docclass.interpret.records import EMPTY_DOCUMENT, compact
from docclass.nn.attention import banded_to_dense

# Beyond the predicted class, a record keeps the contributions of the classes worth contrasting
# with it: the runner-up, every other class the model gave at least CONTRAST_PROBABILITY (at
# most CONTRAST_MOST classes in all), and the true class. At 150 classes every class's
# contributions made a short document's record 86 KB, for contrasts with classes the model
# never considered. (A floor on each class, not on their cumulative mass: label smoothing
# spreads a little probability over every class, and the mass rule then kept them all.)
CONTRAST_PROBABILITY = 0.01
CONTRAST_MOST = 5

# Per-layer, per-head word-by-word maps are drawn only for documents this short: beyond it the
# map is unreadable, and skipping it keeps whole-corpus reports fast.
LAYER_MAP_MAX_WORDS = 60

# The class-specific methods a contrast of two classes can use, with the relevance rule that
# computes each (contribution needs none: the read-out after the pool is linear). Attention and
# rollout give one score per word whatever the class, so they cannot say why one class rather
# than another.
CONTRAST_RULES = {"contribution": None, "grad_input": "gradient", **RELEVANCE_METHODS}


def _per_word(document: DocumentInput, token_scores: torch.Tensor) -> list[float]:
    """``[T]`` token scores (padding beyond the read tokens ignored) → one sum per word."""
    n_read = len(document.token_ids)
    values = token_scores[:n_read].double().cpu().numpy()
    n_words = len(document.alignment.word_spans)
    return compact(np.bincount(document.token_words, weights=values, minlength=n_words))


def _word_matrix_mean(
    token_matrix: np.ndarray, token_words: np.ndarray, n_words: int, pieces: np.ndarray
) -> np.ndarray:
    """``[T,T]`` query→key weights → ``[W,W]``: summed over key pieces, averaged over queries."""
    membership = np.zeros((n_words, len(token_words)))  # (W, T) one-hot
    membership[token_words, np.arange(len(token_words))] = 1.0
    return membership @ token_matrix @ membership.T / pieces[:, None]


def _dense_rows(layer: torch.Tensor, row: int, n_read: int) -> torch.Tensor:
    """One document's ``[H,T,T]`` block weights, expanding banded (windowed) weights."""
    if layer.dim() == 5:
        return banded_to_dense(layer[row : row + 1], n_read)[0]
    return layer[row]


def _single_window_row(scoring: ScoringPass, row: int) -> int | None:
    """The batch row's own row of block weights: itself without encoder windows; with them,
    its one window row, or None when the document spans several windows (their word-to-word
    maps would be partial: not drawn)."""
    if scoring.windows is None:
        return row
    rows = torch.unique(scoring.windows.row[scoring.windows.document == row])
    return int(rows[0]) if len(rows) == 1 else None


def _layer_maps(document: DocumentInput, scoring: ScoringPass, row: int) -> list:
    """``[L][H][W][W]``: each block's word-to-word attention, per head, 5 decimals."""
    if not scoring.head_weights:
        raise ValueError(
            "word-to-word maps need each head's attention: scoring_pass(head_weights=True)"
        )
    n_read, words_read = len(document.token_ids), document.words_read
    token_words = document.token_words
    pieces = np.bincount(token_words, minlength=words_read).clip(min=1)
    return [
        [
            np.round(
                _word_matrix_mean(
                    head[:n_read, :n_read].double().cpu().numpy(), token_words, words_read, pieces
                ),
                5,
            ).tolist()
            for head in _dense_rows(layer, row, n_read)
        ]
        for layer in scoring.layer_weights
    ]


def _record(
    document: DocumentInput,
    text: str,
    row: int,
    scoring: ScoringPass,
    scores: dict[str, torch.Tensor],
    label_names: list[str],
    bias: np.ndarray,
    temperature: float = 1.0,
) -> dict[str, Any]:
    spans = document.alignment.word_spans
    logits = scoring.logits[row].double().cpu()
    probs = torch.softmax(logits / temperature, -1).numpy()
    return {
        "text": text,
        "words": [text[start:end] for start, end in spans],
        "spans": [list(span) for span in spans],
        "words_read": document.words_read,
        "n_tokens": document.n_tokens,
        "tokens_read": len(document.token_ids),
        "truncated": document.truncated,
        "predicted": label_names[int(scoring.predicted[row])],
        "probs": dict(zip(label_names, compact(probs), strict=True)),
        "temperature": temperature,
        "logits": dict(zip(label_names, compact(logits.numpy()), strict=True)),
        "contribution_bias": dict(zip(label_names, compact(bias), strict=True)),
        "scores": {name: _per_word(document, values[row]) for name, values in scores.items()},
    }


def contrast_classes(probs: Sequence[float], true_class: int | None) -> list[int]:
    """The classes whose contributions a record keeps, most probable first: the top two, the
    next ones while their probability is at least :data:`CONTRAST_PROBABILITY` (at most
    :data:`CONTRAST_MOST` in all), and the true class when it is not among them."""
    order = sorted(range(len(probs)), key=lambda c: -probs[c])
    chosen = order[:2] + [c for c in order[2:CONTRAST_MOST] if probs[c] >= CONTRAST_PROBABILITY]
    if true_class is not None and true_class not in chosen:
        chosen.append(true_class)
    return chosen


def _empty_record(text: str) -> dict[str, Any]:
    return {
        "text": text,
        "words": [],
        "spans": [],
        "words_read": 0,
        "n_tokens": 0,
        "tokens_read": 0,
        "truncated": False,
        "predicted": None,
        "error": EMPTY_DOCUMENT,
        "scores": {},
    }


def _add_contributions(
    record: dict[str, Any],
    document: DocumentInput,
    scoring: ScoringPass,
    row: int,
    label_names: list[str],
    classes: str,
    label: str | None,
) -> None:
    every = scoring.contributions[row]  # [T,C]
    if classes == "all":
        kept = list(range(len(label_names)))
    else:
        # Chosen by the raw probabilities, so the classes a record keeps (and their word
        # scores) do not depend on the model's calibration.
        probs = torch.softmax(scoring.logits[row].double().cpu(), -1).tolist()
        true_class = label_names.index(label) if label in label_names else None
        kept = contrast_classes(probs, true_class)
        # Logits and biases only of the classes kept, too: at 150 classes they were most of a
        # short request's record. The probabilities stay whole.
        names = [label_names[c] for c in kept]
        for key in ("logits", "contribution_bias"):
            record[key] = {name: record[key][name] for name in names}
    record["contributions"] = {label_names[c]: _per_word(document, every[:, c]) for c in kept}
    record["contribution_mean"] = _per_word(document, every.mean(dim=1))


def explain_documents(
    classifier: TrainedClassifier,
    texts: Sequence[str],
    doc_ids: Sequence[Any] | None = None,
    labels: Sequence[str | None] | None = None,
    batch_size: int = 16,
    classes: Literal["predicted", "contrast", "all"] = "predicted",
    layer_map_max_words: int = LAYER_MAP_MAX_WORDS,
    device: str | torch.device = "cpu",
) -> list[dict[str, Any]]:
    """One explanation record per text, in input order (see :mod:`docclass.interpret.records`).

    Args:
        classifier: the trained network, its tokenizer, label names and token limit.
        texts: the documents.
        doc_ids: an id per document (default: its position).
        labels: the true label name per document, or None where unknown.
        batch_size: documents per forward pass; the attention weights hold ``B·H·T²`` floats.
        classes: which classes' contributions the record keeps in ``contributions{class:
            [...]}`` beside the predicted class's own (``scores.contribution``): none
            (predicted), those worth contrasting (:func:`contrast_classes`, with
            ``contribution_mean``, every word's mean contribution over all classes, so a
            class's share net of what a word adds to all alike stays exact), or every class.
        layer_map_max_words: whole documents of at most this many words also carry
            ``layer_maps[L][H][W][W]``, each block's word-to-word attention per head.
        device: where to run the model.
    """
    texts = list(texts)
    doc_ids = list(doc_ids) if doc_ids is not None else list(range(len(texts)))
    labels = list(labels) if labels is not None else [None] * len(texts)
    if not len(doc_ids) == len(labels) == len(texts):
        raise ValueError("texts, doc_ids and labels must have the same length")
    model = float32_model(classifier.model.to(device).eval())
    documents = encode_documents(classifier.tokenizer, texts, classifier.max_tokens)
    records = [_empty_record(text) for text in texts]
    bias = model.contribution_bias().detach().double().cpu().numpy()
    rows = [document.token_ids for document in documents]
    # Word-to-word maps need each head's attention; everything else reads the heads' mean,
    # and keeping every head of every block made a MiniLM pass cost more than twice a plain one. The
    # batcher groups similar lengths, so short documents mostly share their batches.
    short = [
        not document.truncated and len(document.alignment.word_spans) <= layer_map_max_words
        for document in documents
    ]
    for indices, input_ids, mask in batched(rows, batch_size, model.config.pad_id, device):
        maps = any(short[i] for i in indices)
        scoring = scoring_pass(model, input_ids, mask, head_weights=maps)
        scores = token_scores(scoring)
        # Shallower rollouts, for the page's depth switch (the full one is a scored method).
        depths = rollout_by_depth(
            scoring.layer_weights, scoring.pool_weights.mean(dim=1), scoring.windows
        )[:-1]
        for row, i in enumerate(indices):
            document = documents[i]
            record = _record(
                document, texts[i], row, scoring, scores, classifier.label_names, bias,
                classifier.temperature,
            )  # fmt: skip
            if depths:
                record["rollout_depths"] = [_per_word(document, flow[row]) for flow in depths]
            if classes != "predicted":
                names = classifier.label_names
                _add_contributions(record, document, scoring, row, names, classes, labels[i])
            if scoring.layer_weights and short[i]:
                weights_row = _single_window_row(scoring, row)
                if weights_row is not None:
                    record["layer_maps"] = _layer_maps(document, scoring, weights_row)
            records[i] = record
    return [
        {"id": doc_id, "label": label, **record}
        for record, doc_id, label in zip(records, doc_ids, labels, strict=True)
    ]


def class_contrast(
    classifier: TrainedClassifier,
    texts: Sequence[str],
    toward: Sequence[str],
    against: Sequence[str],
    method: str,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
) -> list[list[float]]:
    """Per word of each text, how much ``method`` says it raises the logit of class
    ``toward[i]`` above that of ``against[i]``: why the one class rather than the other.

    For class contribution this is ``contribution(toward) − contribution(against)``; for a
    relevance method (gradient × input, conservative propagation) the relevance of the logit
    difference (which is also the log-probabilities' difference), carried back by the same
    rule in one pass. An empty document gets ``[]``.

    Raises:
        ValueError: ``method`` is not class-specific (:data:`CONTRAST_RULES`), or a class name
            is not one of the model's.
    """
    if method not in CONTRAST_RULES:
        raise ValueError(
            f"method {method!r} scores words whatever the class; a contrast needs one of "
            f"{sorted(CONTRAST_RULES)}"
        )
    names = list(classifier.label_names)
    unknown = sorted({c for c in [*toward, *against] if c not in names})
    if unknown:
        raise ValueError(f"classes {unknown} are not among the model's labels {names}")
    model = float32_model(classifier.model.to(device).eval())
    documents = encode_documents(classifier.tokenizer, texts, classifier.max_tokens)
    scores: list[list[float]] = [[] for _ in documents]
    rows = [document.token_ids for document in documents]
    rule = CONTRAST_RULES[method]
    for indices, input_ids, mask in batched(rows, batch_size, model.config.pad_id, device):
        high = torch.tensor([names.index(toward[i]) for i in indices], device=input_ids.device)
        low = torch.tensor([names.index(against[i]) for i in indices], device=input_ids.device)
        if rule is None:
            with torch.no_grad():
                out = model(input_ids, mask)
                every = model.token_contributions(out.token_states, out.pool_weights)  # [B,T,C]
                picked = torch.arange(len(indices), device=every.device)
                difference = every[picked, :, high] - every[picked, :, low]
        else:
            difference = word_relevance(model, input_ids, mask, high, rule, against=low)
        for row, i in enumerate(indices):
            scores[i] = _per_word(documents[i], difference[row])
    return scores
