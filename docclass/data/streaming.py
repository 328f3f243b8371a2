"""Training documents read as a stream, for corpora larger than memory.

``data.stream`` names local JSONL / CSV / Parquet files (a glob) or a hub dataset; ``datasets``
reads them lazily (``streaming=True``), shuffles shard order and a buffer of documents each
epoch, splits the stream between DDP ranks and between DataLoader workers. Batches are made
inside a second buffer: its documents are tokenized together, sorted by length and cut into
batches that fill a token budget (or a document count), and the batches go out in a shuffled
order — the bucketing of the in-memory path, within a window of the stream.

Under DDP every rank must run the same number of steps or the gradient all-reduce waits for
ever, and streamed shards differ in length: ``steps_per_epoch`` fixes an epoch's length, a rank
that runs out starts another pass over its share.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import datasets
import torch
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from docclass.data.batching import length_batches, padded_length
from docclass.data.cleaning import label_sort_key, whitespace_key
from docclass.data.sources import (
    FILE_FORMATS,
    csv_options,
    file_class_names,
    looks_like_a_missing_path,
    refuse_other_class_names,
)
from docclass.errors import DataError

log = logging.getLogger(__name__)


def stream_files(stream: str) -> list[str] | None:
    """The local files ``stream`` names, sorted (a file that exists is that file, even where
    its name holds glob characters, a[2].jsonl), or None for a hub dataset's name."""
    stream = os.path.expanduser(stream)
    pattern = any(c in stream for c in "*?[")
    return [stream] if Path(stream).is_file() else sorted(glob.glob(stream)) if pattern else None


def open_stream(
    stream: str,
    hub_config: str | None = None,
    split: str = "train",
    text_column: str = "text",
    label_column: str = "label",
) -> datasets.IterableDataset:
    """``stream`` as a ``datasets.IterableDataset`` with ``text`` and ``label`` columns.
    A path from a config reaches here with its ``~`` (no shell expanded it): expanded."""
    stream = os.path.expanduser(stream)
    files = stream_files(stream)
    # datasets reads data_files as patterns: each file is escaped for it.
    escaped = [glob.escape(f) for f in files or []]
    if files is not None:
        if not files:
            raise DataError(f"data.stream {stream!r} matches no files; check the pattern")
        builder = _stream_files_format(files, label_column, stream)
        try:
            # The cells as written, as for a source (a label "1.10" must not become 1.1).
            options = csv_options(text_column, label_column) if builder == "csv" else {}
            # datasets reads the first rows here to learn the columns.
            loaded = datasets.load_dataset(
                builder, data_files=escaped, split="train", streaming=True, **options
            )
        except StopIteration as error:
            raise DataError(f"data.stream {stream!r} holds no documents") from error
    elif looks_like_a_missing_path(stream):
        raise DataError(f"data.stream {stream!r}: no such file; check the path or the pattern")
    else:
        try:
            loaded = datasets.load_dataset(stream, hub_config, split=split, streaming=True)
        except Exception as error:  # the hub raises many types; all mean "cannot open it"
            raise DataError(
                f"data.stream {stream!r}: neither local files nor a reachable hub dataset "
                f"({type(error).__name__}); pass a glob such as 'shards/*.jsonl'"
            ) from error
    columns = loaded.column_names
    if columns is not None:
        for column in (text_column, label_column):
            if column not in columns:
                raise DataError(
                    f"data.stream {stream!r} has no column {column!r} (it has {columns}); "
                    "set data.text_column / data.label_column"
                )
    if text_column != "text":
        loaded = loaded.rename_column(text_column, "text")
    if label_column != "label":
        loaded = loaded.rename_column(label_column, "label")
    loaded = loaded.select_columns(["text", "label"])
    _refuse_text_that_is_not_text(loaded, stream, text_column)
    feature = (loaded.features or {}).get("label")
    if isinstance(feature, datasets.ClassLabel):
        # The stream's own numbering means nothing to the held-out data: give every label its name.
        loaded = loaded.map(
            functools.partial(_label_name, names=tuple(feature.names), stream=stream)
        )
    return loaded


def _stream_files_format(files: list[str], label_column: str, stream: str) -> str:
    """The datasets builder of a stream's files, which must all be one format and name their
    classes alike: datasets decodes every shard through the first one's ClassLabel, so shards
    numbered apart (class_encode_column on each) would train one's documents as other classes."""
    kinds = {FILE_FORMATS.get(Path(f).suffix.lower()) for f in files}
    if None in kinds or len(kinds) > 1:
        raise DataError(
            f"data.stream {stream!r}: files must all be one of "
            f"{sorted(FILE_FORMATS)}, got {sorted({Path(f).suffix for f in files})}"
        )
    named = [(f, n) for f in files if (n := file_class_names(Path(f), label_column)) is not None]
    refuse_other_class_names(named, f"data.stream {stream!r}")
    return kinds.pop()


