"""Word scores: how much each word of a document weighed in a trained classifier's decision.

Subword tokens are grouped into the pre-tokenizer's words with the tokenizer's character offsets
(:func:`docclass.tokenizer.align_words`), and every method's token scores are summed over a
word's pieces. The methods:

==================  ======  ==================================================================
name                signed  what it is
==================  ======  ==================================================================
attention           no      the global pool's weights, mean over its heads; sums to 1
attention_head<h>   no      one pool head's weights; sums to 1
contribution        yes     the word's exact additive share of the predicted class's logit
                            (the read-out after the pool is linear); sums to logit − bias
rollout             no      attention rollout (Abnar & Zuidema 2020): per block Â = ½A + ½I
                            with heads averaged, multiplied through the blocks, then weighted by
                            the pool's mean attention; sums to 1
grad_input          yes     gradient of the predicted logit × the token embedding (positions
                            excluded), summed over the embedding width
==================  ======  ==================================================================

Attention methods say where the model looked, not why; how far each method can be trusted is a
separate measurement, so the report shows them side by side rather than picking one.

A document longer than the model's ``max_tokens`` keeps all its words: those past the cut get
score 0 and ``words_read`` says how many words the model saw.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from docclass.attention import banded_flow, banded_to_dense
from docclass.checkpoint import TrainedClassifier
from docclass.model import DocumentClassifier, length_batches, pad_token_ids
from docclass.tokenizer import WordAlignment, align_words, encode_batch

SIGNED_METHODS = ("contribution", "grad_input")
EMPTY_DOCUMENT = "empty document: no text to classify"
# Per-layer, per-head word-by-word maps are drawn only for documents this short: beyond it the
# map is unreadable, and skipping it keeps whole-corpus reports fast.
LAYER_MAP_MAX_WORDS = 60


def method_names(pool_heads: int) -> list[str]:
    """Every method a record carries, in the order a report offers them."""
    heads = [f"attention_head{h}" for h in range(pool_heads)]
    return ["attention", "contribution", "rollout", "grad_input", *heads]


@dataclass
class _Document:
    """One input document, tokenized and aligned, before the model has seen it."""

    position: int  # index in the caller's sequence: results come back in input order
    text: str
    doc_id: Any
    label: str | None
    alignment: WordAlignment
    token_ids: list[int]  # cut to max_tokens
    n_tokens: int  # before the cut


def _prepare(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    doc_ids: Sequence[Any],
    labels: Sequence[str | None],
    max_tokens: int | None,
) -> list[_Document]:
    documents = []
    encodings = encode_batch(tokenizer, texts)
    for position, (text, encoding) in enumerate(zip(texts, encodings, strict=True)):
        ids = encoding.ids
        documents.append(
            _Document(
                position=position,
                text=text,
                doc_id=doc_ids[position],
                label=labels[position],
                alignment=align_words(encoding),
                token_ids=ids[:max_tokens] if max_tokens else ids,
                n_tokens=len(ids),
            )
        )
    return documents


def _compact(values: np.ndarray) -> list[float]:
    """Floats with 6 significant digits: exact enough to rank and sum, small in JSONL."""
    return [float(f"{value:.6g}") for value in values.tolist()]


def _rollout(layer_weights: list[torch.Tensor], pool_mean: torch.Tensor) -> torch.Tensor:
    """``pool_mean [B,T]`` carried back through every block's ``Â = ½·mean_h(A) + ½·I``."""
    flow = pool_mean  # (B, T)
    for weights in reversed(layer_weights):
        mixed = weights.mean(dim=1)  # (B, T, T) rows: queries; banded (B, nb, w, 3w) if windowed
        carried = (
            banded_flow(flow, mixed) if mixed.dim() == 4 else (flow.unsqueeze(1) @ mixed).squeeze(1)
        )
        # flow · (½A + ½I) without building the identity matrix.
        flow = 0.5 * carried + 0.5 * flow
    return flow


def _batches(documents: list[_Document], batch_size: int) -> Iterator[list[_Document]]:
    # Similar lengths together: padding would otherwise dominate the O(T²) explicit attention.
    for group in length_batches([len(d.token_ids) for d in documents], batch_size):
        yield [documents[i] for i in group]


