"""The samplers that make Lightning's DataLoader call the one batcher
(:func:`docclass.data.batching.length_batches`) every epoch: a reproducible shuffle, and batches
of similar length with a fixed count per epoch and per rank."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import BatchSampler, DistributedSampler, Sampler, SequentialSampler

from docclass.data.batching import length_batches
from docclass.errors import ConfigError


class EpochShuffleSampler(Sampler[int]):
    """``RandomSampler``'s orders, computed from ``(seed, epoch)`` instead of carried along.

    ``RandomSampler`` draws each epoch's order from a generator that advances as it goes, so a
    run resumed at epoch k would replay epoch 0's order. This sampler replays the generator up
    to epoch k instead, giving the very orders an uninterrupted ``RandomSampler`` run sees (two
    permutations per epoch: ``RandomSampler`` also draws one for its empty remainder).
    Lightning calls ``set_epoch`` each epoch.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(2 * self.epoch):
            torch.randperm(self.size, generator=generator)
        return iter(torch.randperm(self.size, generator=generator).tolist())


class BucketBatchSampler(BatchSampler):
    """Batches of similar length from any index sampler, through :func:`length_batches`.

    Indices come from ``sampler`` (random or sequential, over the whole split); each run of
    ``bucket_batches · batch_size`` of them is cut into batches by :func:`length_batches`, and
    the batches are yielded in an order shuffled by ``seed`` (or kept, for evaluation).

    With several processes (DDP), every rank cuts the same epoch of the whole split and takes
    every ``world_size``-th batch from its ``rank`` on: rank r trains at step s the epoch's
    batch ``s·world_size + r``. The epoch's batches are a single process's, with the largest
    split in two until their number is a multiple of ``world_size`` (or reaches the budget's
    bound, rounded so), so ``data.seed`` orders the epoch on any number of devices, and each
    document comes once per epoch, on one rank (unless every batch already holds one document
    and the count is short: then the first batches come again). (Lightning's own
    distributed sampler would replace this sampler's order with one seeded by the global seed,
    and give each rank a share that changes every epoch, whose batch count under a token
    budget can only be bounded loosely: 98 batches where 73 to 76 were cut.)

    Ranks must step together, and Lightning reads ``len(self)`` once per fit: an epoch with
    more batches would lose its last ones. With ``max_batch_tokens`` the number of batches
    depends on which documents share a window, so it changes with the shuffle. So the length
    is a bound that holds for every epoch (:meth:`_share_bound`), rounded up to a multiple of
    ``world_size``, and each epoch splits its largest batches in two until it has that many:
    every document still comes once per epoch, within the budget, at the cost of a few more,
    smaller steps: 131 where BBC's 1,699 training documents (16 a batch, 8,192 tokens, three
    windows) give 125 to 127. The bound is the count itself when the count cannot change: a
    split that fits in one window, or one the sampler gives in the same order every epoch.

    Args:
        sampler: where the split's indices come from, each epoch; not a distributed sampler
            (ranks share the batches here), so under DDP the trainer runs with
            ``use_distributed_sampler=False``.
        batch_size: documents per batch (the most, with a token budget).
        drop_last: drop each window's last short batch (without a token budget).
        lengths: token count of every document, by index.
        bucket_batches: how many batches share one sorting window.
        shuffle: shuffle batch order within a window.
        seed: seed for that shuffle.
        max_batch_tokens: most padded tokens per batch; None cuts by ``batch_size`` alone.
        resume_at: ``(epoch, batches_done)`` of a resumed run (``batches_done`` is 0 after a
            checkpoint at an epoch's end, and counts this rank's batches): the first iteration
            yields that epoch's batches from ``batches_done`` on. An init argument rather than
            a setter because Lightning rebuilds the batch sampler from its init arguments (to
            track prediction indices).
        rank: this process's rank among ``world_size``.
        world_size: processes sharing each epoch (1 without DDP).
    """

    def __init__(
        self,
        sampler: Sampler[int],
        batch_size: int,
        drop_last: bool,
        lengths: Sequence[int],
        bucket_batches: int = 50,
        shuffle: bool = True,
        seed: int = 0,
        max_batch_tokens: int | None = None,
        resume_at: tuple[int, int] | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if isinstance(sampler, DistributedSampler):
            # Lightning's injected sampler: each rank would deal batches out of its own share.
            raise ConfigError(
                "the length-bucketing batch sampler shares batches between processes itself; "
                "run the trainer with use_distributed_sampler=False (docclass fit does)"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of world_size {world_size} processes")
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = lengths
        self.bucket_batches = bucket_batches
        self.shuffle = shuffle
        self.seed = seed
        self.max_batch_tokens = max_batch_tokens
        self.resume_at = resume_at
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._length: int | None = None  # the same every epoch, so worked out once

    def set_epoch(self, epoch: int) -> None:
        """Change the order batches are yielded in. Lightning does not call this (it calls the
        inner sampler's ``set_epoch``): under it the windows' contents change every epoch
        through the sampler, and their batch order depends on the seed alone."""
        self.epoch = epoch

    def _batches(self, indices: list[int]) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        window = self.bucket_batches * self.batch_size
        result: list[list[int]] = []
        for start in range(0, len(indices), window):
            chunk = indices[start : start + window]
            cut = length_batches(
                [self.lengths[i] for i in chunk], self.batch_size, self.max_batch_tokens
            )
            batches = [[chunk[i] for i in batch] for batch in cut]
            if self.drop_last and not self.max_batch_tokens and len(batches[-1]) < self.batch_size:
                batches.pop()
            order = (
                torch.randperm(len(batches), generator=generator).tolist()
                if self.shuffle
                else range(len(batches))
            )
            result += [batches[b] for b in order]
        return result

    def _capacity(self, length: int) -> int:
        """The most documents of ``length`` tokens that one batch can hold (at least 1)."""
        return min(self.batch_size, max(1, self.max_batch_tokens // max(length, 1)))

    def _share_bound(self, share: list[int], ordered: bool) -> int:
        """The most batches :meth:`_batches` can cut ``share`` into, over every order of it;
        its count when ``ordered`` (the sampler gives it in this order every epoch).

        In one window the count depends on the sorted lengths alone, not on their order. Over
        several, with c(L) the capacity of a length, a window cut into k batches of sizes
        s_1 ≥ … ≥ s_k has k ≤ Σ 1/c(L) + ln(batch_size): a batch closes only when the next
        document's c is at most its size, so batch j+1's documents weigh at least
        s_{j+1}/s_j, and Σ s_{j+1}/s_j ≥ k − 1 − ln(s_1/s_k).
        """
        if ordered or len(share) <= self.bucket_batches * self.batch_size:
            return len(self._batches(share))
        weight = sum(1 / self._capacity(self.lengths[i]) for i in share)
        windows = -(-len(share) // (self.bucket_batches * self.batch_size))
        # The epsilon only ever raises the bound: float sums must not round it below a count.
        return min(len(share), math.floor(weight + windows * math.log(self.batch_size) + 1e-9))

    def _epoch_length(self) -> int:
        """The batches every epoch is cut or split into, over all ranks: a multiple of
        ``world_size``, so that every rank yields ``len(self)``."""
        if self._length is None:
            if self.max_batch_tokens:
                # The sampler yields the same documents every epoch, in a new order (random)
                # or the same one (sequential).
                ordered = isinstance(self.sampler, SequentialSampler)
                count = self._share_bound(list(self.sampler), ordered)
            else:
                # Windows hold whole batches, so only the last one can be short: fixed.
                count = super().__len__()
            self._length = -(-count // self.world_size) * self.world_size
        return self._length

    def _split_to(self, batches: list[list[int]], wanted: int) -> list[list[int]]:
        """``batches`` with the largest split in two until there are ``wanted``."""
        if len(batches) > wanted:
            # Yielding them all would be cut short by Lightning; a bug, not a data problem.
            raise RuntimeError(f"{len(batches)} batches this epoch, over the bound {wanted}")
        batches = list(batches)
        while len(batches) < wanted:
            largest = max(range(len(batches)), key=lambda b: len(batches[b]))
            batch = batches[largest]
            if len(batch) == 1:
                # Nothing left to split (one document a batch: batch_size 1, documents longer
                # than the budget, fewer documents than ranks): the first batches come again,
                # so that every rank still steps with the others. Evaluation and prediction
                # count each document once; training sees these few twice.
                while batches and len(batches) < wanted:
                    batches += batches[: wanted - len(batches)]
                break
            half = len(batch) // 2
            batches[largest : largest + 1] = [batch[:half], batch[half:]]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        done = 0
        if self.resume_at is not None:
            # Lightning may create this iterator before it restores the epoch counter (when the
            # optimiser set-up asks for the step count), and with workers it draws batches at
            # once; it does not create it again on resume, so the epoch is set here too.
            epoch, done = self.resume_at
            self.resume_at = None
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(epoch)
        batches = self._batches(list(self.sampler))
        if self.max_batch_tokens or self.world_size > 1:
            batches = self._split_to(batches, self._epoch_length())
        # Lightning counts the batches done as fetched already and stops at len(self).
        yield from batches[self.rank :: self.world_size][done:]

    def __len__(self) -> int:
        return self._epoch_length() // self.world_size
