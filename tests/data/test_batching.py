"""The one batcher: every index once, shortest first, within the size, budget and length limits."""

import collections
import math

import pytest
import torch
from torch.utils.data import DistributedSampler

from docclass.data.batching import collate, length_batches, pad_token_ids
from docclass.data.samplers import BucketBatchSampler, EpochShuffleSampler
from docclass.data.tokenizer import PAD_ID


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_length_batches_cover_every_index_once_with_bounded_padding(batch_size):
    lengths = [5, 400, 17, 1024, 1024, 30, 31, 380, 2, 1000, 64, 70]
    batches = length_batches(lengths, batch_size, similar_length=0.25, similar_tokens=16)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)  # shortest first
    for batch in batches:
        assert len(batch) <= batch_size
        shortest, longest = lengths[batch[0]], lengths[batch[-1]]
        assert longest <= shortest * 1.25 + 16
    if batch_size == 64:
        # Similar lengths do share a batch: 1000 and the two 1024s, 2/5/17, 380/400.
        assert [lengths[i] for i in batches[-1]] == [1000, 1024, 1024]
        assert [2, 5, 17] in [[lengths[i] for i in b] for b in batches]
        assert [380, 400] in [[lengths[i] for i in b] for b in batches]


def test_token_budget_batches_fill_the_budget_shortest_first():
    lengths = [5, 300, 7, 40, 41, 600, 6, 39]
    batches = length_batches(lengths, 3, max_batch_tokens=128)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        assert len(batch) <= 3 and (len(batch) * longest <= 128 or len(batch) == 1)
    assert [5] in batches and [1] in batches  # over-budget documents travel alone
    assert length_batches(lengths, 4) == [[0, 6, 2, 7], [3, 4, 1, 5]]


def test_masks_come_from_lengths_never_from_token_ids():
    # An id equal to the padding id inside a row is still a real token of that row.
    batch = collate(
        [
            {"input_ids": [5, PAD_ID, 7], "label": 0, "index": 0, "truncated": False},
            {"input_ids": [PAD_ID], "label": 1, "index": 1, "truncated": False},
        ]
    )
    assert batch["attention_mask"].tolist() == [[True, True, True], [True, False, False]]
    _, mask = pad_token_ids([[PAD_ID, PAD_ID], [3]], pad_to_multiple=4)
    assert mask.tolist() == [[True, True, False, False], [True, False, False, False]]


@pytest.mark.parametrize(
    "replicas, shuffle", [(1, True), (2, False), (2, True)], ids=["one", "ddp", "ddp-shuffled"]
)
def test_every_epoch_yields_the_length_lightning_read_and_every_document(replicas, shuffle):
    """Lightning reads ``len`` once per fit and stops there: every epoch of every rank must
    yield exactly that many batches, and among them every document of the epoch."""
    # Roughly BBC under MiniLM: a log-normal around 480 tokens, three windows of 800.
    generator = torch.Generator().manual_seed(0)
    size = 1700
    lengths = (torch.randn(size, generator=generator) * 0.6 + math.log(480)).exp()
    lengths = lengths.clamp(20, 2048).long().tolist()
    ranks = []
    for rank in range(replicas):
        if replicas == 1:
            inner = EpochShuffleSampler(size, seed=0)
        else:
            inner = DistributedSampler(range(size), replicas, rank, shuffle=shuffle, seed=0)
        ranks.append(BucketBatchSampler(inner, 16, False, lengths, max_batch_tokens=8192))
    length = len(ranks[0])
    assert {len(sampler) for sampler in ranks} == {length}  # ranks step together
    counts = set()
    for epoch in range(12):
        seen = collections.Counter()
        for sampler in ranks:
            sampler.sampler.set_epoch(epoch)
            counts.add(len(sampler._batches(list(sampler.sampler))))  # before any splitting
            batches = list(sampler)
            assert len(batches) == length
            for batch in batches:
                assert len(batch) <= 16 and len(batch) * max(lengths[i] for i in batch) <= 8192
            seen.update(i for batch in batches for i in batch)
        assert set(seen) == set(range(size))
        if replicas == 1:
            assert set(seen.values()) == {1}  # one device: each document exactly once
    if shuffle:
        assert len(counts) > 1  # the shuffle does change the count these lengths are cut into
    # The bound costs a few smaller steps, not a different training run.
    assert length <= max(counts) * (1.1 if replicas == 1 or not shuffle else 1.4)


def test_no_batch_is_split_when_the_count_cannot_change():
    """One window's count depends on its lengths alone, not their order: the length is the
    count, and each epoch yields the batches the budget cut, none split to pad it."""
    lengths = torch.randint(20, 2048, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    sampler = BucketBatchSampler(
        EpochShuffleSampler(300), 16, False, lengths, max_batch_tokens=8192
    )
    for epoch in range(3):
        sampler.sampler.set_epoch(epoch)
        assert list(sampler) == sampler._batches(list(sampler.sampler))
    # Equal lengths under a shuffled DistributedSampler: every share cuts the same way.
    for rank in (0, 1):
        shuffled = DistributedSampler(range(301), 2, rank, shuffle=True)
        sampler = BucketBatchSampler(shuffled, 16, False, [64] * 301, max_batch_tokens=512)
        assert len(sampler) == -(-151 // 8)  # 8 of 64 tokens fill the budget
