"""The one batcher: every index once, shortest first, within the size, budget and length limits."""

import collections
import math

import pytest
import torch
from torch.utils.data import DistributedSampler

from docclass.data.batching import collate, length_batches, pad_token_ids
from docclass.data.samplers import BucketBatchSampler, EpochShuffleSampler
from docclass.data.tokenizer import PAD_ID
from docclass.errors import ConfigError


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


@pytest.mark.parametrize("replicas", [1, 2], ids=["one", "ddp"])
def test_every_epoch_yields_the_length_lightning_read_and_every_document(replicas):
    """Lightning reads ``len`` once per fit and stops there: every epoch of every rank must
    yield exactly that many batches, and among them every document of the epoch once."""
    # Roughly BBC under MiniLM: a log-normal around 480 tokens, three windows of 800.
    generator = torch.Generator().manual_seed(0)
    size = 1700
    lengths = (torch.randn(size, generator=generator) * 0.6 + math.log(480)).exp()
    lengths = lengths.clamp(20, 2048).long().tolist()
    ranks = [
        BucketBatchSampler(
            EpochShuffleSampler(size, seed=0), 16, False, lengths, max_batch_tokens=8192,
            rank=rank, world_size=replicas,
        )
        for rank in range(replicas)
    ]  # fmt: skip
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
        assert seen == collections.Counter(range(size))  # each document once, on one rank
    assert len(counts) > 1  # the shuffle does change the count these lengths are cut into
    # The bound costs a few smaller steps, not a different training run, on any number of
    # ranks (Lightning's shuffled distributed shares needed 98 a rank where 74 to 76 were cut).
    assert length * replicas <= max(counts) * 1.1 + replicas


def test_ranks_take_turns_at_the_batches_one_process_trains():
    """Under DDP step s of rank r is the single process's batch s·P + r: ``data.seed`` orders
    the epoch whatever the number of devices, and a resumed rank continues its own turns."""
    lengths = torch.randint(5, 300, (1600,), generator=torch.Generator().manual_seed(2)).tolist()

    def batches(rank=0, world_size=1, seed=0, resume_at=None):
        sampler = BucketBatchSampler(
            EpochShuffleSampler(1600, seed), 16, False, lengths, seed=seed, rank=rank,
            world_size=world_size, resume_at=resume_at,
        )  # fmt: skip
        sampler.sampler.set_epoch(3)
        return list(sampler)

    single = batches()
    assert len(single) == 100  # 1,600 documents, 16 a batch: nothing to split for two ranks
    assert batches(0, 2) == single[0::2] and batches(1, 2) == single[1::2]
    assert batches(1, 2, seed=1) == batches(seed=1)[1::2] != single[1::2]
    assert batches(1, 2, resume_at=(3, 5)) == single[1::2][5:]


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
    # Equal lengths on two ranks: every epoch cuts the same 38 batches (8 of 64 tokens fill
    # the budget), split once so that each rank has 19.
    for rank in (0, 1):
        sampler = BucketBatchSampler(
            EpochShuffleSampler(301), 16, False, [64] * 301, max_batch_tokens=512, rank=rank,
            world_size=2,
        )  # fmt: skip
        assert len(sampler) == 19 == len(list(sampler))


def test_a_distributed_sampler_is_refused_not_sharded_twice():
    # Lightning injects one when the trainer keeps use_distributed_sampler: each rank would then
    # take its turns out of its own half and train on a quarter of the epoch.
    with pytest.raises(ConfigError, match="use_distributed_sampler=False"):
        BucketBatchSampler(DistributedSampler(range(10), 2, 0), 4, False, [5] * 10)
