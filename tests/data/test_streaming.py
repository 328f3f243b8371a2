"""The streamed training path on a generated corpus: every document once, bucketed within a
budget, shared between ranks and workers, and a fit that learns from it."""

import functools
import json
import pickle
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
from helpers import CONFIGS, KEYWORDS, write_jsonl
from torch.utils.data import DataLoader

from docclass.data.batching import collate, padding_efficiency
from docclass.data.cleaning import encode_labels, whitespace_key
from docclass.data.streaming import (
    StreamedBatches,
    checked_rows,
    open_stream,
)
from docclass.data.synthetic import planted_keyword_corpus
from docclass.data.tokenizer import TokenizerSpec, token_ids
from docclass.errors import DataError
from docclass.train.datamodule import DocDataModule


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Four training shards (1,200 documents, lengths 5-120 words) and a held-out file."""
    root = tmp_path_factory.mktemp("stream")
    rows = planted_keyword_corpus(400, KEYWORDS, words_per_document=(5, 120), seed=7)
    for shard in range(4):
        write_jsonl(root / f"train-{shard}.jsonl", rows[shard::4])
    held_out = planted_keyword_corpus(60, KEYWORDS, seed=8)
    write_jsonl(root / "held_out.jsonl", held_out)
    return root, rows


def word_encoder(texts):
    """One token per word (ids by length, enough for shapes and counts)."""
    return [[2 + len(word) for word in text.split()] for text in texts]


def streamed(corpus, **options):
    root, _ = corpus
    settings = {
        "open_documents": lambda: open_stream(str(root / "train-*.jsonl")),
        "encode": word_encoder,
        "label_index": {k: i for i, k in enumerate(KEYWORDS)},
        "collate": collate,
        "max_tokens": None,
        "batch_size": 32,
        "max_batch_tokens": 1024,
        "bucket_documents": 300,
        "shuffle_buffer": 200,
        **options,
    }
    return StreamedBatches(**settings)


def documents_in(batches):
    """Each batch's documents as tuples of token ids, for counting."""
    seen = []
    for batch in batches:
        for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            seen.append(tuple(row[mask].tolist()))
    return seen


def test_one_epoch_reads_every_document_once_in_budgeted_length_buckets(corpus):
    _, rows = corpus
    batches = list(streamed(corpus))
    expected = Counter(tuple(ids) for ids in word_encoder([r["text"] for r in rows]))
    assert Counter(documents_in(batches)) == expected
    for batch in batches:
        assert batch["input_ids"].numel() <= 1024 or len(batch["input_ids"]) == 1
    # Sorting within the buffer keeps padding low; one random order would pad heavily.
    assert padding_efficiency(batches) > 0.9
    shuffled = [collate_rows(rows[i : i + 8]) for i in range(0, len(rows), 8)]
    assert padding_efficiency(shuffled) < 0.7


def collate_rows(rows):
    return collate(
        [
            {"input_ids": ids, "label": 0, "index": 0, "truncated": False}
            for ids in word_encoder([r["text"] for r in rows])
        ]
    )


def test_epochs_shuffle_differently_and_repeat_exactly(corpus):
    first = streamed(corpus)
    order = [b["input_ids"].tolist() for b in first]
    again = [b["input_ids"].tolist() for b in streamed(corpus)]
    assert order == again
    first.set_epoch(1)
    assert [b["input_ids"].tolist() for b in first] != order


def test_ranks_share_the_stream_without_overlap_and_run_equal_steps(corpus):
    _, rows = corpus
    shares = [
        list(streamed(corpus, rank=rank, world_size=2, steps_per_epoch=40)) for rank in (0, 1)
    ]
    assert [len(share) for share in shares] == [40, 40]
    # Without a step count no rank may start: it would hang the others at the end.
    with pytest.raises(DataError, match="steps_per_epoch"):
        next(iter(streamed(corpus, rank=0, world_size=2)))
    # One pass of each rank: disjoint shares that together are the corpus.
    once = [documents_in(streamed(corpus, rank=r, world_size=2, steps_per_epoch=1)._pass(0))
            for r in (0, 1)]  # fmt: skip
    expected = Counter(tuple(ids) for ids in word_encoder([r["text"] for r in rows]))
    assert not set(once[0]) & set(once[1])
    assert Counter(once[0]) + Counter(once[1]) == expected


