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

from docclass.checkpoint import TrainedClassifier, load_classifier
from docclass.explain import EMPTY_DOCUMENT, explain_documents
from docclass.model import length_batches, pad_token_ids
from docclass.tokenizer import align_words, encode_batch


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else as torch spells it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _attention_per_word(encoding, n_read: int, weights: np.ndarray):
    """Spans of the words the model read and the pool attention summed over each word's pieces."""
    alignment = align_words(encoding)
    token_words = np.asarray(alignment.token_words[:n_read], dtype=np.int64)
    per_word = np.bincount(token_words, weights=weights[:n_read])
    return alignment.word_spans[: len(per_word)], per_word


def _top_words(text: str, spans, per_word: np.ndarray, k: int) -> list[dict]:
    best = np.argsort(-per_word, kind="stable")[:k]
    return [
        {
            "word": text[spans[w][0] : spans[w][1]],
            "start": spans[w][0],
            "end": spans[w][1],
            "attention": round(float(per_word[w]), 6),
        }
        for w in best
    ]


@torch.inference_mode()
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
        batch_size: most documents per forward pass; batches hold texts of similar length
            (``length_batches``), so a batch can be smaller.
        top_words: also return this many words with the highest mean pool attention.
        device: where the model runs (it is moved there).
        word_attention: also return every word the model read (``words``, character ``spans``)
            with its pool attention (``attention``, heads averaged, summed over the word's pieces).

    Returns:
        ``{label, score, probs, truncated[, top_words][, words, spans, attention]}`` per text,
        or ``{label: None, score: None, error}`` for a text with nothing to classify.
    """
    model = classifier.model.to(device).eval()
    encodings = encode_batch(classifier.tokenizer, texts)
    limit = classifier.max_tokens
    results: list[dict[str, Any] | None] = [None] * len(texts)
    readable = []
    for i, encoding in enumerate(encodings):
        if encoding.ids:
            readable.append(i)
        else:
            results[i] = {"label": None, "score": None, "error": EMPTY_DOCUMENT}
    read = [min(len(encodings[i].ids), limit) if limit else len(encodings[i].ids) for i in readable]
    names = classifier.label_names
    for group in length_batches(read, batch_size):
        batch = [readable[g] for g in group]
        ids = [encodings[i].ids[:limit] if limit else encodings[i].ids for i in batch]
        input_ids, mask = pad_token_ids(ids, classifier.model.config.pad_id)
        out = model(input_ids.to(device), mask.to(device))
        probs = torch.softmax(out.logits.float(), dim=-1).cpu().numpy()
        wants_attention = top_words or word_attention
        attention = out.pool_weights.float().mean(dim=1).cpu().numpy() if wants_attention else None
        for row, i in enumerate(batch):
            best = int(probs[row].argmax())
            result: dict[str, Any] = {
                "label": names[best],
                "score": round(float(probs[row, best]), 6),
                "probs": {
                    name: round(float(p), 6) for name, p in zip(names, probs[row], strict=True)
                },
                "truncated": len(ids[row]) < len(encodings[i].ids),
            }
            if attention is not None:
                spans, per_word = _attention_per_word(encodings[i], len(ids[row]), attention[row])
                if top_words:
                    result["top_words"] = _top_words(texts[i], spans, per_word, top_words)
                if word_attention:
                    result["words"] = [texts[i][start:end] for start, end in spans]
                    result["spans"] = [list(span) for span in spans]
                    result["attention"] = [round(float(a), 6) for a in per_word]
            results[i] = result
    return results  # type: ignore[return-value]


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