def _score_batch(
    model: DocumentClassifier, batch: list[_Document], device: torch.device
) -> dict[str, torch.Tensor]:
    """Run one padded batch once, with gradients on the embeddings, and collect token scores."""
    input_ids, mask = pad_token_ids([d.token_ids for d in batch], model.config.pad_id)
    input_ids, mask = input_ids.to(device), mask.to(device)

    with torch.enable_grad():
        token_part = model.embed(input_ids) * model.embed_scale  # (B, T, D)
        embedded = model.embed_tokens(input_ids).detach().requires_grad_(True)
        out = model(input_ids, mask, need_layer_weights=True, inputs_embeds=embedded)
        predicted = out.logits.argmax(dim=-1)
        # Documents do not interact in eval mode, so one backward pass serves the whole batch.
        target = out.logits.gather(1, predicted[:, None]).sum()
        (gradient,) = torch.autograd.grad(target, embedded)
    with torch.no_grad():
        pool_weights = out.pool_weights.detach()  # (B, H, T)
        pool_mean = pool_weights.mean(dim=1)
        layer_weights = [weights.detach() for weights in out.layer_weights or []]
        return {
            "logits": out.logits.detach(),
            "pool_weights": pool_weights,
            "attention": pool_mean,
            "contributions": model.token_contributions(out.token_states.detach(), pool_weights),
            "rollout": _rollout(layer_weights, pool_mean),
            "grad_input": (gradient * token_part.detach()).sum(dim=-1) * mask,
            "layer_weights": layer_weights,
        }


def _word_matrix_mean(
    token_matrix: np.ndarray, token_words: np.ndarray, n_words: int, pieces: np.ndarray
) -> np.ndarray:
    """``[T,T]`` query→key weights → ``[W,W]``: summed over key pieces, averaged over queries."""
    membership = np.zeros((n_words, len(token_words)))  # (W, T) one-hot
    membership[token_words, np.arange(len(token_words))] = 1.0
    return membership @ token_matrix @ membership.T / pieces[:, None]


def _record(
    document: _Document,
    row: int,
    scores: dict[str, torch.Tensor],
    label_names: list[str],
    bias: np.ndarray,
    all_classes: bool,
    layer_map_max_words: int,
) -> dict[str, Any]:
    n_read = len(document.token_ids)
    token_words = np.asarray(document.alignment.token_words[:n_read], dtype=np.int64)
    spans = document.alignment.word_spans
    n_words = len(spans)

    def per_word(token_scores: torch.Tensor) -> list[float]:
        values = token_scores[:n_read].double().cpu().numpy()
        return _compact(np.bincount(token_words, weights=values, minlength=n_words))

    logits = scores["logits"][row].double().cpu()
    probs = torch.softmax(logits, dim=-1).numpy()
    predicted = int(logits.argmax())
    contributions = scores["contributions"][row]  # (T, C)
    methods = {
        "attention": per_word(scores["attention"][row]),
        "contribution": per_word(contributions[:, predicted]),
        "rollout": per_word(scores["rollout"][row]),
        "grad_input": per_word(scores["grad_input"][row]),
    }
    for head, weights in enumerate(scores["pool_weights"][row]):
        methods[f"attention_head{head}"] = per_word(weights)

    record: dict[str, Any] = {
        "id": document.doc_id,
        "text": document.text,
        "words": [document.text[start:end] for start, end in spans],
        "spans": [list(span) for span in spans],
        "words_read": int(token_words[-1]) + 1 if n_read else 0,
        "n_tokens": document.n_tokens,
        "tokens_read": n_read,
        "truncated": n_read < document.n_tokens,
        "label": document.label,
        "predicted": label_names[predicted],
        "probs": dict(zip(label_names, _compact(probs), strict=True)),
        "logits": dict(zip(label_names, _compact(logits.numpy()), strict=True)),
        "contribution_bias": dict(zip(label_names, _compact(bias), strict=True)),
        "scores": methods,
    }
    if all_classes:
        record["contributions"] = {
            name: per_word(contributions[:, c]) for c, name in enumerate(label_names)
        }
    if scores["layer_weights"] and not record["truncated"] and n_words <= layer_map_max_words:
        pieces = np.bincount(token_words, minlength=record["words_read"]).clip(min=1)
        record["layer_maps"] = [
            [
                np.round(
                    _word_matrix_mean(
                        head[:n_read, :n_read].double().cpu().numpy(),
                        token_words,
                        record["words_read"],
                        pieces,
                    ),
                    5,
                ).tolist()
                for head in _dense_rows(layer, row, n_read)
            ]
            for layer in scores["layer_weights"]
        ]
    return record