def test_dataloader_workers_split_the_stream(corpus):
    _, rows = corpus
    loader = DataLoader(streamed(corpus), batch_size=None, num_workers=2)
    # Every document exactly once: a count alone would let a duplicate hide an omission.
    expected = Counter(tuple(ids) for ids in word_encoder([r["text"] for r in rows]))
    assert Counter(documents_in(loader)) == expected


@pytest.mark.fault(
    "a streamed document whose label the held-out data does not have",
    "one line naming the label and the fix",
)
def test_unknown_stream_label_is_one_line_naming_the_fix(corpus, tmp_path):
    write_jsonl(tmp_path / "bad.jsonl", [{"text": "some words here", "label": "sport"}])
    batches = streamed(corpus, open_documents=lambda: open_stream(str(tmp_path / "bad.jsonl")))
    with pytest.raises(DataError, match="label 'sport' is not among") as error:
        list(batches)
    assert "\n" not in str(error.value)


@pytest.mark.fault(
    "a stream that matches no files, lacks the text column, is empty, or is not UTF-8",
    "one line naming the stream and the fix",
)
@pytest.mark.parametrize(
    ("stream", "content", "message"),
    [
        ("nowhere/*.jsonl", None, "matches no files"),
        ("{root}/train-0.jsonl", None, "no column 'body'"),
        ("{tmp}/empty.jsonl", b"", "holds no documents"),
        ("{tmp}/latin1.jsonl", '{"body": "café", "label": "x"}\n'.encode("latin-1"),
         "not valid UTF-8"),
    ],
    ids=["no files", "no column", "empty", "not UTF-8"],
)  # fmt: skip
def test_bad_stream_is_one_line(corpus, tmp_path, stream, content, message):
    root, _ = corpus
    path = stream.format(root=root, tmp=tmp_path)
    if content is not None:
        Path(path).write_bytes(content)
    with pytest.raises(DataError, match=message) as error:
        list(checked_rows(open_stream(path, text_column="body")))
    assert "\n" not in str(error.value)


def test_fit_learns_from_a_stream(corpus, tmp_path):
    from docclass.cli import main

    root, _ = corpus
    run_dir = tmp_path / "run"
    main([
        "fit", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.source", str(root / "held_out.jsonl"), "--data.max_docs_per_class", "null",
        "--data.stream", str(root / "train-*.jsonl"), "--data.max_batch_tokens", "2048",
        "--data.steps_per_epoch", "60", "--data.max_tokens", "256",
        "--trainer.max_epochs", "4", "--trainer.callbacks=[]", "--report_after_fit", "false",
        "--trainer.default_root_dir", str(run_dir),
    ])  # fmt: skip
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.9
    assert metrics["epochs_trained"] == 4


def test_stream_options_need_a_stream():
    with pytest.raises(DataError, match="set data.stream"):
        DocDataModule(steps_per_epoch=100)


@pytest.mark.fault(
    "a streamed training set with neither data.steps_per_epoch nor trainer.max_steps",
    "one line: the learning-rate schedule needs one of them",
)
def test_stream_without_a_length_is_one_line(corpus, tmp_path, capsys):
    from docclass.cli import main

    root, _ = corpus
    with pytest.raises(SystemExit) as exit_info:
        main([
            "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.source", str(root / "held_out.jsonl"),
            "--data.stream", str(root / "train-*.jsonl"), "--trainer.callbacks=[]",
            "--trainer.default_root_dir", str(tmp_path),
        ])  # fmt: skip
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "set data.steps_per_epoch or trainer.max_steps" in error[0]