def _refuse_text_that_is_not_text(loaded, stream: str, text_column: str) -> None:
    """A text column of numbers (a wrong data.text_column) ended in a bare AttributeError
    inside a DataLoader worker; refused here where the files declare their types."""
    feature = (loaded.features or {}).get("text")
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError(
            f"data.stream {stream!r}: column {text_column!r} holds {feature}, not text; set "
            "data.text_column"
        )


def _label_name(row: dict, names: tuple[str, ...], stream: str) -> dict:
    value = row["label"]
    if value is None or not 0 <= value < len(names):
        # -1 is the hub's "no label": as an index it would name the last class.
        raise DataError(
            f"data.stream {stream!r}: label value {value} names no class of its {len(names)} "
            "(-1 means unlabelled); drop those rows or stream a labelled split"
        )
    return {"label": names[value]}


def checked_rows(documents: Iterable[dict]) -> Iterator[dict]:
    """The stream's rows, a file that is not UTF-8 said in one line."""
    try:
        yield from documents
    except UnicodeDecodeError as error:
        raise DataError(
            f"data.stream: a file is not valid UTF-8 ({error.reason} at byte {error.start}); "
            "re-encode the shards as UTF-8"
        ) from error


def process_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of this process (``(0, 1)`` without torch.distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class StreamedBatches(IterableDataset):
    """Padded training batches from a document stream; see the module docstring.

    Args:
        open_documents: ``() -> datasets.IterableDataset`` of ``text`` / ``label`` rows.
        encode: texts → token id lists (the run's tokenizer).
        label_index: label name → class index; an integer label is looked up by its name.
        collate: rows → batch dict (the in-memory path's, so batches look the same).
        max_tokens: tokens kept per document.
        batch_size: most documents per batch.
        max_batch_tokens: most padded tokens per batch (None: documents count alone).
        bucket_documents: documents tokenized, sorted and cut together.
        shuffle_buffer: ``datasets``' shuffle buffer, in documents.
        steps_per_epoch: batches per epoch on every rank; required under DDP.
        held_out: whitespace keys of validation and test texts, skipped in the stream.
        seed: seeds every shuffle, with the epoch.
        pad_to_multiple: what ``collate`` rounds a batch's width up to: the token budget
            counts the padded width.
        rank, world_size: this process's share (default: torch.distributed's, looked up where
            the stream is read). Pass them when DataLoader workers may be started with spawn or
            forkserver: such a worker has no process group and would read the whole stream.
    """

    def __init__(
        self,
        open_documents: Callable[[], datasets.IterableDataset],
        encode: Callable[[list[str]], list[list[int]]],
        label_index: dict[str, int],
        collate: Callable[[list[dict]], dict],
        max_tokens: int | None,
        batch_size: int,
        max_batch_tokens: int | None = None,
        bucket_documents: int = 2000,
        shuffle_buffer: int = 10000,
        steps_per_epoch: int | None = None,
        held_out: frozenset[str] = frozenset(),
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        pad_to_multiple: int = 1,
    ) -> None:
        super().__init__()
        self.open_documents, self.encode, self.collate = open_documents, encode, collate
        self.label_index = label_index
        self.max_tokens, self.batch_size, self.max_batch_tokens = (
            max_tokens,
            batch_size,
            max_batch_tokens,
        )
        self.bucket_documents, self.shuffle_buffer = bucket_documents, shuffle_buffer
        self.steps_per_epoch, self.held_out, self.seed = steps_per_epoch, held_out, seed
        self.rank, self.world_size = rank, world_size
        self.pad_to_multiple = pad_to_multiple
        self.epoch = 0

    def __len__(self) -> int:
        # Known only when fixed: Lightning then shows progress and plans the LR schedule.
        if not self.steps_per_epoch:
            raise TypeError("a stream without steps_per_epoch has no length")
        return self.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """A new shuffle of shards, buffer and batch order (the LightningModule calls it)."""
        self.epoch = epoch

    def _share(self, pass_index: int) -> datasets.IterableDataset:
        rank, world = process_rank()
        rank = self.rank if self.rank is not None else rank
        world = self.world_size if self.world_size is not None else world
        if world > 1 and not self.steps_per_epoch:
            raise DataError(
                "streaming under DDP needs data.steps_per_epoch: ranks' shares of a stream "
                "differ in length, and a rank that stops early leaves the others waiting"
            )
        documents = self.open_documents()
        if world > 1:
            documents = split_dataset_by_node(documents, rank, world)
        documents = documents.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
        documents.set_epoch(self.epoch * 1_000 + pass_index)
        return documents

    def _label(self, value) -> int:
        """The class index of a stream label, always through its name: an integer label means
        the held-out label named by that number ("2"), never the class at position 2."""
        name = str(value)
        if name not in self.label_index:
            raise DataError(
                f"data.stream: label {value!r} is not among the held-out data's labels "
                f"{sorted(self.label_index, key=label_sort_key)[:20]}; add examples of it to "
                "validation and test, name labels the same way on both sides, or drop it"
            )
        return self.label_index[name]

    def _cut(self, rows: list[dict], generator: torch.Generator) -> Iterator[dict]:
        rows = [r for r in rows if r["text"] and whitespace_key(r["text"]) not in self.held_out]
        ids = self.encode([r["text"] for r in rows])
        tokenized = [
            {
                "input_ids": row_ids[: self.max_tokens] if self.max_tokens else row_ids,
                "label": self._label(row["label"]),
                "index": -1,  # streamed documents have no position in a split
                "truncated": bool(self.max_tokens) and len(row_ids) > self.max_tokens,
            }
            for row, row_ids in zip(rows, ids, strict=True)
            if row_ids
        ]
        # The widths ``collate`` pads to, which the token budget is a budget of.
        widths = [padded_length(len(r["input_ids"]), self.pad_to_multiple) for r in tokenized]
        batches = length_batches(widths, self.batch_size, self.max_batch_tokens)
        for b in torch.randperm(len(batches), generator=generator).tolist():
            yield self.collate([tokenized[i] for i in batches[b]])

    def _pass(self, pass_index: int) -> Iterator[dict]:
        worker = get_worker_info()
        worker_id = worker.id if worker else 0
        generator = torch.Generator().manual_seed(
            ((self.seed * 1_000_003 + self.epoch) * 1_009 + pass_index) * 101 + worker_id
        )
        buffer: list[dict] = []
        for row in checked_rows(self._share(pass_index)):
            buffer.append(row)
            if len(buffer) == self.bucket_documents:
                yield from self._cut(buffer, generator)
                buffer = []
        if buffer:
            yield from self._cut(buffer, generator)

    def __iter__(self) -> Iterator[dict]:
        steps, pass_index = 0, 0
        worker = get_worker_info()
        workers = worker.num_workers if worker else 1
        # Each DataLoader worker reads its own part of this rank's share; the epoch's steps
        # are split between them so the rank still yields steps_per_epoch batches in all.
        quota = None
        if self.steps_per_epoch:
            quota = self.steps_per_epoch // workers + (
                1 if worker and worker.id < self.steps_per_epoch % workers else 0
            )
        while True:
            produced = 0
            for batch in self._pass(pass_index):
                if quota is not None and steps == quota:
                    return
                yield batch
                steps += 1
                produced += 1
            if quota is None or steps >= quota:
                return
            if not produced:
                raise DataError(
                    "data.stream gave this rank (or worker) no documents; use fewer "
                    "processes or workers, or more shards"
                )
            pass_index += 1


