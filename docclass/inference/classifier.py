"""The Python face of docclass: ``DocClassifier.load(path)`` → ``predict`` and ``explain``.

    from docclass import DocClassifier
    clf = DocClassifier.load("reports/bbc/checkpoints/last.ckpt")
    clf.predict(["Shares rose after the results..."])
    # [{'label': 'business', 'score': 0.97, 'probs': {...}, 'truncated': False}]
    clf.explain("Shares rose after the results...")  # the report's word-score record

``predict`` returns what users of Hugging Face's ``pipeline("text-classification")`` expect
(``label`` and ``score``), plus every class probability. Loading runs no training code and
executes no pickle (``torch.load(weights_only=True)``, or safetensors for a model folder).
Word scores come from the method the model's own faithfulness table trusts most unless another
is asked for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

from docclass.artifacts.load import TrainedClassifier, load_classifier
from docclass.calibration import TEMPERATURE_RANGE, scaled_probabilities
from docclass.errors import ConfigError
from docclass.inference.model_facts import (
    fitted_temperature,
    model_calibration,
    model_default_method,
)
from docclass.interpret.default_method import UNMEASURED_DEFAULT, DefaultMethod
from docclass.interpret.explain import explain_documents
from docclass.interpret.inputs import DocumentInput, batched, encode_documents, forward_batches
from docclass.interpret.methods import (
    BATCH_METHODS,
    RELEVANCE_METHODS,
    predicted_class_contribution,
    scoring_pass,
    word_relevance,
)
from docclass.interpret.records import EMPTY_DOCUMENT
from docclass.nn.model import DocumentClassifier

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# The error row of a document whose logits are not finite (weights that diverged).
NOT_FINITE = "the model's output is not finite (its weights diverged): retrain it"


def not_text(text: Any) -> str | None:
    """Why ``text`` cannot be classified, or None: a value that is not a string (a table's
    missing value arrives as NaN) or one holding lone surrogates. The tokenizer's TypeError
    named neither the document nor the fix."""
    if not isinstance(text, str):
        return (
            f"not text ({type(text).__name__}): give each document as a string (a missing "
            "value in a table, say, as '')"
        )
    if LONE_SURROGATE.search(text):
        return "holds lone surrogates, not text: decode its bytes with errors='replace'"
    return None


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else as torch spells it, checked
    against this machine: a misspelt or absent device was torch's traceback, after the data had
    loaded (an audit's, after its first fold had trained)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if resolved.type == "mps" and torch.backends.mps.is_available():
        return resolved  # Apple silicon: what LitServe's "auto" hands a serve worker there
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: use auto, cpu, cuda or cuda:N")
    if resolved.type == "cuda":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible == 0:
            raise ConfigError(f"--device {device}: no CUDA device is visible; use --device cpu")
        if resolved.index is not None and resolved.index >= visible:
            raise ConfigError(
                f"--device {device}: {visible} CUDA device(s) are visible (cuda:0 to "
                f"cuda:{visible - 1})"
            )
    return resolved


# The methods an API call may ask for: the report's batch methods (integrated gradients needs
# dozens of passes per document and stays in the report and ``docclass faithfulness``). The
# Literal types the command-line flag and the server's request body.
WordScoreMethod = Literal["attention", "contribution", "rollout", "grad_input", "conservative"]
API_METHODS = get_args(WordScoreMethod)
# Read off the forward pass itself; the others need every block's attention or a backward pass.
FORWARD_METHODS = ("attention", "contribution")


def _word_fields(
    text: str, document: DocumentInput, token_scores: np.ndarray
) -> tuple[dict[str, Any], np.ndarray]:
    """Every word the model read with its score (the sum over its pieces), as result fields
    and as the unrounded sums."""
    n_read = len(document.token_ids)
    per_word = np.bincount(document.token_words, weights=token_scores[:n_read])
    spans = document.alignment.word_spans[: len(per_word)]
    fields = {
        "words": [text[start:end] for start, end in spans],
        "spans": [list(span) for span in spans],
        "scores": [round(float(a), 6) for a in per_word],
    }
    return fields, per_word


def _top_words(fields: dict[str, Any], per_word: np.ndarray, k: int) -> list[dict[str, Any]]:
    best = np.argsort(-per_word, kind="stable")[:k]
    return [
        {
            "word": fields["words"][w],
            "start": fields["spans"][w][0],
            "end": fields["spans"][w][1],
            "score": fields["scores"][w],
        }
        for w in best
    ]


def _result(
    probs: np.ndarray,
    names: list[str],
    document: DocumentInput,
    min_probability: float | None = None,
) -> dict[str, Any]:
    best = int(probs.argmax())
    result = {
        "label": names[best],
        "score": round(float(probs[best]), 6),
        "probs": {name: round(float(p), 6) for name, p in zip(names, probs, strict=True)},
        "truncated": document.truncated,
    }
    if min_probability is not None:
        # Below the threshold the label is withheld, not guessed: whoever reads only ``label``
        # takes no unsure one for sure. The model's choice stays in ``predicted``.
        # Compared as shown: a score copied from a result as the threshold accepts its result.
        uncertain = result["score"] < min_probability
        result.update(predicted=names[best], uncertain=uncertain)
        if uncertain:
            result["label"] = None
    return result


def _scored_batches(
    model: DocumentClassifier,
    documents: list[DocumentInput],
    batch_size: int,
    device: torch.device | str,
    method: str | None,
    batch_tokens: int | None = None,
):
    """``(document indices, logits [B,C], token scores [B,T] or None)`` per batch: the forward
    pass alone when no method (or one read off it) is asked for, the scoring pass otherwise."""
    if method is None or method in FORWARD_METHODS:
        for indices, out in forward_batches(model, documents, batch_size, device, batch_tokens):
            scores = None
            # The generator's inference mode does not reach this frame between its yields.
            with torch.inference_mode():
                if method == "attention":
                    scores = out.pool_weights.mean(dim=1)
                elif method == "contribution":
                    every_class = model.token_contributions(out.token_states, out.pool_weights)
                    scores = predicted_class_contribution(every_class, out.logits.argmax(dim=-1))
            yield indices, out.logits, scores
        return
    rows = [document.token_ids for document in documents]
    for indices, input_ids, mask in batched(
        rows, batch_size, model.config.pad_id, device, batch_tokens
    ):
        if method in RELEVANCE_METHODS:
            # One rule's pass alone: the others' passes and every block's attention are not read.
            with torch.no_grad():
                logits = model(input_ids, mask).logits
            rule = RELEVANCE_METHODS[method]
            yield indices, logits, word_relevance(model, input_ids, mask, logits.argmax(-1), rule)
            continue
        scoring = scoring_pass(model, input_ids, mask, relevance_methods=())
        yield indices, scoring.logits, BATCH_METHODS[method](scoring)


def classify_texts(
    classifier: TrainedClassifier,
    texts: Sequence[str],
    batch_size: int = 64,
    top_words: int = 0,
    device: torch.device | str = "cpu",
    word_scores: bool = False,
    method: str = UNMEASURED_DEFAULT,
    batch_tokens: int | None = None,
    temperature: float = 1.0,
    min_probability: float | None = None,
) -> list[dict[str, Any]]:
    """Classify ``texts``; one result per text, in order.

    Args:
        classifier: network, tokenizer, labels, token limit.
        texts: the documents.
        batch_size: most documents per forward pass; batches hold texts of similar length, so a
            batch can be smaller.
        batch_tokens: most padded tokens per forward pass; None: 2,048 on the CPU (faster
            there than larger batches), no limit on a GPU; 0: no limit.
        top_words: also return this many words with the highest ``method`` scores.
        device: where the model runs (it is moved there).
        word_scores: also return every word the model read (``words``, character ``spans``)
            with its ``method`` score (``scores``, summed over the word's pieces).
        method: the word-score method (:data:`API_METHODS`), named in each result.
        temperature: every logit is divided by it before the softmax (1: the raw
            probabilities); labels and word scores do not depend on it.
        min_probability: when given, each result also carries ``predicted`` (the model's
            label) and ``uncertain`` (its probability is below this); an uncertain result's
            ``label`` is None.

    Returns:
        ``{label, score, probs, truncated[, method, top_words][, words, spans, scores]}`` per
        text, or ``{label: None, score: None, error}`` for a text with nothing to classify.
    """
    if method not in API_METHODS:
        raise ConfigError(f"method {method!r}: choose one of {', '.join(API_METHODS)}")
    low, high = TEMPERATURE_RANGE
    if not low <= temperature <= high:
        raise ConfigError(f"temperature {temperature}: not in [{low}, {high}]")
    # -2 top words returned every word but the last two; 0 documents a batch ran none.
    for name, value, least in (("top_words", top_words, 0), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{name} {value!r}: give a whole number of at least {least}")
    if min_probability is not None and not 0 < min_probability <= 1:
        raise ConfigError(
            f"min_probability {min_probability}: give a probability in (0, 1], such as a "
            "threshold the report lists for a target precision"
        )
    model = classifier.model.to(device).eval()
    # Such a text gets its error row and the others their rows, as an empty one does.
    unreadable = {i: reason for i, text in enumerate(texts) if (reason := not_text(text))}
    readable = [text if i not in unreadable else "" for i, text in enumerate(texts)]
    documents = encode_documents(classifier.tokenizer, readable, classifier.max_tokens)
    results: list[dict[str, Any]] = [
        {"label": None, "score": None, "error": unreadable.get(i, EMPTY_DOCUMENT)}
        for i in range(len(texts))
    ]
    wants_words = bool(top_words or word_scores)
    scored = method if wants_words else None
    batches = _scored_batches(model, documents, batch_size, device, scored, batch_tokens)
    for indices, logits, scores in batches:
        probs = scaled_probabilities(logits, temperature).cpu().numpy()
        token_scores = scores.double().cpu().numpy() if wants_words else None
        finite = torch.isfinite(logits).all(dim=-1).cpu().tolist()
        for row, i in enumerate(indices):
            if not finite[row]:
                # NaN's argmax is the first class: a diverged model labelled every document
                # with it, score NaN. An error row instead, as for a text it cannot read.
                results[i] = {"label": None, "score": None, "error": NOT_FINITE}
                continue
            result = _result(probs[row], classifier.label_names, documents[i], min_probability)
            if wants_words:
                result["method"] = method
                fields, per_word = _word_fields(texts[i], documents[i], token_scores[row])
                if top_words:
                    result["top_words"] = _top_words(fields, per_word, top_words)
                if word_scores:
                    result.update(fields)
            results[i] = result
    return results


class DocClassifier:
    """A trained docclass model ready to classify and explain documents.

    Args:
        trained: the checkpoint's network, tokenizer, labels and token limit.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1``, …
        default: the word-score method to explain with (by default the folder's recorded one).
        calibration: the temperature and its figures, measured on these weights; by default
            the model folder's recorded one (a checkpoint, or a folder without one: the
            probabilities stay raw).
    """

    def __init__(
        self,
        trained: TrainedClassifier,
        device: str = "auto",
        default: DefaultMethod | None = None,
        calibration: dict[str, Any] | None = None,
    ) -> None:
        self.trained = trained
        self.device = resolve_device(device)
        self.trained.model.to(self.device).eval()
        self.default = default or model_default_method(
            "", trained.folder_config, lambda: trained.fingerprint
        )
        self.calibration = calibration or model_calibration(
            "", trained.folder_config, lambda: trained.fingerprint
        )
        # explain() builds records from ``trained``: their probabilities are predict()'s. A
        # copy, so the caller's classifier keeps its own.
        self.trained = trained.with_temperature(self.temperature)

    @classmethod
    def load(cls, path: str | Path, device: str = "auto") -> DocClassifier:
        """Load a checkpoint written by ``docclass fit``, a folder written by ``docclass
        export``, or such a folder on the hub (``hub:owner/name@<commit>``); no pickle executed.
        Word scores default to the method the model's own faithfulness measurements trust
        most (:attr:`default_method`). A device this machine lacks fails before the load."""
        resolve_device(device)
        trained = load_classifier(path)
        default = model_default_method(path, trained.folder_config, lambda: trained.fingerprint)
        calibration = model_calibration(path, trained.folder_config, lambda: trained.fingerprint)
        return cls(trained, device, default, calibration)

    @property
    def temperature(self) -> float:
        """What ``predict`` divides the logits by: the temperature fitted on the validation
        split for these weights (``docclass calibrate``, run by ``docclass fit``); 1 when the
        weights are uncalibrated or no temperature fitted (:attr:`temperature_fitted`)."""
        return float(self.calibration["temperature"]) if self.calibration else 1.0

    @property
    def calibrated(self) -> bool:
        """Whether these weights were calibrated (thresholds were chosen on the probabilities
        ``predict`` gives); see :attr:`temperature_fitted`."""
        return self.calibration is not None

    @property
    def temperature_fitted(self) -> bool:
        """Whether a temperature was fitted; False when uncalibrated, or when no temperature
        fitted (the probabilities stay raw: ``calibration["fit"]`` says why)."""
        return fitted_temperature(self.calibration) is not None

    def check_threshold(self, min_probability: float | None, calibrated: bool = True) -> None:
        """Refuse a ``min_probability`` that would be held against probabilities it was not
        chosen on: thresholds are chosen on the calibrated ones (the report lists them), and
        against raw ones would accept another set of documents without a word."""
        if min_probability is None:
            return
        if not calibrated and self.temperature_fitted:
            raise ConfigError(
                f"min_probability {min_probability}: thresholds apply to the calibrated "
                "probabilities; do not ask for the raw ones (calibrated false) with it"
            )
        if not self.calibrated:
            raise ConfigError(
                f"min_probability {min_probability}: these weights have no calibration; run "
                "'docclass calibrate --ckpt <checkpoint> --data <its config>' on the run's "
                "checkpoint (and export it again for a model folder)"
            )

    @property
    def default_method(self) -> str:
        """The word-score method ``predict`` uses unless told otherwise; ``default_reason``
        says why."""
        return self.default.method

    @property
    def default_reason(self) -> str:
        return self.default.reason

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
        word_scores: bool = False,
        method: str | None = None,
        batch_tokens: int | None = None,
        calibrated: bool = True,
        min_probability: float | None = None,
    ) -> list[dict[str, Any]]:
        """``[{label, score, probs, truncated[, method, top_words][, words, spans, scores]}]``.

        One result per text, in order; a single string is treated as one document (a
        one-element list comes back). ``word_scores`` adds every word read with its score;
        ``top_words`` the K highest. Scores come from ``method`` (attention, contribution,
        rollout, grad_input, conservative), by default :attr:`default_method`; each
        result names it.
        A forward pass holds at most ``batch_size`` documents and ``batch_tokens`` padded
        tokens (default: 2,048 on the CPU, no limit on a GPU; 0: no limit).
        ``score`` and ``probs`` are calibrated (:attr:`temperature`) unless ``calibrated`` is
        False, which gives the raw softmax; the label is the same either way. With
        ``min_probability``, a result whose ``score`` is below it is ``uncertain``: its
        ``label`` is None and ``predicted`` keeps the model's label (the report lists the
        threshold that reached 95 % and 99 % precision on validation).
        """
        if isinstance(texts, str | bytes):  # one document (bytes: one error row, not a row a byte)
            texts = [texts]
        self.check_threshold(min_probability, calibrated)
        return classify_texts(
            self.trained,
            list(texts),
            batch_size,
            top_words,
            self.device,
            word_scores,
            method or self.default_method,
            batch_tokens,
            self.temperature if calibrated else 1.0,
            min_probability,
        )

    def explain(self, text: str, all_classes: bool = False) -> dict[str, Any]:
        """The word-score record of the HTML report for one document (every method; with
        ``all_classes``, every class's contributions too)."""
        if reason := not_text(text):
            raise ConfigError(f"explain: the text {reason}")
        classes = "all" if all_classes else "predicted"
        return explain_documents(self.trained, [text], classes=classes, device=self.device)[0]