def test_hub_layout_streams_with_renamed_columns(tmp_path):
    import datasets

    # A local folder in a hub dataset's layout goes through the same load_dataset call a hub
    # name does (the hub itself cannot be reached here).
    rows = [{"content": f"document number {i}", "topic": KEYWORDS[i % 3]} for i in range(9)]
    (tmp_path / "data").mkdir()
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "data" / "train-00000-of-00001.parquet")
    stream = open_stream(str(tmp_path), text_column="content", label_column="topic")
    assert list(stream) == [{"text": r["content"], "label": r["topic"]} for r in rows]


def first_token(texts):
    """Each text's first word as its one token id (the test writes the label there)."""
    return [[int(text.split()[0])] for text in texts]


@pytest.mark.fault(
    "integer labels, 1-based and 12 classes, in held-out data and stream",
    "each streamed document trains the class named by its number, never the one at that position",
)
def test_integer_stream_labels_land_on_the_class_of_that_name(tmp_path):
    labels = list(range(1, 13))  # as text, "10" would sort before "2"
    held_out = datasets.Dataset.from_dict({"text": ["x"] * 24, "label": labels * 2})
    _, names = encode_labels({"train": held_out}, None, None, "held-out")
    assert names == [str(v) for v in labels]
    write_jsonl(tmp_path / "s.jsonl", [{"text": f"{v} words", "label": v} for v in labels * 3])
    batches = StreamedBatches(
        functools.partial(open_stream, str(tmp_path / "s.jsonl")),
        first_token,
        {name: i for i, name in enumerate(names)},
        collate,
        max_tokens=None,
        batch_size=8,
    )
    seen = [
        (int(token), int(label))
        for batch in batches
        for token, label in zip(batch["input_ids"][:, 0], batch["labels"], strict=True)
    ]
    assert len(seen) == 36 and all(names[label] == str(value) for value, label in seen)


def test_a_class_label_stream_is_read_by_label_names_not_its_numbering(tmp_path):
    own_order = ["World", "Sports", "Business", "Sci/Tech"]  # the stream's ClassLabel numbering
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=own_order)}
    )
    rows = {"text": [f"{i} words" for i in range(4)], "label": [0, 1, 2, 3]}
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "s.parquet"))
    held_out_index = {name: i for i, name in enumerate(sorted(own_order))}
    batches = StreamedBatches(
        functools.partial(open_stream, str(tmp_path / "s.parquet")),
        first_token,
        held_out_index,
        collate,
        max_tokens=None,
        batch_size=4,
    )
    (batch,) = list(batches)
    for ids, label in zip(batch["input_ids"][:, 0].tolist(), batch["labels"].tolist(), strict=True):
        assert label == held_out_index[own_order[ids]]


def stream_datamodule(root: Path, **options) -> DocDataModule:
    """The module's stream (its held-out file for validation and test) in a DataModule."""
    return DocDataModule(
        source=str(root / "held_out.jsonl"),
        stream=str(root / "train-*.jsonl"),
        tokenizer=TokenizerSpec(vocab_size=300),
        max_tokens=None,
        tokenizer_documents=200,
        **options,
    )


@pytest.mark.fault(
    "DataLoader workers started with spawn (macOS; Linux from Python 3.14) on a streamed set",
    "the stream pickles into every worker; together they read every document once",
)
def test_streamed_training_set_runs_in_spawned_workers(corpus):
    root, rows = corpus
    datamodule = stream_datamodule(root)
    dataset = datamodule.train_dataloader().dataset
    pickle.dumps(dataset)  # what spawn does with it first
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    texts = [row["text"] for row in rows]
    expected = Counter(tuple(ids) for ids in token_ids(datamodule.tokenizer, texts))
    assert Counter(documents_in(loader)) == expected