class ResumedStreamLoader(DataLoader):
    """A DataLoader whose first iterator drops the first ``skip`` batches: a streamed run resumed
    inside an epoch, whose checkpoint saved the epoch and the batches of it done.

    A stream has no index to start from, so that epoch is read again (same seed, epoch and
    DataLoader workers give the same batches in the same order) and its first batches are
    dropped here, in the main process. Not in the workers: the DataLoader takes the workers'
    batches in turn starting from the first worker, so with several workers the resumed
    iterator would interleave the rest of the epoch in another order.
    """

    def __init__(self, *args, skip: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.skip = skip

    def __iter__(self):
        iterator = super().__iter__()
        skip, self.skip = self.skip, 0  # later epochs start whole
        for _ in range(skip):
            if next(iterator, None) is None:
                break
        return iterator


def stream_sample(
    documents: Iterable[dict], size: int, held_out: frozenset[str] = frozenset()
) -> list[str]:
    """The first ``size`` non-empty texts of a stream (what the tokenizer is trained on), the
    held-out ones (whitespace keys of validation and test texts) skipped as training skips them."""
    texts = []
    for row in checked_rows(documents):
        if row["text"] and row["text"].strip() and whitespace_key(row["text"]) not in held_out:
            texts.append(row["text"])
            if len(texts) == size:
                break
    return texts
