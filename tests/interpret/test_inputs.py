"""The one path from texts to model inputs: how documents are cut into batches."""

import pytest
import torch
from helpers import DOCUMENTS, tiny_classifier
from torch.testing import assert_close

from docclass.inference.classifier import classify_texts
from docclass.interpret.inputs import CPU_BATCH_TOKENS, batch_token_limit, batched

LENGTHS = [300, 310, 320, 330, 340, 350, 360, 370, 1000, 3000, 5, 6, 7]


def _batches(batch_tokens=None):
    rows = [[1] * n for n in LENGTHS]
    return [(indices, ids) for indices, ids, _ in batched(rows, 64, 0, "cpu", batch_tokens)]


def test_on_the_cpu_a_batch_stops_at_the_token_limit_and_a_longer_document_goes_alone():
    batches = _batches()
    assert sorted(i for indices, _ in batches for i in indices) == list(range(len(LENGTHS)))
    for indices, ids in batches:
        assert ids.numel() <= CPU_BATCH_TOKENS or len(indices) == 1
    assert [len(indices) for indices, ids in batches if ids.shape[1] == 3000] == [1]
    # Without the limit the eight similar documents of ~300 tokens share one batch.
    assert (8, 370) in [tuple(ids.shape) for _, ids in _batches(batch_tokens=0)]


def test_the_limit_is_the_cpus_alone_and_zero_means_none():
    assert batch_token_limit(None, "cpu") == CPU_BATCH_TOKENS
    assert batch_token_limit(None, torch.device("cuda")) is None
    assert batch_token_limit(0, "cpu") is None
    assert batch_token_limit(512, "cuda") == 512
    with pytest.raises(ValueError, match="batch_tokens"):
        batch_token_limit(-1, "cpu")


def test_how_documents_are_batched_does_not_change_what_they_get():
    classifier = tiny_classifier()
    texts = [" ".join((DOCUMENTS * 30)[k : k + n]) for k, n in enumerate((1, 5, 6, 30, 31, 12))]
    one_batch = classify_texts(classifier, texts, batch_size=64, batch_tokens=0)
    small = classify_texts(classifier, texts, batch_size=64, batch_tokens=64)
    for a, b in zip(one_batch, small, strict=True):
        assert a["label"] == b["label"]
        assert_close(
            torch.tensor(list(a["probs"].values())), torch.tensor(list(b["probs"].values()))
        )