@pytest.mark.fault(
    "DDP on a streamed set with DataLoader workers started with spawn or forkserver",
    "each rank's worker reads that rank's share (the trainer's rank, not the worker's "
    "uninitialised process group): ranks get disjoint documents",
)
def test_spawned_workers_read_their_ranks_share_of_the_stream(corpus):
    root, rows = corpus
    datamodule = stream_datamodule(root, num_workers=1, steps_per_epoch=4)
    shares = []
    for rank in (0, 1):
        # What the datamodule reads of the trainer when it builds the loader.
        datamodule.trainer = SimpleNamespace(global_rank=rank, world_size=2, current_epoch=0)
        loader = datamodule.train_dataloader()
        if rank == 1:
            loader.multiprocessing_context = "spawn"  # the worker has no process group
        # (rank 0's worker is forked on Linux: as cheap, and it reads the way the other does)
        shares.append(documents_in(loader))
    texts = [row["text"] for row in rows]
    everything = Counter(tuple(ids) for ids in token_ids(datamodule.tokenizer, texts))
    assert all(shares)
    # Disjoint: together they hold no document more often than the stream does.
    repeated = Counter(shares[0]) + Counter(shares[1]) - everything
    assert not repeated, f"{repeated.total()} documents read by both ranks"


def test_the_streamed_tokenizer_never_reads_held_out_texts(corpus, monkeypatch):
    # The stream is the held-out file itself: every validation and test text is in it.
    import docclass.train.datamodule as datamodule_module

    root, _ = corpus
    read = []
    real = datamodule_module.train_tokenizer
    monkeypatch.setattr(
        datamodule_module,
        "train_tokenizer",
        lambda texts, spec: real(read.extend(texts) or texts, spec),
    )
    datamodule = DocDataModule(
        source=str(root / "held_out.jsonl"),
        stream=str(root / "held_out.jsonl"),
        tokenizer=TokenizerSpec(vocab_size=300),
        max_tokens=None,
        tokenizer_documents=1000,
    )
    datamodule.prepare()
    held_out = {whitespace_key(t) for s in ("val", "test") for t in datamodule.splits[s]["text"]}
    assert read and held_out and not held_out & {whitespace_key(t) for t in read}


@pytest.mark.fault(
    "streamed Parquet shards whose ClassLabel names their classes in another order",
    "one line naming both shards and both name lists; never one shard's documents trained "
    "as other classes",
)
def test_streamed_shards_that_name_their_classes_differently_are_refused(tmp_path):
    for shard, order in ((0, ["sport", "biz"]), (1, ["biz", "sport"])):
        features = datasets.Features(
            {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=order)}
        )
        rows = {
            "text": [f"sport {shard}", f"biz {shard}"],
            "label": [order.index("sport"), order.index("biz")],
        }
        datasets.Dataset.from_dict(rows, features=features).to_parquet(
            str(tmp_path / f"shard-{shard}.parquet")
        )
    with pytest.raises(
        DataError,
        match=r"shard-1\.parquet names its label classes differently "
        r"from .*shard-0\.parquet \(class 0: 'biz' against 'sport'",
    ):
        open_stream(str(tmp_path / "shard-*.parquet"))
    # Shards numbered alike are read, each label by its name.
    (tmp_path / "shard-1.parquet").unlink()
    rows = [(row["text"], row["label"]) for row in open_stream(str(tmp_path / "shard-*.parquet"))]
    assert rows == [("sport 0", "sport"), ("biz 0", "biz")]


@pytest.mark.fault(
    "streamed hub-style shards whose ClassLabel is -1 (unlabelled)",
    "one line naming the stream and the value; never read as the last class",
)
def test_an_unlabelled_class_label_in_a_stream_is_refused(tmp_path):
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    )
    rows = {"text": ["good", "bad", "unsure"], "label": [1, 0, -1]}
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "s.parquet"))
    with pytest.raises(DataError, match=r"data.stream '.*s\.parquet': label value -1"):
        list(open_stream(str(tmp_path / "s.parquet")))


def test_a_streamed_csv_keeps_na_and_null_as_words(tmp_path):
    (tmp_path / "s.csv").write_text("text,label\nNA,null\nsome text,N/A\n")
    rows = list(open_stream(str(tmp_path / "s.csv")))
    assert [(row["text"], row["label"]) for row in rows] == [("NA", "null"), ("some text", "N/A")]


