"""From a source to length-bucketed batches: cleaning, de-duplication, splits, the DataModule.

A batch is a dict: ``input_ids [B,T] long``, ``attention_mask [B,T] bool`` (True = real
token), ``labels [B] long``, ``index [B] long`` (row in its split) and ``truncated [B] bool``.
T is the longest document in the batch (capped at ``max_tokens``), never a global maximum.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import datasets
import lightning.pytorch as pl
import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, SequentialSampler

from docclass.checkpoint import read_artifact
from docclass.errors import DataError
from docclass.sources import SourceSpec, load_source
from docclass.streaming import StreamedBatches, budget_batches, open_stream, stream_sample
from docclass.tokenizer import PAD_ID, TokenizerSpec, encode_batch, load_tokenizer, train_tokenizer

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")


def whitespace_key(text: str) -> str:
    """Texts that differ only in whitespace are the same document."""
    return " ".join(text.split())


def drop_empty(dataset: datasets.Dataset) -> tuple[datasets.Dataset, int]:
    """Remove documents that are missing or whitespace only."""
    keep = [i for i, text in enumerate(dataset["text"]) if text is not None and text.strip()]
    return dataset.select(keep), len(dataset) - len(keep)


def deduplicate(
    dataset: datasets.Dataset, also_remove: set[str] = frozenset()
) -> tuple[datasets.Dataset, int]:
    """Keep the first copy of each text (up to whitespace); drop texts listed in ``also_remove``.

    A text that occurs with two different labels is dropped altogether: no label can be right.
    """
    first_label: dict[str, int] = {}
    conflicting: set[str] = set()
    keys = [whitespace_key(text) for text in dataset["text"]]
    for key, label in zip(keys, dataset["label"], strict=True):
        if first_label.setdefault(key, label) != label:
            conflicting.add(key)
    seen: set[str] = set()
    keep = []
    for i, key in enumerate(keys):
        if key in seen or key in conflicting or key in also_remove:
            continue
        seen.add(key)
        keep.append(i)
    if conflicting:
        log.warning("%d texts carry conflicting labels and were dropped", len(conflicting))
    return dataset.select(keep), len(dataset) - len(keep)


def encode_labels(
    splits: dict[str, datasets.Dataset],
    source_names: list[str] | None,
    wanted_names: list[str] | None,
    source: str,
) -> tuple[dict[str, datasets.Dataset], list[str]]:
    """Turn labels into ids ``0..C-1`` over one list of label names.

    Args:
        splits: datasets with a ``label`` column.
        source_names: names of the source's integer labels (ClassLabel, class folders), if any.
        wanted_names: the label order to use (a checkpoint's); default: the source's names, or
            the sorted distinct training labels.
        source: the source's name, for error messages.
    """

    def as_names(values: list) -> list[str]:
        return [source_names[v] for v in values] if source_names else [str(v) for v in values]

    label_names = wanted_names or source_names or sorted(set(as_names(splits["train"]["label"])))
    index = {name: i for i, name in enumerate(label_names)}
    encoded = {}
    for split, dataset in splits.items():
        names = as_names(dataset["label"])
        unseen = sorted(set(names) - index.keys())
        if unseen:
            raise DataError(
                f"{source} ({split}): label(s) {unseen[:5]} are not among the known labels "
                f"{label_names[:10]}; fix label_column or the data"
            )
        ids = [index[name] for name in names]
        encoded[split] = dataset.remove_columns("label").add_column("label", ids)
    return encoded, label_names


def stratified_split(
    dataset: datasets.Dataset, fraction: float, seed: int, label_names: list[str], what: str
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Split off ``fraction`` of ``dataset`` with every class in proportion."""
    typed = dataset.cast_column("label", datasets.ClassLabel(names=label_names))
    try:
        parts = typed.train_test_split(test_size=fraction, stratify_by_column="label", seed=seed)
    except ValueError as error:
        raise DataError(
            f"cannot split off a stratified {what} set of {fraction:.0%} from {len(dataset)} "
            f"documents ({error}); give more documents per class or change the fraction"
        ) from error
    return parts["train"], parts["test"]


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
    """Batches of similar length: pads each batch only to its own longest document.

    Indices come from ``sampler`` (random, sequential or distributed); each run of
    ``bucket_batches · batch_size`` of them is sorted by length and cut into batches, and the
    batches are yielded in an order shuffled by ``seed`` (or kept, for evaluation).

    With ``max_batch_tokens`` a batch is also closed before its padded size (documents ×
    longest) would pass the budget, so batches of short documents hold more of them. Batch
    counts then differ between DDP ranks, and a rank that finishes early would leave the
    others waiting in the gradient all-reduce: every rank works out every rank's count (their
    shares are deterministic) and repeats its first batches up to the largest.

    Args:
        sampler: where indices come from; Lightning swaps in a distributed one under DDP.
        batch_size: documents per batch (the most, with a token budget).
        drop_last: drop the last short batch (without a token budget).
        lengths: token count of every document, by index.
        bucket_batches: how many batches share one sorting window.
        shuffle: shuffle batch order within a window.
        seed: seed for that shuffle.
        max_batch_tokens: most padded tokens per batch; None cuts by ``batch_size`` alone.
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
    ) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = lengths
        self.bucket_batches = bucket_batches
        self.shuffle = shuffle
        self.seed = seed
        self.max_batch_tokens = max_batch_tokens
        self.epoch = 0

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
            chunk = sorted(indices[start : start + window], key=lambda i: self.lengths[i])
            if self.max_batch_tokens:
                cut = budget_batches(
                    [self.lengths[i] for i in chunk], self.max_batch_tokens, self.batch_size
                )
                batches = [[chunk[i] for i in batch] for batch in cut]
            else:
                batches = [
                    chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)
                ]
                if self.drop_last and len(batches[-1]) < self.batch_size:
                    batches.pop()
            order = (
                torch.randperm(len(batches), generator=generator).tolist()
                if self.shuffle
                else range(len(batches))
            )
            result += [batches[b] for b in order]
        return result

    def _batches_per_rank(self) -> int:
        """The largest number of batches any rank gets this epoch."""
        replicas = getattr(self.sampler, "num_replicas", 1)
        if replicas == 1:
            return len(self._batches(list(self.sampler)))
        counts = []
        for rank in range(replicas):
            share = copy.copy(self.sampler)
            share.rank = rank
            counts.append(len(self._batches(list(share))))
        return max(counts)

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches(list(self.sampler))
        # One process has nobody to wait for: no need to count the other shares.
        if self.max_batch_tokens and batches and getattr(self.sampler, "num_replicas", 1) > 1:
            wanted = self._batches_per_rank()
            while len(batches) < wanted:
                batches += batches[: wanted - len(batches)]
        yield from batches

    def __len__(self) -> int:
        if self.max_batch_tokens:
            return self._batches_per_rank()
        return super().__len__()


def collate(rows: list[dict], pad_to_multiple: int = 1) -> dict[str, torch.Tensor]:
    """Pad a list of tokenized rows to the longest one, rounded up to ``pad_to_multiple``."""
    longest = max(1, max(len(row["input_ids"]) for row in rows))
    longest = -(-longest // pad_to_multiple) * pad_to_multiple
    input_ids = torch.full((len(rows), longest), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row["input_ids"])] = torch.as_tensor(row["input_ids"], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "attention_mask": input_ids != PAD_ID,
        "labels": torch.tensor([row["label"] for row in rows], dtype=torch.long),
        "index": torch.tensor([row["index"] for row in rows], dtype=torch.long),
        "truncated": torch.tensor([row["truncated"] for row in rows], dtype=torch.bool),
    }


class DocDataModule(pl.LightningDataModule):
    """Loads a source, cleans it, splits it, trains the tokenizer and serves bucketed batches.

    Args:
        source: "bbc" (embedded BBC News), a CSV/JSONL/Parquet file, a folder of class
            sub-folders of .txt files, or a Hugging Face dataset name or local copy.
        hub_config: configuration name of a hub dataset.
        text_column: column holding the document text.
        label_column: column holding the label.
        train_split: the source's training split name.
        val_split: the source's validation split name; None carves one out of train.
        test_split: the source's test split name; None or absent carves one out of train.
        val_fraction: fraction of the training pool held out for validation when carved.
        test_fraction: fraction of all documents held out for testing when carved.
        split_seed: seed of the stratified splits.
        split_file: a ``split.json`` written by an earlier run, to reuse its exact split.
        max_docs_per_class: keep at most this many training documents per class (quick runs).
        tokenizer: how to train the tokenizer.
        tokenizer_from: a checkpoint whose tokenizer and labels to use instead of training new.
        max_tokens: tokens kept per document (the rest is cut and flagged); None keeps all.
        batch_size: training documents per batch.
        eval_batch_size: documents per batch for validation, test and predict.
        num_workers: DataLoader worker processes.
        pad_to_multiple: round every batch's length up to a multiple of this, so a compiled
            model (``model.compile``) meets at most ``max_tokens / pad_to_multiple`` shapes.
        predict_split: which split ``predict`` classifies.
        seed: seed of the training batch order.
        stream: train on documents read lazily from this glob of JSONL / CSV / Parquet files
            or hub dataset (its ``train_split``), for corpora larger than memory; ``source``
            then supplies validation and test only (:mod:`docclass.streaming`).
        max_batch_tokens: cut training batches by padded tokens (documents × longest) as
            well as by ``batch_size``, so short documents travel in larger batches.
        steps_per_epoch: with ``stream``, batches per epoch on every rank (required under DDP).
        bucket_documents: with ``stream``, documents sorted by length together.
        shuffle_buffer: with ``stream``, documents in ``datasets``' shuffle buffer.
        tokenizer_documents: with ``stream``, the first this many train the tokenizer.
    """

    def __init__(
        self,
        source: str = "bbc",
        hub_config: str | None = None,
        text_column: str = "text",
        label_column: str = "label",
        train_split: str = "train",
        val_split: str | None = None,
        test_split: str | None = "test",
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        split_file: str | None = None,
        max_docs_per_class: int | None = None,
        tokenizer: TokenizerSpec = TokenizerSpec(),
        tokenizer_from: str | None = None,
        max_tokens: int | None = 1024,
        batch_size: int = 32,
        eval_batch_size: int = 64,
        num_workers: int = 0,
        pad_to_multiple: int = 1,
        predict_split: str = "test",
        seed: int = 0,
        stream: str | None = None,
        max_batch_tokens: int | None = None,
        steps_per_epoch: int | None = None,
        bucket_documents: int = 2000,
        shuffle_buffer: int = 10000,
        tokenizer_documents: int = 20000,
    ) -> None:
        super().__init__()
        for name, value in (
            ("max_batch_tokens", max_batch_tokens),
            ("steps_per_epoch", steps_per_epoch),
        ):
            if value is not None and value < 1:
                raise DataError(f"data.{name} must be positive or null, got {value}")
        if steps_per_epoch and not stream:
            raise DataError(
                "data.steps_per_epoch applies to a streamed training set: set data.stream, or "
                "use trainer.limit_train_batches"
            )
        self.stream, self.max_batch_tokens, self.steps_per_epoch = (
            stream,
            max_batch_tokens,
            steps_per_epoch,
        )
        self.bucket_documents, self.shuffle_buffer = bucket_documents, shuffle_buffer
        self.tokenizer_documents = tokenizer_documents
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 < value < 0.5:
                raise DataError(f"data.{name} must be between 0 and 0.5, got {value}")
        if max_tokens is not None and max_tokens < 1:
            raise DataError(f"data.max_tokens must be positive or null, got {max_tokens}")
        if predict_split not in SPLITS:
            raise DataError(f"data.predict_split must be one of {SPLITS}, got {predict_split!r}")
        if pad_to_multiple < 1:
            raise DataError(f"data.pad_to_multiple must be positive, got {pad_to_multiple}")
        self.pad_to_multiple = pad_to_multiple
        self.source_spec = SourceSpec(
            source, hub_config, text_column, label_column, train_split, val_split, test_split
        )
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.split_seed, self.split_file = split_seed, split_file
        self.max_docs_per_class = max_docs_per_class
        # A copy: the default instance is shared by every DataModule built without one.
        self.tokenizer_spec = dataclasses.replace(tokenizer)
        self.tokenizer_from = tokenizer_from
        self.max_tokens = max_tokens
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers, self.predict_split, self.seed = num_workers, predict_split, seed
        self.splits: dict[str, datasets.Dataset] | None = None
        self.label_names: list[str] = []
        self.tokenizer = None
        self.stats: dict[str, int | str] = {}
        self._tokenized: dict[str, datasets.Dataset] = {}

    # -- sizes the model needs before training starts (linked by the CLI) -------------------
    @property
    def num_classes(self) -> int:
        self.prepare()
        return len(self.label_names)

    @property
    def vocab_size(self) -> int:
        self.prepare()
        return self.tokenizer.get_vocab_size()

    # -- preparation ---------------------------------------------------------------------
    def prepare(self) -> None:
        """Load, clean, de-duplicate, split and get the tokenizer, once; later calls return."""
        if self.splits is not None:
            return
        artifact = read_artifact(self.tokenizer_from) if self.tokenizer_from else None
        loaded = load_source(self.source_spec)
        splits, self.label_names = encode_labels(
            loaded.splits,
            loaded.label_names,
            artifact["label_names"] if artifact else None,
            self.source_spec.source,
        )
        self.stats = {"source": self.source_spec.source, **loaded.stats}
        self.stats["documents_read"] = sum(len(d) for d in splits.values())
        splits = self._clean(splits)
        self.splits = self._split(splits)
        if artifact:
            self.tokenizer = load_tokenizer(artifact["tokenizer"])
        elif self.stream:
            sample = stream_sample(self._stream_documents(), self.tokenizer_documents)
            if not sample:
                raise DataError(f"data.stream {self.stream!r} holds no documents")
            self.tokenizer = train_tokenizer(sample, self.tokenizer_spec)
        else:
            self.tokenizer = train_tokenizer(self.splits["train"]["text"], self.tokenizer_spec)
        if self.stream:
            log.info(
                "training reads the stream %s; %s supplies validation and test (its %d "
                "training documents are not used)",
                self.stream,
                self.source_spec.source,
                len(self.splits["train"]),
            )
        self.stats["vocab_size"] = self.tokenizer.get_vocab_size()
        for split, dataset in self.splits.items():
            self.stats[f"{split}_documents"] = len(dataset)
        log.info("data ready: %s", json.dumps(self.stats))

    def _clean(self, splits: dict[str, datasets.Dataset]) -> dict[str, datasets.Dataset]:
        empty_total = duplicate_total = 0
        cleaned = {}
        for split, dataset in splits.items():
            cleaned[split], empty = drop_empty(dataset)
            empty_total += empty
        # Held-out splits win: a training copy of a test or validation text is the one removed.
        held_out: set[str] = set()
        for split in ("test", "val", "train"):
            if split in cleaned:
                cleaned[split], duplicates = deduplicate(cleaned[split], also_remove=held_out)
                duplicate_total += duplicates
                held_out |= {whitespace_key(t) for t in cleaned[split]["text"]}
        if empty_total:
            log.warning("dropped %d empty or whitespace-only documents", empty_total)
        log.info("removed %d duplicate documents before splitting", duplicate_total)
        self.stats.update(empty_dropped=empty_total, duplicates_removed=duplicate_total)
        if not cleaned["train"]:
            raise DataError(f"{self.source_spec.source}: no training documents left after cleaning")
        return cleaned

    def _split(self, splits: dict[str, datasets.Dataset]) -> dict[str, datasets.Dataset]:
        if self.split_file:
            return self._split_from_file(splits)
        names = self.label_names
        test_carved = "test" not in splits
        if test_carved:
            splits["train"], splits["test"] = stratified_split(
                splits["train"], self.test_fraction, self.split_seed, names, "test"
            )
        if "val" not in splits:
            # Both fractions are of the whole pool when both are carved (80/10/10).
            share = (
                self.val_fraction / (1 - self.test_fraction) if test_carved else self.val_fraction
            )
            splits["train"], splits["val"] = stratified_split(
                splits["train"], share, self.split_seed, names, "validation"
            )
        if self.max_docs_per_class:
            splits["train"] = self._cap_per_class(splits["train"])
        for split in SPLITS:
            if not len(splits[split]):
                raise DataError(f"{self.source_spec.source}: the {split} split is empty")
        return {split: splits[split] for split in SPLITS}

    def _split_from_file(self, splits: dict[str, datasets.Dataset]) -> dict[str, datasets.Dataset]:
        path = Path(self.split_file)
        try:
            wanted = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise DataError(f"{path}: not a readable split.json ({error})") from error
        pool = datasets.concatenate_datasets(list(splits.values()))
        position = {doc_id: i for i, doc_id in enumerate(pool["id"])}
        result = {}
        for split in SPLITS:
            missing = [doc_id for doc_id in wanted.get(split, []) if doc_id not in position]
            if missing or split not in wanted:
                raise DataError(
                    f"{path}: split {split!r} is absent or names {len(missing)} unknown ids "
                    f"(first: {missing[:3]}); it was written for different data"
                )
            result[split] = pool.select([position[d] for d in wanted[split]])
        return result

    def _cap_per_class(self, dataset: datasets.Dataset) -> datasets.Dataset:
        taken: dict[int, int] = {}
        keep = []
        for i, label in enumerate(dataset["label"]):
            if taken.get(label, 0) < self.max_docs_per_class:
                taken[label] = taken.get(label, 0) + 1
                keep.append(i)
        return dataset.select(keep)

    def write_split(self, path: str | Path) -> None:
        """Write the document ids of each split, so a later run can reuse the exact split."""
        self.prepare()
        ids = {split: list(self.splits[split]["id"]) for split in SPLITS}
        Path(path).write_text(json.dumps(ids))

    # -- tokenization and loaders ---------------------------------------------------------
    def tokenized(self, split: str) -> datasets.Dataset:
        """The split with ``input_ids`` (cut to ``max_tokens``), ``n_tokens`` and ``truncated``."""
        self.prepare()
        if split not in self._tokenized:
            limit = self.max_tokens
            tokenizer = self.tokenizer

            def tokenize(batch: dict, indices: list[int]) -> dict:
                encodings = encode_batch(tokenizer, batch["text"])
                ids = [e.ids for e in encodings]
                return {
                    "input_ids": [i[:limit] if limit else i for i in ids],
                    "n_tokens": [len(i) for i in ids],
                    "truncated": [bool(limit) and len(i) > limit for i in ids],
                    "index": indices,
                }

            fingerprint = hashlib.sha256(
                f"{self.splits[split]._fingerprint}{tokenizer.to_str()}{limit}".encode()
            ).hexdigest()[:32]
            tokenized = self.splits[split].map(
                tokenize,
                batched=True,
                with_indices=True,
                batch_size=1000,
                new_fingerprint=fingerprint,
                desc=f"tokenizing {split}",
            )
            self._tokenized[split] = tokenized.select_columns(
                ["input_ids", "label", "index", "truncated", "n_tokens"]
            )
            self.stats[f"{split}_truncated"] = int(sum(tokenized["truncated"]))
        return self._tokenized[split]

    def _stream_documents(self) -> datasets.IterableDataset:
        spec = self.source_spec
        return open_stream(
            self.stream, spec.hub_config, spec.train_split, spec.text_column, spec.label_column
        )

    def _stream_loader(self) -> DataLoader:
        held_out = frozenset(
            whitespace_key(text) for split in ("val", "test") for text in self.splits[split]["text"]
        )
        tokenizer = self.tokenizer
        batches = StreamedBatches(
            self._stream_documents,
            lambda texts: [e.ids for e in encode_batch(tokenizer, texts)],
            {name: i for i, name in enumerate(self.label_names)},
            functools.partial(collate, pad_to_multiple=self.pad_to_multiple),
            self.max_tokens,
            self.batch_size,
            self.max_batch_tokens,
            self.bucket_documents,
            self.shuffle_buffer,
            self.steps_per_epoch,
            held_out,
            self.seed,
        )
        # A resumed run continues with its epoch's shuffle.
        trainer = getattr(self, "trainer", None)
        batches.set_epoch(trainer.current_epoch if trainer else 0)
        return DataLoader(
            batches,
            batch_size=None,  # the stream yields whole batches
            num_workers=self.num_workers,
            # Workers are made afresh each epoch, so they see the epoch set_epoch gave.
            persistent_workers=False,
            pin_memory=torch.cuda.is_available(),
        )

    def _loader(self, split: str, train: bool) -> DataLoader:
        if train and self.stream:
            self.prepare()
            return self._stream_loader()
        dataset = self.tokenized(split)
        lengths = [len(ids) for ids in dataset["input_ids"]]
        if train:
            sampler = EpochShuffleSampler(len(dataset), self.seed)
        else:
            sampler = SequentialSampler(dataset)
        batch_sampler = BucketBatchSampler(
            sampler,
            self.batch_size if train else self.eval_batch_size,
            drop_last=False,
            lengths=lengths,
            shuffle=train,
            seed=self.seed,
            max_batch_tokens=self.max_batch_tokens if train else None,
        )
        return DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=functools.partial(collate, pad_to_multiple=self.pad_to_multiple),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split, train=False)
