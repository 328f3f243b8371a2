"""The Lightning DataModule: glue from a source to length-bucketed batches.

Reading (:mod:`~docclass.data.sources`), cleaning and splitting (:mod:`~docclass.data.cleaning`),
the tokenizer (:mod:`~docclass.data.tokenizer`), batching (:mod:`~docclass.data.batching`) and
streaming (:mod:`~docclass.data.streaming`) live in their own modules; this one wires them.
Batches are described in :mod:`docclass.data.batching`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

import datasets
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, SequentialSampler

from docclass.artifacts.encoders import encoder_tokenizer, locate_encoder
from docclass.artifacts.load import read_artifact
from docclass.data.batching import collate, padded_length
from docclass.data.cleaning import (
    TEXT_HASHES,
    deduplicate,
    drop_empty,
    encode_labels,
    refuse_classes_without_training,
    stratified_split,
    text_hash,
    whitespace_key,
)
from docclass.data.samplers import BucketBatchSampler, EpochShuffleSampler
from docclass.data.sources import SourceSpec, load_source, local_source_path
from docclass.data.streaming import (
    ResumedStreamLoader,
    StreamedBatches,
    open_stream,
    stream_files,
    stream_sample,
)
from docclass.data.tokenizer import (
    TokenizerSpec,
    encode_batch,
    load_tokenizer,
    token_ids,
    train_tokenizer,
)
from docclass.errors import ConfigError, DataError

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")
# Where a checkpoint keeps the fingerprint of the split it trained on.
SPLIT_KEY = "split_sha256"
# Where a checkpoint keeps the data settings its batches were made with.
BATCHING_KEY = "batching"
# The stream by the files it reads (stream_files: the same files may be spelt another way).
STREAM_BATCHING = (
    "stream_files",
    "num_workers",
    "bucket_documents",
    "shuffle_buffer",
    "steps_per_epoch",
)


def check_settings(**settings) -> None:
    """One line naming the setting for every impossible value (before any data is read)."""
    for name in ("max_batch_tokens", "steps_per_epoch", "max_tokens"):
        value = settings[name]
        if value is not None and value < 1:
            raise DataError(f"data.{name} must be positive or null, got {value}")
    if settings["steps_per_epoch"] and not settings["stream"]:
        raise DataError(
            "data.steps_per_epoch applies to a streamed training set: set data.stream, or "
            "use trainer.limit_train_batches"
        )
    for name in ("val_fraction", "test_fraction"):
        if not 0.0 < settings[name] < 0.5:
            raise DataError(f"data.{name} must be between 0 and 0.5, got {settings[name]}")
    if settings["predict_split"] not in SPLITS:
        raise DataError(
            f"data.predict_split must be one of {SPLITS}, got {settings['predict_split']!r}"
        )
    for name in ("pad_to_multiple", "batch_size", "eval_batch_size"):
        # batch_size 0 was a traceback from the DataLoader, after the data had been read.
        if settings[name] < 1:
            raise DataError(f"data.{name} must be positive, got {settings[name]}")
    if settings["num_workers"] < 0:
        raise DataError(f"data.num_workers must be 0 or more, got {settings['num_workers']}")
    for name in ("bucket_documents", "shuffle_buffer", "tokenizer_documents"):
        # 0 read the whole stream into one buffer (memory), or trained no tokenizer sample.
        if settings[name] < 1:
            raise DataError(f"data.{name} must be positive, got {settings[name]}")
    if settings["max_docs_per_class"] is not None and settings["max_docs_per_class"] < 1:
        # 0 meant no cap, in silence.
        raise DataError(
            f"data.max_docs_per_class must be positive or null (no cap), got "
            f"{settings['max_docs_per_class']}"
        )
    if settings["split_seed"] < 0:
        raise DataError(f"data.split_seed must be 0 or more, got {settings['split_seed']}")


def read_split_file(path: Path) -> dict[str, Any]:
    """A split.json's contents, each split's ids as text (a split.json written by hand with
    numbers names the same rows as one with their strings); anything else refused in a line."""
    try:
        wanted = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable split.json ({error})") from error
    if not isinstance(wanted, dict) or not all(
        isinstance(ids, list)
        and all(isinstance(i, str | int) and not isinstance(i, bool) for i in ids)
        for ids in (wanted.get(split, []) for split in SPLITS)
    ):
        # A list, or a split that is not a list of ids, was a traceback further down.
        raise DataError(
            f"{path}: not a split.json (an object of {', '.join(SPLITS)}, each a list of "
            "ids); give the split.json a fit wrote"
        )
    return {
        split: [str(i) for i in ids] if split in SPLITS else ids for split, ids in wanted.items()
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
        encoder: use this pre-trained encoder's own tokenizer instead of training one; the
            command line links it from ``model.encoder``.
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
            then supplies validation and test only (:mod:`docclass.data.streaming`).
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
        encoder: str | None = None,
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
        check_settings(
            max_batch_tokens=max_batch_tokens, steps_per_epoch=steps_per_epoch, stream=stream,
            val_fraction=val_fraction, test_fraction=test_fraction, max_tokens=max_tokens,
            predict_split=predict_split, pad_to_multiple=pad_to_multiple, batch_size=batch_size,
            eval_batch_size=eval_batch_size, num_workers=num_workers,
            bucket_documents=bucket_documents, shuffle_buffer=shuffle_buffer,
            tokenizer_documents=tokenizer_documents, max_docs_per_class=max_docs_per_class,
            split_seed=split_seed,
        )  # fmt: skip
        self.stream, self.max_batch_tokens = stream, max_batch_tokens
        self.steps_per_epoch = steps_per_epoch
        self.bucket_documents, self.shuffle_buffer = bucket_documents, shuffle_buffer
        self.tokenizer_documents = tokenizer_documents
        self.pad_to_multiple = pad_to_multiple
        self.source_spec = SourceSpec(
            source, hub_config, text_column, label_column, train_split, val_split, test_split
        )
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.split_seed, self.split_file, self.max_docs_per_class = (
            split_seed, split_file, max_docs_per_class
        )  # fmt: skip
        # A copy: the default instance is shared by every DataModule built without one.
        self.tokenizer_spec = dataclasses.replace(tokenizer)
        self.tokenizer_from, self.encoder, self.max_tokens = tokenizer_from, encoder, max_tokens
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers, self.predict_split, self.seed = num_workers, predict_split, seed
        self._start_unprepared()

    def _start_unprepared(self) -> None:
        """What :meth:`prepare` fills in, empty until it runs."""
        self.splits: dict[str, datasets.Dataset] | None = None
        self.label_names: list[str] = []
        self.tokenizer = None
        self.stats: dict[str, int | str] = {}
        self._tokenized: dict[str, datasets.Dataset] = {}
        # (epoch, batches of it done) where the checkpoint being resumed left training.
        self._resume_at: tuple[int, int] | None = None
        # (epoch, batches of it done, batches trained in all) of the checkpoint resumed.
        self._position_anchor: tuple[int, int, int] | None = None
        self._split_fingerprint: str | None = None
        # How many processes wrote that position (None: a checkpoint of an earlier docclass).
        self._resume_world_size: int | None = None

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
        """Load, clean, de-duplicate, split and get the tokenizer, once; later calls return.
        A preparation that fails leaves none of it behind: the next call starts again rather
        than returning a module with splits and no tokenizer."""
        if self.splits is not None:
            return
        try:
            self._prepare()
        except BaseException:
            self.splits = None
            raise

    def _prepare(self) -> None:
        artifact = read_artifact(self.tokenizer_from) if self.tokenizer_from else None
        loaded = load_source(self.source_spec)
        splits, self.label_names = encode_labels(
            loaded.splits,
            loaded.label_names,
            artifact["label_names"] if artifact else None,
            self.source_spec.source,
        )
        self.stats = {"source": self.source_spec.source, **loaded.stats}
        local = local_source_path(self.source_spec.source)
        if local is not None:
            # Where a relative path pointed when the run read it (later commands may run from
            # another folder and must know whether they read the same file).
            self.stats["source_path"] = str(local)
        self.stats["documents_read"] = sum(len(d) for d in splits.values())
        splits = self._split(self._clean(splits))
        if not self.stream:  # a stream trains; the source's training split is not read
            refuse_classes_without_training(splits, self.label_names, self.source_spec.source)
        self.splits = splits
        if artifact:
            self.tokenizer = load_tokenizer(artifact["tokenizer"])
        elif self.encoder:
            self.tokenizer = encoder_tokenizer(locate_encoder(self.encoder))
        elif self.stream:
            sample = stream_sample(
                self._stream_documents()(), self.tokenizer_documents, self._held_out_keys()
            )
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
            if self.max_docs_per_class:
                # The file is the split (a run's, an audit fold's): capping it would train on
                # other documents than it names, and a resumed audit would see another split.
                # Info, not a warning: calibrate and every audit fold pass the run's own file.
                log.info(
                    "data.max_docs_per_class=%d is not applied: data.split_file %s fixes the split",
                    self.max_docs_per_class,
                    self.split_file,
                )
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
        wanted = read_split_file(path)
        pool = datasets.concatenate_datasets(list(splits.values()))
        position = {doc_id: i for i, doc_id in enumerate(pool["id"])}
        if len(position) < len(pool):
            # An id naming two documents (a hub layout whose ids restart in every split) would
            # put whichever came last into the named split: a test document into training.
            repeated = collections.Counter(pool["id"]).most_common(1)[0][0]
            raise DataError(
                f"{self.source_spec.source}: id {repeated!r} names more than one document, so "
                f"{path} cannot name documents by id; give every document a unique id column"
            )
        named = [doc_id for split in SPLITS for doc_id in wanted.get(split, [])]
        if len(set(named)) < len(named):
            twice = collections.Counter(named).most_common(1)[0][0]
            raise DataError(
                f"{path}: id {twice!r} is named twice; split.json's splits must not overlap"
            )
        result = {}
        for split in SPLITS:
            missing = [doc_id for doc_id in wanted.get(split, []) if doc_id not in position]
            if missing or split not in wanted:
                raise DataError(
                    f"{path}: split {split!r} is absent or names {len(missing)} unknown ids "
                    f"(first: {missing[:3]}); it was written for different data"
                )
            result[split] = pool.select([position[d] for d in wanted[split]])
        unnamed = len(pool) - len(named)
        if unnamed:
            # Legitimate (a capped run, an audit's re-training without its flagged documents)
            # as well as a sign of rows added since: said, not refused.
            log.info("%s: %d documents of the source are in none of its splits", path, unnamed)
        hashes = wanted.get(TEXT_HASHES) or {}
        changed = [
            doc_id
            for split in SPLITS
            for doc_id, text in zip(result[split]["id"], result[split]["text"], strict=True)
            if doc_id in hashes and hashes[doc_id] != text_hash(text)
        ]
        if changed:
            raise DataError(
                f"{path}: {len(changed)} of the documents it names have other texts in "
                f"{self.source_spec.source} now (first id {changed[0]!r}); it was written for "
                "another version of the data: drop data.split_file to split afresh"
            )
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
        """Write the document ids of each split, so a later run can reuse the exact split, and
        a short hash of each document's text (``text_sha256``), so that reuse on edited data
        (a row inserted into a CSV whose ids are row numbers) is refused, not silently shifted."""
        self.prepare()
        content: dict = {split: list(self.splits[split]["id"]) for split in SPLITS}
        content[TEXT_HASHES] = {
            doc_id: text_hash(text)
            for split in SPLITS
            for doc_id, text in zip(
                self.splits[split]["id"], self.splits[split]["text"], strict=True
            )
        }
        Path(path).write_text(json.dumps(content))

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

    def training_tokens(self) -> int | None:
        """Tokens one epoch of the training split feeds the model (after truncation, before
        padding); None for a streamed training set, whose size is not known in advance."""
        if self.stream:
            return None
        counts = self.tokenized("train")["n_tokens"]
        limit = self.max_tokens
        return int(sum(min(n, limit) if limit else n for n in counts))

    def _stream_documents(self) -> functools.partial:
        """Opens the training stream: a partial of a module-level function, so it pickles into
        DataLoader workers started with ``spawn`` (macOS, and Linux from Python 3.14)."""
        spec = self.source_spec
        return functools.partial(
            open_stream,
            self.stream,
            spec.hub_config,
            spec.train_split,
            spec.text_column,
            spec.label_column,
        )

    def _held_out_keys(self) -> frozenset[str]:
        """Validation and test texts, skipped wherever the training stream is read."""
        return frozenset(
            whitespace_key(text) for split in ("val", "test") for text in self.splits[split]["text"]
        )

    def _stream_loader(self, resume_at: tuple[int, int] | None) -> DataLoader:
        trainer = getattr(self, "trainer", None)
        # The epoch comes from the checkpoint when resuming: Lightning builds this loader (and,
        # with workers, starts reading it) before it restores its epoch counter, and after a
        # mid-epoch checkpoint it does not call on_train_epoch_start at all.
        epoch, done = resume_at or (trainer.current_epoch if trainer else 0, 0)
        held_out = self._held_out_keys()
        batches = StreamedBatches(
            self._stream_documents(),
            functools.partial(token_ids, self.tokenizer),
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
            # Given here, not looked up where the stream is read: a DataLoader worker started
            # with spawn or forkserver has no process group, so every rank would read it all.
            rank=trainer.global_rank if trainer else None,
            world_size=trainer.world_size if trainer else None,
            pad_to_multiple=self.pad_to_multiple,
        )
        batches.set_epoch(epoch)
        return ResumedStreamLoader(
            batches,
            # Inside an epoch: the batches done are read again and dropped (no stream position
            # is saved); Lightning then takes the rest of the epoch from this iterator.
            skip=done,
            batch_size=None,  # the stream yields whole batches
            num_workers=self.num_workers,
            # Workers are made afresh each epoch, so they see the epoch set_epoch gave.
            persistent_workers=False,
            pin_memory=torch.cuda.is_available(),
        )

    def _take_resume_at(self) -> tuple[int, int] | None:
        """Where the checkpoint being resumed left training, once: a later fit starts whole."""
        resume_at, self._resume_at = self._resume_at, None
        trainer = getattr(self, "trainer", None)
        saved_world, self._resume_world_size = self._resume_world_size, None
        if resume_at and resume_at[1] and trainer and saved_world not in (None, trainer.world_size):
            # Rank r's k turns are batches r, r + P, … of the epoch: with another P they name
            # other batches, and some of the epoch would be trained twice and some never.
            raise ConfigError(
                f"{trainer.ckpt_path}: written {resume_at[1]} steps into epoch {resume_at[0]} "
                f"on each of {saved_world} processes; resume it with {saved_world} "
                f"(trainer.devices × trainer.num_nodes, now {trainer.world_size}), or from a "
                "checkpoint written at an epoch's end"
            )
        if (
            resume_at
            and resume_at[1]
            and trainer
            and saved_world is None
            and trainer.world_size > 1
        ):
            log.warning(
                "%s: written inside an epoch by an earlier docclass, which shared epochs between "
                "processes otherwise; the rest of epoch %d may repeat or miss some documents",
                trainer.ckpt_path,
                resume_at[0],
            )
        if resume_at is None and self.num_workers and getattr(trainer, "ckpt_path", None):
            log.warning(
                "%s holds no data position (written by an older docclass): with "
                "data.num_workers > 0 the resumed epoch may be shuffled as epoch 0 was; resume "
                "with --data.num_workers 0 to continue in the order of an uninterrupted run",
                trainer.ckpt_path,
            )
        return resume_at

    def _loader(self, split: str, train: bool) -> DataLoader:
        resume_at = self._take_resume_at() if train else None
        if train and self.stream:
            self.prepare()
            return self._stream_loader(resume_at)
        dataset = self.tokenized(split)
        # The widths collate pads to: a token budget is a budget of padded tokens.
        lengths = [padded_length(len(ids), self.pad_to_multiple) for ids in dataset["input_ids"]]
        if train:
            sampler = EpochShuffleSampler(len(dataset), self.seed)
        else:
            sampler = SequentialSampler(dataset)
        trainer = getattr(self, "trainer", None)
        batch_sampler = BucketBatchSampler(
            sampler,
            self.batch_size if train else self.eval_batch_size,
            drop_last=False,
            lengths=lengths,
            shuffle=train,
            seed=self.seed,
            max_batch_tokens=self.max_batch_tokens if train else None,
            resume_at=resume_at,
            # Under DDP each rank takes its turn of the whole split's batches (every split:
            # evaluation and prediction gather their rows from every rank).
            rank=trainer.global_rank if trainer else 0,
            world_size=trainer.world_size if trainer else 1,
        )
        return DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=functools.partial(collate, pad_to_multiple=self.pad_to_multiple),
            num_workers=self.num_workers,
            # A new iterator each epoch, as with no workers: each draws its seed from the global
            # generator, so a resumed run draws at the same points as the run it continues.
            persistent_workers=False,
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    # -- where a checkpoint left training ----------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where training is (:meth:`_position`), and which split it trains on: a resumed fit
        whose settings or data now split otherwise is refused (:meth:`load_state_dict`)."""
        position = self._position()
        if not position:
            return position
        return {**position, SPLIT_KEY: self.split_fingerprint(), BATCHING_KEY: self._batching()}

    def _batching(self) -> dict[str, Any]:
        """The settings that make a fit's batches: a resumed fit must keep them. A stream's
        batches also depend on how it is read (its files, how many workers split it, the
        buffers, the epoch's length): changed mid-epoch, some documents were trained twice
        and others not at all."""
        streamed = {name: getattr(self, name) for name in STREAM_BATCHING} if self.stream else {}
        return {
            "max_tokens": self.max_tokens,
            "batch_size": self.batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            "pad_to_multiple": self.pad_to_multiple,
            "seed": self.seed,
            **streamed,
        }

    @property
    def stream_files(self) -> str | None:
        """What a streamed fit reads, however the stream is spelt: SHA-256 of its resolved
        files' paths (a hub dataset: its name)."""
        if not self.stream:
            return None
        files = stream_files(self.stream)
        if files is None:
            return self.stream
        listed = "\n".join(sorted(str(Path(f).resolve()) for f in files))
        return hashlib.sha256(listed.encode("utf-8", "surrogateescape")).hexdigest()[:16]

    def split_fingerprint(self) -> str:
        """SHA-256 of every split's ids and text hashes, in order; computed once."""
        if self._split_fingerprint is None:
            self.prepare()
            digest = hashlib.sha256()
            for split in SPLITS:
                for doc_id, text in zip(
                    self.splits[split]["id"], self.splits[split]["text"], strict=True
                ):
                    digest.update(f"{split}|{doc_id}|{text_hash(text)}\n".encode())
            self._split_fingerprint = digest.hexdigest()
        return self._split_fingerprint

    @classmethod
    def trained_split(cls, checkpoint: dict[str, Any]) -> str | None:
        """The split fingerprint a loaded checkpoint trained on (Lightning keeps a datamodule's
        state under its class name); None for a checkpoint of an earlier docclass."""
        return (checkpoint.get(cls.__qualname__) or {}).get(SPLIT_KEY)

    def _position(self) -> dict[str, int]:
        """The epoch training resumes in and the number of its batches already done.

        Counted from the batches trained since the run began (Lightning's total, which a
        resumed run carries on): every epoch of a fit has the same number of batches, so the
        position is that total divided by it. Lightning's per-epoch counters do not say it:
        after some restarts (from a checkpoint on an epoch's last batch, or any restart when
        ``trainer.max_steps`` is set) it skips an epoch's start, and a checkpoint two batches
        into that epoch read as its start. And the sampler alone cannot say how many of the
        batches it yielded were trained on (Lightning fetches one batch ahead, workers more).
        Saved at an epoch's end too ({next epoch, 0}), for streams as well: Lightning builds
        the training loader, and with workers starts fetching from it, before it restores its
        epoch counter, so without this a resumed run would replay epoch 0's order.
        """
        trainer = self.trainer
        if trainer is None:
            return {}
        loop = trainer.fit_loop
        per_epoch = trainer.num_training_batches
        if not math.isfinite(per_epoch) or per_epoch < 1:
            # A stream of unknown length (no data.steps_per_epoch): epochs have no fixed size,
            # so only the epoch counters can say where training is. Not the "processed" count:
            # a checkpoint at an epoch's end (on_train_epoch_end) is written after Lightning
            # has counted the epoch processed, and epoch 0's end resumed in epoch 2's order.
            epoch, batches = trainer.current_epoch, loop.epoch_loop.batch_progress
            trained = batches.total.processed
            if batches.is_last_batch:  # the stream's end reached: the next epoch starts whole
                return {"epoch": epoch + 1, "batches_done": 0, "batches_trained": trained}
            # In the epoch a resumed run started in, counted from the checkpoint: resumed from
            # a step checkpoint on a stream's last batch, Lightning cannot tell that epoch
            # ended, and its per-epoch counter starts at the old epoch's length, not 0.
            anchor_epoch, anchor_done, at = self._position_anchor or (None, 0, 0)
            done = (
                anchor_done + trained - at if anchor_epoch == epoch else batches.current.processed
            )
            return {
                "epoch": epoch,
                "batches_done": done,
                "batches_trained": trained,
                "world_size": trainer.world_size,
            }
        trained = loop.epoch_loop.batch_progress.total.processed
        # Counted on from where the checkpoint this run resumed left off (the start, for a new
        # run): an earlier run may have had other epochs (limit_train_batches, another batch
        # size), and dividing the whole total by this run's epoch put an extended run's epoch
        # end five batches into the epoch before.
        epoch, done, at = self._position_anchor or (0, 0, 0)
        epoch, done = divmod(epoch * int(per_epoch) + done + trained - at, int(per_epoch))
        # The batches done are this rank's turns: they name a place in the epoch only for
        # the number of processes that took them.
        return {
            "epoch": epoch,
            "batches_done": done,
            "batches_trained": trained,
            "world_size": trainer.world_size,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        trained_on = state_dict.get(SPLIT_KEY)
        if trained_on and self.trainer is not None and trained_on != self.split_fingerprint():
            # Split again, its validation and test documents could be ones it trained on.
            if self.trainer.state.fn == "fit":
                raise DataError(
                    "the checkpoint trained on another split than these data settings make: "
                    "the data or a data.* setting (split_seed, fractions, max_docs_per_class, "
                    "the source's rows) changed since; resume with those it trained with, or "
                    "start a new run"
                )
            # Evaluating on other data is allowed; on its own data split otherwise, it is not
            # held out: said, not refused.
            log.warning(
                "these splits are not the ones the checkpoint trained on: on the same data, "
                "some validation and test documents may be ones it trained on; pass its run's "
                "split.json as --data.split_file, or the data settings it trained with"
            )
        recorded = state_dict.get(BATCHING_KEY) or {}
        changed = [
            f"data.{name} {getattr(self, name)!r} (the checkpoint's: {value!r})"
            for name, value in recorded.items()
            if getattr(self, name, value) != value
        ]
        if changed and self.trainer is not None and self.trainer.state.fn == "fit":
            # Trained on at another max_tokens while the checkpoints kept recording the old
            # one (which classify then used), or on other batches with the old schedule's
            # step count and the old epoch's batches done: in silence.
            raise DataError(
                f"{getattr(self.trainer, 'ckpt_path', None) or 'the checkpoint'}: a resumed fit "
                f"makes its batches as the checkpoint did; changed: "
                f"{', '.join(changed)}; resume with the checkpoint's, or start a new run"
            )
        if state_dict:
            self._resume_at = (state_dict["epoch"], state_dict["batches_done"])
            self._resume_world_size = state_dict.get("world_size")
            # A checkpoint of an earlier docclass has no count: the total is divided as is.
            if "batches_trained" in state_dict:
                self._position_anchor = (*self._resume_at, state_dict["batches_trained"])

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split, train=False)