@pytest.mark.parametrize("streamed_set", [False, True], ids=["in memory", "streamed"])
def test_the_token_budget_counts_the_width_batches_are_padded_to(corpus, streamed_set):
    """``data.pad_to_multiple`` rounds every batch's width up; ``max_batch_tokens`` is a budget
    of what the model then gets, not of the rows' own lengths."""
    root, _ = corpus
    budget, multiple = 1024, 48
    datamodule = DocDataModule(
        source=str(root / "held_out.jsonl" if streamed_set else root / "train-0.jsonl"),
        stream=str(root / "train-*.jsonl") if streamed_set else None,
        tokenizer=TokenizerSpec(vocab_size=300),
        max_tokens=None,
        max_docs_per_class=None,
        tokenizer_documents=200,
        max_batch_tokens=budget,
        pad_to_multiple=multiple,
        **({"steps_per_epoch": 20} if streamed_set else {}),
    )
    datamodule.trainer = SimpleNamespace(global_rank=0, world_size=1, current_epoch=0)
    if not streamed_set:
        datamodule.setup("fit")
    widths = set()
    for batch in datamodule.train_dataloader():
        rows, width = batch["input_ids"].shape
        widths.add(width)
        assert width % multiple == 0 and rows * width <= budget, (rows, width)
    assert len(widths) > 1  # documents of several widths, cut by the padded one


def test_a_stream_file_whose_name_holds_glob_characters_is_that_file(tmp_path):
    (tmp_path / "corpus[2].jsonl").write_text('{"text": "the named file", "label": "a"}\n')
    (tmp_path / "corpus2.jsonl").write_text('{"text": "what the pattern matches", "label": "b"}\n')
    rows = list(open_stream(str(tmp_path / "corpus[2].jsonl")))
    assert [row["text"] for row in rows] == ["the named file"]


@pytest.mark.fault(
    "a streamed fit resumed with another `data.num_workers`, `bucket_documents`, "
    "`shuffle_buffer`, `steps_per_epoch` or stream files (the same files spelt another way "
    "are the same stream)",
    "refused in one line naming the setting and the checkpoint's value; never some documents "
    "trained twice in the epoch and others not at all",
)
@pytest.mark.parametrize(
    "changed", [{"num_workers": 2}, {"shuffle_buffer": 50}, {"stream": "train-[01].jsonl"}]
)
def test_a_streamed_fit_resumed_with_other_stream_settings_is_refused(corpus, changed):
    from types import SimpleNamespace

    from docclass.train.datamodule import BATCHING_KEY

    root, _ = corpus
    settings = {"source": str(root / "held_out.jsonl"), "stream": str(root / "train-*.jsonl"),
                "steps_per_epoch": 10, "max_docs_per_class": None}  # fmt: skip
    first = DocDataModule(**settings)
    recorded = {"epoch": 0, "batches_done": 3, BATCHING_KEY: first._batching()}
    assert recorded[BATCHING_KEY]["num_workers"] == 0
    if "stream" in changed:
        changed = {"stream": str(root / changed["stream"])}
    resumed = DocDataModule(**{**settings, **changed})
    fitting = SimpleNamespace(state=SimpleNamespace(fn="fit"), ckpt_path="last.ckpt")
    resumed.trainer = fitting
    name = "stream_files" if "stream" in changed else next(iter(changed))
    with pytest.raises(DataError, match=f"changed: data.{name} .*the checkpoint's"):
        resumed.load_state_dict(recorded)
    # The same settings, the stream spelt another way: resumed.
    again = DocDataModule(**{**settings, "stream": str(root / "." / "train-?.jsonl")})
    again.trainer = fitting
    again.load_state_dict(recorded)


def test_a_stream_whose_text_column_holds_numbers_is_refused(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"text": 12, "label": "a"}\n{"text": 7, "label": "b"}\n')
    with pytest.raises(DataError, match=r"column 'text' holds Value\('int64'\), not text"):
        open_stream(str(tmp_path / "s.jsonl"))