def _dense_rows(layer: torch.Tensor, row: int, n_read: int) -> torch.Tensor:
    """One document's ``[H,T,T]`` block weights, expanding banded (windowed) weights."""
    if layer.dim() == 5:
        return banded_to_dense(layer[row : row + 1], n_read)[0]
    return layer[row]


def _empty_record(document: _Document) -> dict[str, Any]:
    return {
        "id": document.doc_id,
        "text": document.text,
        "words": [],
        "spans": [],
        "words_read": 0,
        "n_tokens": 0,
        "tokens_read": 0,
        "truncated": False,
        "label": document.label,
        "predicted": None,
        "error": EMPTY_DOCUMENT,
        "scores": {},
    }


def explain_documents(
    classifier: TrainedClassifier,
    texts: Sequence[str],
    doc_ids: Sequence[Any] | None = None,
    labels: Sequence[str | None] | None = None,
    batch_size: int = 16,
    all_classes: bool = False,
    layer_map_max_words: int = LAYER_MAP_MAX_WORDS,
    device: str | torch.device = "cpu",
) -> list[dict[str, Any]]:
    """One explanation record per text, in input order.

    Args:
        classifier: the trained network, its tokenizer, label names and token limit.
        texts: the documents.
        doc_ids: an id per document (default: its position).
        labels: the true label name per document, or None where unknown.
        batch_size: documents per forward pass; the explicit attention holds ``B·H·T²`` floats.
        all_classes: also give every word's contribution to every class, not only the predicted.
        layer_map_max_words: whole documents of at most this many words also carry
            ``layer_maps[L][H][W][W]``, each block's word-to-word attention per head.
        device: where to run the model.

    Returns:
        Records with ``id, text, words, spans, words_read, n_tokens, tokens_read, truncated, label,
        predicted, probs, logits, contribution_bias, scores{method: [per word]}`` and, on request
        or for short documents, ``contributions`` and ``layer_maps``.
    """
    texts = list(texts)
    doc_ids = list(doc_ids) if doc_ids is not None else list(range(len(texts)))
    labels = list(labels) if labels is not None else [None] * len(texts)
    if not len(doc_ids) == len(labels) == len(texts):
        raise ValueError("texts, doc_ids and labels must have the same length")
    model = classifier.model.to(device).eval()
    documents = _prepare(classifier.tokenizer, texts, doc_ids, labels, classifier.max_tokens)
    records: list[dict[str, Any] | None] = [None] * len(documents)
    for document in documents:
        if not document.token_ids:
            records[document.position] = _empty_record(document)
    bias = model.contribution_bias().detach().double().cpu().numpy()
    readable = [document for document in documents if document.token_ids]
    for batch in _batches(readable, batch_size):
        # Callers may sit inside Lightning's validation loop, which runs in inference mode;
        # gradient × input needs ordinary tensors and autograd.
        with torch.inference_mode(False):
            scores = _score_batch(model, batch, torch.device(device))
        for row, document in enumerate(batch):
            records[document.position] = _record(
                document,
                row,
                scores,
                classifier.label_names,
                bias,
                all_classes,
                layer_map_max_words,
            )
    return records  # type: ignore[return-value]


def entropy_bits(weights: Sequence[float]) -> float:
    """Shannon entropy (bits) of a weight distribution; 0 for one word taking everything."""
    return -sum(w * math.log2(w) for w in weights if w > 0)


def write_jsonl(records: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write one record per line (UTF-8, non-ASCII kept); returns how many were written."""
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read records written by :func:`write_jsonl`."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
