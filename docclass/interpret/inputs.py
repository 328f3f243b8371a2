"""The one path from texts to a trained model's inputs: text → tokens → cut → batches → forward.

The API, explanations, evaluation, bulk classification, the server and the benchmarks all go
through here, so a document is read the same way everywhere: tokenized without special
tokens, cut to the model's ``max_tokens``, batched with documents of similar length
(:func:`docclass.data.batching.length_batches`) and padded with a mask built from lengths.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from tokenizers import Encoding, Tokenizer

from docclass.data.batching import length_batches, pad_token_ids
from docclass.data.tokenizer import WordAlignment, align_words, encode_batch
from docclass.nn.model import ClassifierOutput, DocumentClassifier

# Inference batches close when the next document is over 25 % longer than the batch's shortest:
# padding then stays small (BBC: 1.09× one-at-a-time speed, against 0.66× for one padded batch).
SIMILAR_LENGTH = 0.25
# On the CPU a batch also closes before it holds more than 2,048 tokens (documents × longest):
# a batch of 64 whole BBC articles makes activations of tens of MB that miss the caches, and
# the same model ran 1.3-1.4× faster in 2,048-token batches (MiniLM 1.2×; 4,096 and 8,192
# gave less: make inference-options). On a GPU larger batches are faster: no token limit there.
CPU_BATCH_TOKENS = 2048


def batch_token_limit(batch_tokens: int | None, device: torch.device | str) -> int | None:
    """The padded-token limit of a batch: ``batch_tokens`` when given (0 = none), else
    :data:`CPU_BATCH_TOKENS` on the CPU and none elsewhere."""
    if batch_tokens is None:
        return CPU_BATCH_TOKENS if torch.device(device).type == "cpu" else None
    if batch_tokens < 0:
        raise ValueError(f"batch_tokens must be 0 (no limit) or positive, got {batch_tokens}")
    return batch_tokens or None


def float32_classifier(classifier):
    """The classifier with a float32 model (itself when it already has one): converted once
    where a pipeline starts, every per-document step below finds float32 and copies nothing."""
    model = float32_model(classifier.model)
    return classifier if model is classifier.model else dataclasses.replace(classifier, model=model)


def float32_model(model: DocumentClassifier) -> DocumentClassifier:
    """The model itself when its weights are float32 and it is not compiled; else a float32,
    uncompiled copy (eval mode).

    Word scores and their checks are sums of many small terms (contributions add up to the
    logit): with bf16 weights (``bf16-true`` training) they would be exact to bf16 only. And a
    compiled model fixes at tracing time what a propagation rule reads when its backward pass
    runs (the :class:`~docclass.nn.relevance.AttentionValve`'s state), so its conservative
    propagation would silently be gradient × input: the after-fit report explains the model
    ``compile: true`` compiled in place. The uncompiled copy shares its weights.
    """
    if getattr(model, "_compiled_call_impl", None) is not None:
        model = copy.copy(model)  # a shallow copy: the same parameters, its own call path
        model._compiled_call_impl = None
    if all(parameter.dtype == torch.float32 for parameter in model.parameters()):
        return model
    return copy.deepcopy(model).float().eval()


@dataclass
class DocumentInput:
    """One text as the model reads it.

    Attributes:
        encoding: the whole text's tokens, with character offsets.
        token_ids: the tokens the model reads: the first ``max_tokens``.
    """

    encoding: Encoding
    token_ids: list[int] = field(repr=False)

    @property
    def n_tokens(self) -> int:
        """Tokens in the whole text, before the cut."""
        return len(self.encoding.ids)

    @property
    def truncated(self) -> bool:
        return len(self.token_ids) < self.n_tokens

    @cached_property
    def alignment(self) -> WordAlignment:
        """The tokens grouped into words, with character spans."""
        return align_words(self.encoding)

    @cached_property
    def token_words(self) -> np.ndarray:
        """``[T]`` int64: the word index of every token read."""
        return np.asarray(self.alignment.token_words[: len(self.token_ids)], dtype=np.int64)

    @property
    def words_read(self) -> int:
        return int(self.token_words[-1]) + 1 if self.token_ids else 0


def encode_documents(
    tokenizer: Tokenizer, texts: Sequence[str], max_tokens: int | None
) -> list[DocumentInput]:
    """Tokenize ``texts`` in one call (the Rust side uses every core) and cut each."""
    return [
        DocumentInput(encoding, encoding.ids[:max_tokens] if max_tokens else encoding.ids)
        for encoding in encode_batch(tokenizer, texts)
    ]


def batched(
    rows: Sequence[Sequence[int]],
    batch_size: int,
    pad_id: int,
    device: torch.device | str = "cpu",
    batch_tokens: int | None = None,
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Non-empty token rows in padded batches of similar length.

    A batch holds at most ``batch_size`` rows and, on the CPU by default, 2,048 padded tokens
    (:func:`batch_token_limit`; a longer row travels alone).

    Yields:
        ``(row indices, input_ids [B,T], attention_mask [B,T])``, tensors on ``device``.
    """
    readable = [i for i, row in enumerate(rows) if len(row)]
    lengths = [len(rows[i]) for i in readable]
    limit = batch_token_limit(batch_tokens, device)
    for group in length_batches(lengths, batch_size, limit, similar_length=SIMILAR_LENGTH):
        indices = [readable[g] for g in group]
        input_ids, mask = pad_token_ids([rows[i] for i in indices], pad_id)
        yield indices, input_ids.to(device), mask.to(device)


@torch.inference_mode()
def forward_batches(
    model: DocumentClassifier,
    documents: Sequence[DocumentInput],
    batch_size: int,
    device: torch.device | str = "cpu",
    batch_tokens: int | None = None,
) -> Iterator[tuple[list[int], ClassifierOutput]]:
    """The model's output for every document with tokens, batch by batch (:func:`batched`).

    Yields:
        ``(document indices, output)``; documents without tokens are skipped.
    """
    rows = [document.token_ids for document in documents]
    pad_id = model.config.pad_id
    for indices, input_ids, mask in batched(rows, batch_size, pad_id, device, batch_tokens):
        yield indices, model(input_ids, mask)


def document_inputs(classifier, text: str, record: dict) -> tuple[torch.Tensor, np.ndarray, int]:
    """The tokens the model read of one explained document: ``(ids [T] long, token_words [T],
    predicted class index)``."""
    document = encode_documents(classifier.tokenizer, [text], classifier.max_tokens)[0]
    ids = torch.tensor(document.token_ids, dtype=torch.long)
    return ids, document.token_words, classifier.label_names.index(record["predicted"])
