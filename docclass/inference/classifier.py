"""The Python face of docclass: ``DocClassifier.load(path)`` → ``predict`` and ``explain``.

    from docclass import DocClassifier
    clf = DocClassifier.load("reports/bbc/checkpoints/last.ckpt")
    clf.predict(["Shares rose after the results..."])
    # [{'label': 'business', 'score': 0.97, 'probs': {...}, 'truncated': False}]
    clf.explain("Shares rose after the results...")  # the report's word-score record

``predict`` returns what users of Hugging Face's ``pipeline("text-classification")`` expect
(``label`` and ``score``), plus every class probability. Loading runs no training code and
executes no pickle (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from docclass.interpret.explain import explain_documents
from docclass.interpret.inputs import DocumentInput, encode_documents, forward_batches
from docclass.interpret.records import EMPTY_DOCUMENT
from docclass.train.checkpoint import TrainedClassifier, load_classifier


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else as torch spells it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _word_attention(
    text: str, document: DocumentInput, weights: np.ndarray
) -> tuple[dict[str, Any], np.ndarray]:
    """Every word the model read with the pool attention summed over its pieces, as the result
    fields and as the unrounded sums."""
    n_read = len(document.token_ids)
    per_word = np.bincount(document.token_words, weights=weights[:n_read])
    spans = document.alignment.word_spans[: len(per_word)]
    fields = {
        "words": [text[start:end] for start, end in spans],
        "spans": [list(span) for span in spans],
        "attention": [round(float(a), 6) for a in per_word],
    }
    return fields, per_word


def _top_words(fields: dict[str, Any], per_word: np.ndarray, k: int) -> list[dict[str, Any]]:
    best = np.argsort(-per_word, kind="stable")[:k]
    return [
        {
            "word": fields["words"][w],
            "start": fields["spans"][w][0],
            "end": fields["spans"][w][1],
            "attention": fields["attention"][w],
        }
        for w in best
    ]


def _result(probs: np.ndarray, names: list[str], document: DocumentInput) -> dict[str, Any]:
    best = int(probs.argmax())
    return {
        "label": names[best],
        "score": round(float(probs[best]), 6),
        "probs": {name: round(float(p), 6) for name, p in zip(names, probs, strict=True)},
        "truncated": document.truncated,
    }


def classify_texts(
    classifier: TrainedClassifier,
    texts: Sequence[str],
    batch_size: int = 64,
    top_words: int = 0,
    device: torch.device | str = "cpu",
    word_attention: bool = False,
) -> list[dict[str, Any]]:
    """Classify ``texts``; one result per text, in order.

    Args:
        classifier: network, tokenizer, labels, token limit.
        texts: the documents.
        batch_size: most documents per forward pass; batches hold texts of similar length, so a
            batch can be smaller.
        top_words: also return this many words with the highest mean pool attention.
        device: where the model runs (it is moved there).
        word_attention: also return every word the model read (``words``, character ``spans``)
            with its pool attention (``attention``, heads averaged, summed over the word's pieces).

    Returns:
        ``{label, score, probs, truncated[, top_words][, words, spans, attention]}`` per text,
        or ``{label: None, score: None, error}`` for a text with nothing to classify.
    """
    model = classifier.model.to(device).eval()
    documents = encode_documents(classifier.tokenizer, texts, classifier.max_tokens)
    results: list[dict[str, Any]] = [
        {"label": None, "score": None, "error": EMPTY_DOCUMENT} for _ in texts
    ]
    wants_words = bool(top_words or word_attention)
    for indices, out in forward_batches(model, documents, batch_size, device):
        probs = torch.softmax(out.logits.float(), dim=-1).cpu().numpy()
        if wants_words:
            attention = out.pool_weights.float().mean(dim=1).cpu().numpy()
        for row, i in enumerate(indices):
            result = _result(probs[row], classifier.label_names, documents[i])
            if wants_words:
                fields, per_word = _word_attention(texts[i], documents[i], attention[row])
                if top_words:
                    result["top_words"] = _top_words(fields, per_word, top_words)
                if word_attention:
                    result.update(fields)
            results[i] = result
    return results


class DocClassifier:
    """A trained docclass model ready to classify and explain documents.

    Args:
        trained: the checkpoint's network, tokenizer, labels and token limit.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1``, …
    """

    def __init__(self, trained: TrainedClassifier, device: str = "auto") -> None:
        self.trained = trained
        self.device = resolve_device(device)
        self.trained.model.to(self.device).eval()

    @classmethod
    def load(cls, path: str | Path, device: str = "auto") -> DocClassifier:
        """Load a checkpoint written by ``docclass fit`` (no pickle executed)."""
        return cls(load_classifier(path), device)

    @property
    def labels(self) -> list[str]:
        """Class names, in the model's order."""
        return list(self.trained.label_names)

    @property
    def max_tokens(self) -> int | None:
        """Tokens read per document; the rest is cut and the result flagged ``truncated``."""
        return self.trained.max_tokens

    def predict(
        self,
        texts: str | Sequence[str],
        batch_size: int = 64,
        top_words: int = 0,
        word_attention: bool = False,
    ) -> list[dict[str, Any]]:
        """``[{label, score, probs, truncated[, top_words][, words, spans, attention]}]``.

        One result per text, in order; a single string is treated as one document (a
        one-element list comes back). ``word_attention`` adds every word read with its pool
        attention.
        """
        if isinstance(texts, str):
            texts = [texts]
        return classify_texts(
            self.trained, list(texts), batch_size, top_words, self.device, word_attention
        )

    def explain(self, text: str, all_classes: bool = False) -> dict[str, Any]:
        """The word-score record of the HTML report for one document (every method)."""
        return explain_documents(self.trained, [text], all_classes=all_classes, device=self.device)[
            0
        ]
