import csv
import json
import logging
import os
import shutil
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import AG_NEWS_CLASSES, topical_rows, write_ag_news_like
from tokenizers import Tokenizer

from docclass.data.batching import collate
from docclass.data.cleaning import deduplicate, label_sort_key, whitespace_key
from docclass.data.samplers import BucketBatchSampler
from docclass.data.sources import SourceSpec, decode_text, load_source, local_source_path
from docclass.data.streaming import open_stream
from docclass.data.tokenizer import TokenizerSpec, encode_batch
from docclass.errors import DataError
from docclass.train.datamodule import SPLITS as SPLIT_NAMES
from docclass.train.datamodule import DocDataModule

SMALL_TOKENIZER = TokenizerSpec(vocab_size=3000)
BBC_CLASSES = ["business", "entertainment", "politics", "sports", "tech"]


@pytest.fixture(scope="module")
def bbc() -> DocDataModule:
    datamodule = DocDataModule(source="bbc", tokenizer=SMALL_TOKENIZER, max_tokens=256)
    datamodule.prepare()
    return datamodule


def split_keys(datamodule: DocDataModule, split: str) -> set[str]:
    return {whitespace_key(t) for t in datamodule.splits[split]["text"]}


class TestEmbeddedBBC:
    def test_reads_every_file_and_decodes_the_legacy_one(self):
        loaded = load_source(SourceSpec("bbc"))
        corpus = loaded.splits["train"]
        assert len(corpus) == 2225
        assert loaded.label_names == BBC_CLASSES
        assert loaded.stats["non_utf8_files"] == 1
        legacy = corpus[corpus["id"].index("sports/199.txt")]["text"]
        assert "£" in legacy and "\ufffd" not in legacy

    def test_duplicates_removed_and_splits_disjoint(self, bbc):
        assert bbc.stats["duplicates_removed"] == 100
        assert bbc.stats["documents_read"] == 2225
        assert "source_path" not in bbc.stats  # a name, not a path: nothing to resolve
        train, val, test = (split_keys(bbc, s) for s in ("train", "val", "test"))
        assert not (train & test) and not (train & val) and not (val & test)
        assert len(train) + len(val) + len(test) == 2125

    def test_split_is_80_10_10_and_stratified(self, bbc):
        sizes = {s: len(bbc.splits[s]) for s in ("train", "val", "test")}
        assert abs(sizes["test"] / 2125 - 0.1) < 0.01 and abs(sizes["val"] / 2125 - 0.1) < 0.01
        all_counts = torch.bincount(torch.tensor(bbc.splits["train"]["label"]), minlength=5).float()
        test_counts = torch.bincount(torch.tensor(bbc.splits["test"]["label"]), minlength=5).float()
        assert torch.allclose(
            test_counts / test_counts.sum(), all_counts / all_counts.sum(), atol=0.01
        )

    def test_split_is_deterministic_and_seeded(self, bbc, tmp_path):
        again = DocDataModule(source="bbc", tokenizer=SMALL_TOKENIZER)
        again.prepare()
        assert again.splits["test"]["id"] == bbc.splits["test"]["id"]
        other = DocDataModule(source="bbc", tokenizer=SMALL_TOKENIZER, split_seed=1)
        other.prepare()
        assert other.splits["test"]["id"] != bbc.splits["test"]["id"]

    def test_split_file_round_trip(self, bbc, tmp_path):
        path = tmp_path / "split.json"
        bbc.write_split(path)
        reused = DocDataModule(
            source="bbc", tokenizer=SMALL_TOKENIZER, split_seed=7, split_file=str(path)
        )
        reused.prepare()
        for split in ("train", "val", "test"):
            assert reused.splits[split]["id"] == bbc.splits[split]["id"]

    def test_tokenizer_trained_on_train_split_only(self, bbc):
        vocabulary = bbc.tokenizer.get_vocab()
        assert len(vocabulary) == 3000
        # A token that occurs only in held-out documents cannot be a whole-word entry.
        train_text = " ".join(bbc.splits["train"]["text"]).lower()
        held_out_only = {
            w
            for t in bbc.splits["test"]["text"]
            for w in t.lower().split()
            if w.isalpha() and len(w) > 6 and w not in train_text
        }
        assert held_out_only and not held_out_only & vocabulary.keys()

    def test_a_tokenizer_files_own_truncation_and_padding_are_not_applied(self, bbc):
        # A tokenizer.json edited or exported elsewhere may carry them: docclass cuts at
        # max_tokens itself (and flags it), and padding would be read as words.
        text = bbc.splits["test"]["text"][0]
        plain = encode_batch(Tokenizer.from_str(bbc.tokenizer.to_str()), [text])[0].ids
        edited = Tokenizer.from_str(bbc.tokenizer.to_str())
        edited.enable_truncation(3)
        edited.enable_padding(length=len(plain) + 40)
        assert encode_batch(Tokenizer.from_str(edited.to_str()), [text])[0].ids == plain

    def test_truncation_is_flagged(self, bbc):
        tokenized = bbc.tokenized("test")
        assert max(len(ids) for ids in tokenized["input_ids"]) == 256
        flagged = [
            t for t, n in zip(tokenized["truncated"], tokenized["n_tokens"], strict=True) if t
        ]
        assert flagged and all(
            n > 256 for t, n in zip(tokenized["truncated"], tokenized["n_tokens"], strict=True) if t
        )

    def test_batches_pad_to_their_own_longest(self, bbc):
        loader = bbc.train_dataloader()
        real = padded = 0
        seen = []
        for batch in loader:
            assert (
                batch["input_ids"].dtype == torch.long
                and batch["attention_mask"].dtype == torch.bool
            )
            assert batch["attention_mask"].any(-1).all()
            real += batch["attention_mask"].sum().item()
            padded += batch["attention_mask"].numel()
            seen += batch["index"].tolist()
        assert sorted(seen) == list(range(len(bbc.splits["train"])))
        assert real / padded > 0.95


class TestBucketBatchSampler:
    def test_each_index_once_reproducible_and_reshuffled_per_epoch(self):
        lengths = torch.randint(1, 500, (1000,)).tolist()
        # A fixed index order: only the sampler's own epoch can change its batch order.
        sampler = BucketBatchSampler(
            torch.utils.data.SequentialSampler(range(1000)), 32, False, lengths, seed=3
        )
        first = list(sampler)
        assert sorted(i for b in first for i in b) == list(range(1000))
        assert all(len(b) <= 32 for b in first)
        assert list(sampler) == first  # the same epoch gives the same batches
        sampler.set_epoch(1)
        second = list(sampler)
        assert second != first and sorted(map(sorted, second)) == sorted(map(sorted, first))
        sampler.set_epoch(0)
        assert list(sampler) == first

    def test_drop_last(self):
        sampler = BucketBatchSampler(
            range(70), 32, True, [5] * 70, bucket_batches=10, shuffle=False
        )
        assert [len(b) for b in sampler] == [32, 32]

    def test_token_budget_holds_and_every_index_comes_once(self):
        lengths = torch.randint(1, 500, (1000,)).tolist()
        sampler = BucketBatchSampler(
            torch.utils.data.RandomSampler(range(1000)), 64, False, lengths, seed=3,
            max_batch_tokens=4096,
        )  # fmt: skip
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(1000))
        for batch in batches:
            assert len(batch) <= 64 and len(batch) * max(lengths[i] for i in batch) <= 4096
        assert len(sampler) == len(batches)
        # Short documents travel in larger batches than long ones.
        assert len(batches[[min(lengths[i] for i in b) for b in batches].index(1)]) == 64

    def test_token_budget_gives_every_ddp_rank_the_same_number_of_batches(self):
        # Short and long documents alternate: 7 batches of short ones (32 a batch), 50 of long
        # ones (4 of 400 tokens fill 1,600). 57 batches are split to 58, 29 for each rank,
        # which would otherwise leave one rank waiting in the all-reduce.
        lengths = [10 if i % 2 == 0 else 400 for i in range(400)]
        shares = []
        for rank in (0, 1):
            sampler = BucketBatchSampler(
                torch.utils.data.SequentialSampler(range(400)), 32, False, lengths,
                max_batch_tokens=1600, shuffle=False, rank=rank, world_size=2,
            )  # fmt: skip
            shares.append(list(sampler))
            assert len(sampler) == len(shares[-1]) == 29
        assert sorted(i for share in shares for b in share for i in b) == list(range(400))
        for batch in shares[0] + shares[1]:
            assert len(batch) * max(lengths[i] for i in batch) <= 1600


def test_collate_pads_and_masks():
    rows = [
        {"input_ids": [5, 6, 7], "label": 1, "index": 0, "truncated": False},
        {"input_ids": [8], "label": 0, "index": 1, "truncated": True},
    ]
    batch = collate(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[True, True, True], [True, False, False]]
    assert batch["labels"].tolist() == [1, 0] and batch["truncated"].tolist() == [False, True]
    # Rounded up to a multiple: fewer distinct shapes for a compiled model, all of it padding.
    rounded = collate(rows, pad_to_multiple=4)
    assert rounded["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert rounded["attention_mask"].sum().item() == 4
    assert collate(rows, pad_to_multiple=3)["input_ids"].shape == (2, 3)


@pytest.mark.fault(
    "class-folder file that is not valid UTF-8",
    "UTF-16 or UTF-32 by its mark; else the whole file as Windows-1252, or as UTF-8 whose stray "
    "bytes (pasted curly quotes, dashes, a £) read as Windows-1252, whichever its bytes speak "
    "for; a warning, and counted in `metrics.json`",
)
def test_decode_falls_back_to_windows_1252():
    assert decode_text("£5 café".encode()) == ("£5 café", False)
    assert decode_text("hi there".encode("utf-16")) == ("hi there", True)
    assert decode_text("hi there".encode("utf-32")) == ("hi there", True)
    assert decode_text("\ufeffhi".encode()) == ("hi", False)  # a UTF-8 mark is no text
    assert decode_text(b"\x81 x") == ("\ufffd x", True)  # a byte Windows-1252 leaves undefined
    # Windows-1252 files read exactly, even where some accented letter and the punctuation after
    # it happen to spell a valid UTF-8 character (É’ is ɒ, é followed by a no-break space and
    # » a Chinese character, é… another).
    for legacy in (
        "£5 café",
        "I love café",
        "Le “CAFÉ” à Paris, très bon café",
        "JOSÉ’s café près de l’église",
        "JOSÉ’s CAFÉ” près",
        "Il a dit « c’est l’été\xa0».",
        "l’été\xa0»",
        "“Touché…” dit-il, très",
        "MAÇÃ… IRMÃ’s",
        "CAFÉ’s café’s",
        "He said “Touché…” to José’s friend",
    ):
        assert decode_text(legacy.encode("cp1252")) == (legacy, True), legacy
    # UTF-8 of any script with stray Windows-1252 punctuation pasted in: both parts exactly.
    for utf8, stray, text in (
        ("café naïve ", b"\x96 dash", "café naïve – dash"),
        ("Déjà vu ", b"\x93quoted\x94 it\x92s", "Déjà vu “quoted” it’s"),
        ("Καλημέρα κόσμε ", b"\x92", "Καλημέρα κόσμε ’"),
        ("Ναι ο ", b"\x85\x96\x97\x92", "Ναι ο …–—’"),
        ("Dzień dobry, był ", b"\x93x\x94", "Dzień dobry, był “x”"),
        ("România este o țară frumoasă ", b"\x92", "România este o țară frumoasă ’"),
        ("π r² and 5 μm ", b"\x93x\x94", "π r² and 5 μm “x”"),
        # A Windows-1252 letter pasted into a word-rich UTF-8 file is outvoted by its words.
        ("Καλημέρα κόσμε ", b"\xa35", "Καλημέρα κόσμε £5"),
        ("中文文本分类 ", b"caf\xe9 ok", "中文文本分类 café ok"),
        # ... and so is a symbol pasted into Latin text whose accented letters follow lowercase.
        ("El niño tenía 20", b"\xb0" + " en España".encode(), "El niño tenía 20° en España"),
        ("Le café est très bon. Prix", b"\xa0: 5", "Le café est très bon. Prix\xa0: 5"),
    ):
        assert decode_text(utf8.encode() + stray) == (text, True), text
    # A UTF-8 character cut short is one replacement character, not Windows-1252 letters.
    assert decode_text("Καλημέρα".encode() + b"\xce") == ("Καλημέρα\ufffd", True)
    assert decode_text("中文".encode() + b"\xe4\xb8 and " + "中".encode()) == (
        "中文\ufffd and 中",
        True,
    )
    # A UTF-8 mark says UTF-8, so even a Windows-1252 letter pasted in leaves the rest alone.
    assert decode_text(b"\xef\xbb\xbf" + "café".encode() + b" \xa3") == ("café £", True)


def test_a_legacy_file_warns_in_a_users_folder_not_in_the_packaged_corpus(tmp_path, caplog):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.txt").write_bytes(b"\xa35 caf\xe9")
    with caplog.at_level(logging.INFO, logger="docclass"):
        load_source(SourceSpec(str(tmp_path)))
        load_source(SourceSpec("bbc"))
    levels = [r.levelno for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    # The user can re-save their file; nobody can re-save the packaged article.
    assert levels == [logging.WARNING, logging.INFO]


def test_deduplicate_keeps_first_and_drops_conflicts():
    data = datasets.Dataset.from_dict(
        {
            "text": ["a b", "a  b", "c", "c", "d", "e"],
            "label": [0, 0, 1, 2, 0, 1],
            "id": list("123456"),
        }
    )
    kept, removed = deduplicate(data, also_remove={"e"})
    assert kept["id"] == ["1", "5"] and removed == 4


# -- files and hub-shaped folders ---------------------------------------------------------


def test_hub_loader_on_an_ag_news_shaped_folder(tmp_path):
    root = write_ag_news_like(tmp_path / "ag_news")
    datamodule = DocDataModule(source=str(root), tokenizer=SMALL_TOKENIZER, val_fraction=0.25)
    assert datamodule.num_classes == 4
    assert datamodule.label_names == AG_NEWS_CLASSES
    assert len(datamodule.splits["test"]) == 20  # the source's own test split, untouched
    assert len(datamodule.splits["train"]) + len(datamodule.splits["val"]) == 80
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["input_ids"].shape[0] == 32


def test_a_shipped_validation_split_left_unset_is_named_in_a_warning(tmp_path, caplog):
    root = write_ag_news_like(tmp_path / "ag_news")
    shutil.copy(
        root / "data" / "test-00000-of-00001.parquet",
        root / "data" / "validation-00000-of-00001.parquet",
    )
    with caplog.at_level(logging.WARNING, logger="docclass"):
        load_source(SourceSpec(str(root)))
    assert "its 'validation' split is not used" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="docclass"):
        load_source(SourceSpec(str(root), val_split="validation"))
    assert "not used" not in caplog.text


def test_tfidf_anchor_scores_the_same_split(tmp_path):
    from benchmarks.anchors import tfidf_svm_anchor

    root = write_ag_news_like(tmp_path / "ag_news", n_train=120, n_test=40)
    datamodule = DocDataModule(source=str(root), tokenizer=SMALL_TOKENIZER, val_fraction=0.25)
    figures = tfidf_svm_anchor(datamodule)
    # Topic words decide the label in this synthetic corpus: a linear model must get it right.
    assert figures["test_acc"] == 1.0 and figures["test_documents"] == 40


def test_dbpedia_shaped_parquet_with_a_configured_text_column(tmp_path):
    rows = topical_rows(60)
    data = datasets.Dataset.from_dict(
        {"label": rows["label"], "title": ["t"] * 60, "content": rows["text"]}
    )
    path = tmp_path / "dbpedia.parquet"
    data.to_parquet(str(path))
    datamodule = DocDataModule(
        source=str(path),
        text_column="content",
        tokenizer=SMALL_TOKENIZER,
        val_fraction=0.2,
        test_fraction=0.2,
    )
    datamodule.prepare()
    assert datamodule.label_names == ["0", "1", "2", "3"]
    assert sum(len(d) for d in datamodule.splits.values()) == 60


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_local_files_with_string_labels(tmp_path, suffix):
    rows = topical_rows(40)
    data = datasets.Dataset.from_dict(
        {
            "body": rows["text"] + ["   ", ""],
            "topic": [AG_NEWS_CLASSES[i] for i in rows["label"]] + ["World"] * 2,
        }
    )
    path = tmp_path / f"docs{suffix}"
    data.to_csv(str(path), index=False) if suffix == ".csv" else data.to_json(str(path))
    datamodule = DocDataModule(
        source=str(path),
        text_column="body",
        label_column="topic",
        tokenizer=SMALL_TOKENIZER,
        val_fraction=0.2,
        test_fraction=0.2,
    )
    datamodule.prepare()
    assert datamodule.label_names == sorted(AG_NEWS_CLASSES)
    assert datamodule.stats["empty_dropped"] == 2
    # Where the file was, for commands run later from another folder (calibrate checks it).
    assert datamodule.stats["source_path"] == str(path.resolve())


def test_folder_of_class_subfolders(tmp_path):
    rows = topical_rows(40)
    for i, (text, label) in enumerate(zip(rows["text"], rows["label"], strict=True)):
        folder = tmp_path / AG_NEWS_CLASSES[label].replace("/", "-")
        folder.mkdir(exist_ok=True)
        (folder / f"{i}.txt").write_text(text)
    datamodule = DocDataModule(
        source=str(tmp_path), tokenizer=SMALL_TOKENIZER, val_fraction=0.2, test_fraction=0.2
    )
    assert datamodule.num_classes == 4
    assert datamodule.splits["test"]["id"][0].endswith(".txt")


def test_class_folders_skip_system_folders_and_hidden_files_and_read_any_case(tmp_path):
    for name, text in (("sport/a.txt", "goal match"), ("tech/b.TXT", "chip code")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "sport" / "._a.txt").write_bytes(b"\x00\x05\x16\x07 mac metadata")
    (tmp_path / "__MACOSX" / "sport").mkdir(parents=True)
    (tmp_path / "__MACOSX" / "x.txt").write_text("resource fork")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.md").write_text("not a class")
    loaded = load_source(SourceSpec(str(tmp_path)))
    assert loaded.label_names == ["sport", "tech"]
    assert list(loaded.splits["train"]["id"]) == ["sport/a.txt", "tech/b.TXT"]
    # Only the system folders: a class may be named __label__x (fastText's convention).
    (tmp_path / "__label__x").mkdir()
    (tmp_path / "__label__x" / "c.txt").write_text("x text")
    assert load_source(SourceSpec(str(tmp_path))).label_names == ["__label__x", "sport", "tech"]


@pytest.mark.fault(
    "class folders with entries docclass does not read (numbered files without `.txt`, a "
    "class's sub-folder, a `.txt` beside the classes), or beside a dataset's data files",
    "a warning naming the entries not read; class folders beside data files (`train.csv`, "
    "`data/*.parquet`) refused in one line, never a `notes/` folder trained as the corpus",
)
def test_class_folders_name_what_they_do_not_read_and_never_hide_data_files(tmp_path, caplog):
    for name in ("sport/a.txt", "sport/51060", "sport/2019/b.txt", "tech/c.txt", "stray.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("goal match chip code")
    with caplog.at_level(logging.WARNING, logger="docclass"):
        loaded = load_source(SourceSpec(str(tmp_path)))
    assert list(loaded.splits["train"]["id"]) == ["sport/a.txt", "tech/c.txt"]
    assert "3 entries not read" in caplog.text
    assert "['stray.txt', 'sport/2019', 'sport/51060']" in caplog.text
    hub = write_ag_news_like(tmp_path / "hub", 20)
    (hub / "notes").mkdir()
    (hub / "notes" / "how_collected.txt").write_text("we collected it")
    message = one_line_error(source=str(hub))
    assert "holds both sub-folders of .txt files and data files (['data/test-" in message
    (hub / "train.csv").write_text("text,label\na,b\n")
    assert "(['train.csv', 'data/test-" in one_line_error(source=str(hub))


@pytest.mark.fault(
    "class folders whose file or folder names are not UTF-8 (`caf\\xe9.txt`, `m\\xfasica/`)",
    "read, the bad bytes spelt out in ids and class names (a lone surrogate ended training "
    "with a bare UnicodeEncodeError)",
)
def test_class_folder_names_that_are_not_utf8_are_read_with_printable_names(tmp_path):
    for name in (b"sport/caf\xe9.txt", b"m\xfasica/a.txt"):
        path = Path(os.fsdecode(bytes(tmp_path) + b"/" + name))
        path.parent.mkdir(exist_ok=True)
        path.write_text("goal match")
    loaded = load_source(SourceSpec(str(tmp_path)))
    assert loaded.label_names == ["m\\xfasica", "sport"]
    assert list(loaded.splits["train"]["id"]) == ["m\\xfasica/a.txt", "sport/caf\\xe9.txt"]
    assert list(loaded.splits["train"]["label"]) == ["m\\xfasica", "sport"]


def test_max_docs_per_class_beside_a_split_file_says_it_is_not_applied(bbc, tmp_path, caplog):
    bbc.write_split(tmp_path / "split.json")
    with caplog.at_level(logging.INFO, logger="docclass"):
        capped = DocDataModule(
            tokenizer=SMALL_TOKENIZER,
            split_file=str(tmp_path / "split.json"),
            max_docs_per_class=3,
        )
        capped.prepare()
    (record,) = [r for r in caplog.records if "max_docs_per_class=3" in r.getMessage()]
    assert "is not applied" in record.getMessage() and record.levelno == logging.INFO
    assert capped.splits["train"]["id"] == bbc.splits["train"]["id"]


# -- bad input: one line naming the problem and the fix ------------------------------------
def labelled_csv(tmp_path, labels: list[str]) -> str:
    """A CSV of one short document per label, in order."""
    path = tmp_path / "d.csv"
    rows = "".join(f"doc {i} words,{label}\n" for i, label in enumerate(labels))
    path.write_text("text,label\n" + rows)
    return str(path)


def one_line_error(**settings) -> str:
    with pytest.raises(DataError) as caught:
        DocDataModule(tokenizer=SMALL_TOKENIZER, **settings).prepare()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.fault(
    "data source file that does not exist",
    "one line naming it",
)
def test_missing_file(tmp_path):
    message = one_line_error(source=str(tmp_path / "nope.csv"))
    assert "nope.csv: no such file" in message


@pytest.mark.fault(
    "a dataset folder holding a file whose name starts with `_` (an old copy kept aside)",
    "read as the layout names it (datasets reads it), with a warning naming it; one the layout "
    "leaves out is refused like any other",
)
def test_files_starting_with_an_underscore_are_named_when_read_and_refused_when_left_out(
    tmp_path, caplog
):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name, rows in (("train.csv", topical_rows(20)), ("_test_v1.csv", topical_rows(4))):
        datasets.Dataset.from_dict(rows).to_csv(str(folder / name), index=False)
    with caplog.at_level("WARNING", logger="docclass"):
        load_source(SourceSpec(str(folder)))
    assert "files starting with '_' are read as data too: ['_test_v1.csv']" in caplog.text
    (folder / "_test_v1.csv").rename(folder / "_notes.csv")
    with pytest.raises(DataError, match=r"leaves out \['_notes.csv'\]"):
        load_source(SourceSpec(str(folder)))


@pytest.mark.fault(
    "data source or stream spelt like a path that does not exist (`data/my_corpus` beside a "
    "`data/` folder, `a/b/c`, a data file's suffix: `notes.txt`, `train.csv.gz`)",
    "one line naming it; never fetched from the hub",
)
@pytest.mark.parametrize(
    "source", ["data/my_corpus", "corpora/news/train", "notes.txt", "train.csv.gz", "c.tsv"]
)
def test_a_missing_path_is_never_read_as_a_hub_name(tmp_path, monkeypatch, source):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    fetched = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: fetched.append(a))
    message = one_line_error(source=source)
    assert f"{source}: no such file or folder" in message
    with pytest.raises(DataError, match="no such file"):
        open_stream(source)
    assert not fetched


def test_csv_placeholders_are_values_not_missing(tmp_path):
    # pandas would read "NA" and "null" as missing: two classes merged into one "None".
    path = tmp_path / "d.csv"
    path.write_text("text,label\nNA,NA\nsome text,null\nmore text,N/A\n")
    train = load_source(SourceSpec(str(path))).splits["train"]
    assert list(train["text"]) == ["NA", "some text", "more text"]
    assert list(train["label"]) == ["NA", "null", "N/A"]


@pytest.mark.fault(
    "CSV labels or ids that read as numbers (`1.10` beside `1.1`, `007` beside `7`), in a "
    "file, a folder of CSVs or a stream",
    "read as written: each spelling its own class, ids keep their zeros (pandas' guess made "
    "`1.10` and `1.1` one class)",
)
def test_csv_cells_are_read_as_written_never_as_numbers(tmp_path):
    rows = "".join(f"{i:03d},doc {i} words,{label}\n" for i, label in
                   enumerate(["1.10", "1.1", "007", "7", "NA"] * 10))  # fmt: skip
    (tmp_path / "folder").mkdir()
    for path in (tmp_path / "d.csv", tmp_path / "folder" / "train.csv"):
        path.write_text("id,text,label\n" + rows)
        train = load_source(SourceSpec(str(path))).splits["train"]
        assert sorted(set(train["label"])) == ["007", "1.1", "1.10", "7", "NA"], path
        assert train["id"][:2] == ["000", "001"]
    streamed = list(open_stream(str(tmp_path / "d.csv")))
    assert [row["label"] for row in streamed[:5]] == ["1.10", "1.1", "007", "7", "NA"]
    datamodule = DocDataModule(source=str(tmp_path / "d.csv"), tokenizer=SMALL_TOKENIZER)
    datamodule.prepare()
    assert datamodule.label_names == ["007", "7", "1.1", "1.10", "NA"]  # numbers by spelling
    assert sorted(["7", "007"], key=label_sort_key) == sorted(["007", "7"], key=label_sort_key)


@pytest.mark.fault(
    "a dataset folder whose layout leaves data files out (`holdout.csv` beside `train.csv`; "
    "a split in two formats)",
    "one line naming the files left out and how to name them; never trained without them",
)
def test_a_dataset_folder_that_leaves_data_files_out_is_refused(tmp_path):
    def write(name):
        path = tmp_path / "hub" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("text,label\n" + "".join(f"{name} {i},a\n" for i in range(6)))

    for name in ("train.csv", "test.csv", "holdout.csv", ".hidden/x.csv"):
        write(name)
    message = one_line_error(source=str(tmp_path / "hub"))
    assert "reads 2 of its 3 data files and leaves out ['holdout.csv']" in message
    (tmp_path / "hub" / "holdout.csv").unlink()
    # datasets' own records are not data; a compressed table left out is.
    (tmp_path / "hub" / "dataset_infos.json").write_text("{}")
    assert len(load_source(SourceSpec(str(tmp_path / "hub"))).splits["test"]) == 6
    write("holdout.csv")
    (tmp_path / "hub" / "holdout.csv").rename(tmp_path / "hub" / "holdout.csv.gz")
    assert "leaves out ['holdout.csv.gz']" in one_line_error(source=str(tmp_path / "hub"))
    (tmp_path / "hub" / "holdout.csv.gz").unlink()
    for name in ("holdout.tsv", "holdout.arrow"):  # tables datasets could read, left out too
        write(name)
        assert f"leaves out ['{name}']" in one_line_error(source=str(tmp_path / "hub"))
        (tmp_path / "hub" / name).unlink()
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {split: datasets.Dataset.from_dict({"text": ["a b", "c d"], "label": ["x", "y"]})
         for split in ("train", "test")}
    ).save_to_disk(str(saved))  # fmt: skip
    assert len(load_source(SourceSpec(str(saved))).splits["test"]) == 2
    write("train-0.csv")
    for k in (1, 2):
        (tmp_path / "hub" / f"train-{k}.jsonl").write_text('{"text": "b", "label": "b"}\n')
    for name in ("train.csv", "test.csv"):
        (tmp_path / "hub" / name).unlink()
    message = one_line_error(source=str(tmp_path / "hub"))
    assert "reads 2 of its 3 data files and leaves out ['train-0.csv']" in message


@pytest.mark.fault(
    "data.test_split naming a split the source lacks (`tests` for `test`)",
    "one line naming the splits it has; never a test set carved from training instead",
)
def test_a_named_test_split_the_source_lacks_is_refused(tmp_path):
    write_ag_news_like(tmp_path / "hub", 20)
    message = one_line_error(source=str(tmp_path / "hub"), test_split="tests")
    assert "has no split 'tests' (it has ['train', 'test'])" in message


@pytest.mark.fault(
    "a label column of lists (multi-label), a text column of numbers, one column named for "
    "both, or no label column for training",
    "one line naming the column and what it holds; never a class per list spelling",
)
def test_a_column_that_does_not_hold_one_value_is_refused(tmp_path):
    features = datasets.Features(
        {"text": datasets.Value("string"), "labels": datasets.Sequence(datasets.ClassLabel(
            names=["joy", "anger"]))}
    )  # fmt: skip
    rows = {"text": [f"doc {i}" for i in range(20)], "labels": [[0], [0, 1]] * 10}
    path = str(tmp_path / "multi.parquet")
    datasets.Dataset.from_dict(rows, features=features).to_parquet(path)
    message = one_line_error(source=path, label_column="labels")
    assert "label column 'labels' holds" in message and "multi-label" in message
    table = tmp_path / "d.csv"
    table.write_text("text,label\n" + "".join(f"t {i},{'ab'[i % 2]}\n" for i in range(20)))
    for columns in ({"label_column": None}, {"label_column": "text"}, {"text_column": "label"}):
        assert "name two different columns" in one_line_error(source=str(table), **columns)
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text("".join(json.dumps({"text": i, "label": "a"}) + "\n" for i in range(9)))
    assert "text column 'text' holds Value('int64')" in one_line_error(source=str(numbers))


@pytest.mark.fault(
    "labels spelt two ways (`sport`, ` sport`, `Sport`; NFC and NFD `café`, a zero-width space), "
    "in a table or as class folders",
    "one line naming the spellings; never two classes of one",
)
def test_labels_spelt_two_ways_are_refused(tmp_path):
    message = one_line_error(
        source=labelled_csv(tmp_path, ["sport", " sport", "Sport", "tech"] * 5)
    )
    assert "label(s) [' sport', 'Sport', 'sport'] differ only in case, spaces or" in message
    # The same word in two Unicode forms, or with an invisible character, is one label too.
    for spelt in ("cafe\u0301", "caf\u00e9\u200b", "caf\u00e9\u200e"):
        message = one_line_error(source=labelled_csv(tmp_path, ["caf\u00e9", spelt, "tech"] * 5))
        spellings = ascii(sorted(["caf\u00e9", spelt]))
        assert f"label(s) {spellings} differ only in case" in message
    # Labels that only NFKC would fold together are two labels.
    source = labelled_csv(tmp_path, ["CO2", "CO\u2082", "tech"] * 5)
    assert load_source(SourceSpec(source)).splits["train"]["label"][:2] == ["CO2", "CO\u2082"]
    folders = tmp_path / "folders"
    for name in ("sport", "Sport", "tech"):
        for i in range(5):
            (folders / name).mkdir(parents=True, exist_ok=True)
            (folders / name / f"{i}.txt").write_text(f"{name} story number {i}")
    message = one_line_error(source=str(folders))
    assert "label(s) ['Sport', 'sport'] differ only in case, spaces or Unicode form" in message
    assert "merge those class folders" in message


@pytest.mark.fault(
    "a ClassLabel class with test documents and no training document",
    "one line naming the class; never an output no document trained, scored on test",
)
def test_a_class_label_without_training_documents_is_refused(tmp_path):
    rows = topical_rows(20)
    _class_label_parquet(tmp_path / "hub" / "data" / "train-0.parquet", rows["text"],
                         [label % 2 for label in rows["label"]], AG_NEWS_CLASSES)  # fmt: skip
    _class_label_parquet(tmp_path / "hub" / "data" / "test-0.parquet", rows["text"],
                         rows["label"], AG_NEWS_CLASSES)  # fmt: skip
    message = one_line_error(source=str(tmp_path / "hub"))
    assert f"label(s) {sorted(AG_NEWS_CLASSES[2:])} are not among the training split's" in message


@pytest.mark.fault(
    "a class whose every training document is dropped by cleaning (empty texts, or copies of "
    "held-out ones)",
    "one line naming the split and the class; never a class no document trained, scored on test",
)
@pytest.mark.parametrize("dropped", ["   ", "a copy of the test document"])
def test_a_class_left_without_training_documents_by_cleaning_is_refused(tmp_path, dropped):
    rows = [(f"sport text {i}", "sport") for i in range(10)] + [
        (f"biz text {i}", "biz") for i in range(10)
    ]
    _write_csv(tmp_path / "corpus" / "train.csv", [*rows, (dropped, "tech")])
    held_out = [
        ("sport text x", "sport"),
        ("biz text y", "biz"),
        ("a copy of the test document", "tech"),
    ]
    _write_csv(tmp_path / "corpus" / "test.csv", held_out)
    message = one_line_error(source=str(tmp_path / "corpus"), val_fraction=0.2)
    assert message.startswith(f"{tmp_path / 'corpus'} (test): class(es) ['tech'] have no training")
    # With training documents of the class left, the corpus is read.
    _write_csv(
        tmp_path / "corpus" / "train.csv",
        [*rows, (dropped, "tech"), *[(f"tech {i}", "tech") for i in range(2)]],
    )
    data = DocDataModule(
        source=str(tmp_path / "corpus"), val_fraction=0.2, tokenizer=SMALL_TOKENIZER
    )
    data.prepare()
    assert data.label_names == ["biz", "sport", "tech"]


def _write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


@pytest.mark.fault(
    "table row with a blank label",
    "one line naming the split, the count and the first id; never a class named None",
)
def test_a_blank_label_is_refused(tmp_path):
    message = one_line_error(source=labelled_csv(tmp_path, ["0", "1"] * 10 + [""]))
    assert "1 document(s) have no label (first: id '21')" in message


@pytest.mark.fault(
    "table without the configured text / label column",
    "one line naming the columns it has",
)
def test_missing_column(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"body": "x", "label": 1}) + "\n")
    message = one_line_error(source=str(path))
    assert "column(s) ['text'] not found" in message and "text_column" in message


def test_unknown_hub_dataset_offline():
    message = one_line_error(source="no-such-org/no-such-dataset-xyz")
    assert "could not be loaded" in message


def test_label_unseen_in_training(tmp_path):
    root = tmp_path / "hub"
    (root / "data").mkdir(parents=True)
    datasets.Dataset.from_dict({"text": ["a b", "c d"] * 10, "label": ["x", "y"] * 10}).to_parquet(
        str(root / "data" / "train-0.parquet")
    )
    datasets.Dataset.from_dict({"text": ["e f", "g h"], "label": ["x", "z"]}).to_parquet(
        str(root / "data" / "test-0.parquet")
    )
    message = one_line_error(source=str(root), val_fraction=0.2)
    assert "label(s) ['z']" in message


def _class_label_parquet(path, texts, labels, names):
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict({"text": texts, "label": labels}, features=features).to_parquet(
        str(path)
    )


@pytest.mark.fault(
    "hub-style split whose ClassLabel is -1 (unlabelled)",
    "one line naming the split and the value; never read as the last class",
)
def test_an_unlabelled_class_label_is_refused_not_read_as_the_last_class(tmp_path):
    root = tmp_path / "hub"
    rows, names = topical_rows(20), AG_NEWS_CLASSES
    _class_label_parquet(root / "data" / "train-0.parquet", rows["text"], rows["label"], names)
    _class_label_parquet(root / "data" / "test-0.parquet", ["e f", "g h"], [-1, -1], names)
    message = one_line_error(source=str(root), val_fraction=0.2)
    assert "(test): label value(s) [-1]" in message and "data.test_split null" in message
    # Explaining documents needs no label: the unlabelled rows keep none.
    loaded = load_source(SourceSpec(str(root), labels_required=False))
    assert loaded.splits["test"]["label"] == [None, None]
    # A column of names still, not of nulls: it lines up with the labelled splits' column.
    assert loaded.splits["test"].features["label"] == datasets.Value("string")
    assert loaded.splits["train"]["label"] == [names[label] for label in rows["label"]]
    # Outside the test split, the test-split fixes would mislead.
    _class_label_parquet(root / "data" / "train-0.parquet", ["a b"] * 4, [0, -1, 1, 2], names)
    message = one_line_error(source=str(root), val_fraction=0.2)
    assert "(train): label value(s) [-1]" in message and "test_split" not in message
    # Unlabelled rows are allowed when explaining; only the value naming no class is shown.
    # (datasets refuses to write 7 under four names, so its feature metadata is copied over.)
    test_file = root / "data" / "test-0.parquet"
    metadata = pq.read_schema(test_file).metadata
    table = pa.table({"text": ["e f", "g h"], "label": pa.array([-1, 7], pa.int64())})
    pq.write_table(table.replace_schema_metadata(metadata), test_file)
    with pytest.raises(DataError, match=r"\(test\): label value\(s\) \[7\] name no class"):
        load_source(SourceSpec(str(root), labels_required=False))


@pytest.mark.fault(
    "a dataset folder whose Parquet files name their ClassLabel classes in another order",
    "one line naming the folder, both files and both name lists; never one file's labels read "
    "as the other's classes",
)
def test_parquet_files_that_name_their_classes_differently_are_refused(tmp_path):
    root = tmp_path / "hub"
    rows = topical_rows(20)
    names = list(AG_NEWS_CLASSES)
    _class_label_parquet(root / "data" / "train-0.parquet", rows["text"], rows["label"], names)
    _class_label_parquet(root / "data" / "test-0.parquet", ["e f", "g h"], [0, 1], names[::-1])
    message = one_line_error(source=str(root), val_fraction=0.2)
    assert message.startswith(
        f"{root}: data/train-0.parquet names its label classes differently from "
        f"data/test-0.parquet (class 0: {names[0]!r} against {names[-1]!r}; 4 and 4 classes)"
    )
    # The same names in the same order are read, their labels as those names.
    _class_label_parquet(root / "data" / "test-0.parquet", ["e f", "g h"], [0, 1], names)
    assert load_source(SourceSpec(str(root))).splits["test"]["label"] == names[:2]
    # A README declaring other names would have datasets read both files by them.
    declared = "\n".join(f"          '{i}': {name}" for i, name in enumerate(names[::-1]))
    (root / "README.md").write_text(
        "---\ndataset_info:\n  features:\n  - name: text\n    dtype: string\n  - name: label\n"
        f"    dtype:\n      class_label:\n        names:\n{declared}\n---\n"
    )
    message = one_line_error(source=str(root), val_fraction=0.2)
    assert "names its label classes differently from README.md" in message


@pytest.mark.fault(
    "a dataset folder of Arrow files (save_to_disk's) that name their ClassLabel classes in "
    "another order",
    "one line naming both files and both name lists, as for Parquet; never one file's labels "
    "read as the other's classes",
)
def test_arrow_files_that_name_their_classes_differently_are_refused(tmp_path):
    root = tmp_path / "arrow"
    root.mkdir()
    names = ["sport", "biz"]
    for split, texts, order in (
        ("train", topical_rows(20)["text"], names),
        ("test", ["e f", "g h"], names[::-1]),
    ):
        features = datasets.Features(
            {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=order)}
        )
        labels = [i % 2 for i in range(len(texts))]
        saved = tmp_path / f"saved-{split}"
        datasets.Dataset.from_dict(
            {"text": texts, "label": labels}, features=features
        ).save_to_disk(str(saved))
        (root / f"{split}.arrow").write_bytes(next(saved.glob("*.arrow")).read_bytes())
    message = one_line_error(source=str(root), val_fraction=0.2)
    assert message.startswith(f"{root}: train.arrow names its label classes differently from")
    assert "(class 0: 'sport' against 'biz'; 2 and 2 classes)" in message


def test_a_dataset_folder_named_by_a_relative_path_is_read(tmp_path, monkeypatch):
    rows = topical_rows(20)
    for split in ("train", "test"):
        path = tmp_path / "hub" / "data" / f"{split}-0.parquet"
        _class_label_parquet(path, rows["text"], rows["label"], AG_NEWS_CLASSES)
    monkeypatch.chdir(tmp_path)
    loaded = load_source(SourceSpec("hub"))
    assert loaded.splits["test"]["label"] == [AG_NEWS_CLASSES[i] for i in rows["label"]]


def test_only_the_chosen_configurations_class_names_must_agree(tmp_path):
    # One folder, two configurations with their own classes: each is read on its own.
    root = tmp_path / "hub"
    rows = topical_rows(20)
    for config, names in (("coarse", ["a", "b"]), ("fine", ["x", "y", "z", "w"])):
        labels = [label % len(names) for label in rows["label"]]
        for split in ("train", "test"):
            _class_label_parquet(root / config / f"{split}-0.parquet", rows["text"], labels, names)
    configs = "".join(
        f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n"
        f"  - split: test\n    path: {c}/test-*\n"
        for c in ("coarse", "fine")
    )
    (root / "README.md").write_text(f"---\nconfigs:\n{configs}---\n")
    loaded = load_source(SourceSpec(str(root), hub_config="coarse"))
    assert set(loaded.splits["train"]["label"]) == {"a", "b"}


@pytest.mark.fault(
    "a source whose ids repeat (ids restarting in every split, or twice in one split)",
    "ids made unique (`test/0`, `7#2`, with a warning), so a reused split.json names one "
    "document each; never a test document trained on",
)
def test_repeated_ids_are_made_unique_and_a_reused_split_keeps_its_documents(tmp_path, caplog):
    root = tmp_path / "hub"
    (root / "data").mkdir(parents=True)
    rows = topical_rows(40)
    for split, part in (("train", slice(0, 30)), ("test", slice(30, 40))):
        texts = rows["text"][part]
        ids = [str(i) for i in range(len(texts))]
        ids[-1] = ids[0]  # one id twice inside a split too
        datasets.Dataset.from_dict(
            {"id": ids, "text": texts, "label": rows["label"][part]}
        ).to_parquet(str(root / "data" / f"{split}-0.parquet"))
    with caplog.at_level(logging.INFO, logger="docclass"):
        first = DocDataModule(source=str(root), tokenizer=SMALL_TOKENIZER, val_fraction=0.2)
        first.write_split(tmp_path / "split.json")
    assert "each id is prefixed with its split's name ('train/0')" in caplog.text
    assert (
        "1 rows repeat an earlier row's id, and are renamed with #2, #3... (the first, a "
        "repeat of '0', is now '0#2')" in caplog.text
    )
    test_ids = first.splits["test"]["id"]
    assert test_ids[:2] == ["test/0", "test/1"] and test_ids[-1] == "test/0#2"
    again = DocDataModule(
        source=str(root), tokenizer=SMALL_TOKENIZER, split_file=str(tmp_path / "split.json")
    )
    again.prepare()
    for split in ("train", "val", "test"):
        assert again.splits[split]["text"] == first.splits[split]["text"]
    assert set(again.splits["test"]["text"]) == set(rows["text"][30:40])


@pytest.mark.fault(
    "data.val_split or data.test_split naming the same split as another role",
    "one line naming both settings and the fix; never test scores on training documents",
)
def test_a_split_named_for_two_roles_is_refused(tmp_path):
    path = tmp_path / "docs.csv"
    datasets.Dataset.from_dict(topical_rows(8)).to_csv(str(path), index=False)
    # Test documents would be the training documents.
    message = one_line_error(source=str(path), test_split="train")
    assert message == (
        f"{path}: data.test_split and data.train_split both name split 'train'; name another "
        "split for data.test_split, or set it null to carve one from training"
    )


def test_a_repeated_id_is_renamed_past_the_ids_the_source_already_has(tmp_path):
    path = tmp_path / "docs.csv"
    rows = topical_rows(8)
    ids = ["7", "7", "7#2", "7#3", "a", "b", "c", "d"]  # the renamed 7 must not become 7#2
    datasets.Dataset.from_dict({"id": ids, **rows}).to_csv(str(path), index=False)
    loaded = load_source(SourceSpec(str(path), test_split=None))
    assert loaded.splits["train"]["id"] == ["7", "7#4", "7#2", "7#3", "a", "b", "c", "d"]
    assert loaded.splits["train"]["text"] == rows["text"]


@pytest.mark.fault(
    "table rows of which some have no `id` (a JSON null, an empty CSV cell), or an `id` column "
    "of lists",
    "every row numbered instead, with a warning; never ids `None`, `None#2`… and a split.json "
    "its own fit cannot read back",
)
def test_rows_without_an_id_are_numbered_as_without_the_column(tmp_path, caplog):
    rows = topical_rows(20)
    path = tmp_path / "docs.jsonl"
    lines = [
        {"text": t, "label": str(y), **({} if i % 3 else {"id": f"d{i}"})}
        for i, (t, y) in enumerate(zip(rows["text"], rows["label"], strict=True))
    ]
    numbered = [str(i + 1) for i in range(20)]
    for ids in ([line.get("id") for line in lines], [[i] for i in range(20)]):
        pairs = zip(lines, ids, strict=True)
        path.write_text("".join(json.dumps({**line, "id": i}) + "\n" for line, i in pairs))
        with caplog.at_level("WARNING", logger="docclass"):
            assert load_source(SourceSpec(str(path))).splits["train"]["id"] == numbered
    assert "13 row(s) have no id; documents are numbered" in caplog.text
    assert "holds List" in caplog.text
    table = tmp_path / "docs.csv"
    table.write_text("id,text,label\na,first text,x\n,second text,y\n")
    assert load_source(SourceSpec(str(table))).splits["train"]["id"] == ["1", "2"]


@pytest.mark.fault(
    "a split.json reused on data edited since (a row inserted into a CSV whose ids are row "
    "numbers)",
    "one line naming split.json, how many documents changed and the first id; never a split "
    "shifted by one row",
)
def test_a_split_file_reused_on_edited_data_is_refused(tmp_path):
    rows = topical_rows(40)
    path, split_file = tmp_path / "docs.csv", tmp_path / "split.json"
    datasets.Dataset.from_dict(rows).to_csv(str(path), index=False)  # ids are row numbers
    first = DocDataModule(source=str(path), tokenizer=SMALL_TOKENIZER, val_fraction=0.2)
    first.write_split(split_file)
    again = DocDataModule(source=str(path), tokenizer=SMALL_TOKENIZER, split_file=str(split_file))
    again.prepare()
    assert again.splits["test"]["text"] == first.splits["test"]["text"]
    # Ids written by hand as numbers name the same rows (ids are read as text).
    written = json.loads(split_file.read_text())
    by_hand = tmp_path / "by-hand.json"
    by_hand.write_text(json.dumps({k: [int(i) for i in written[k]] for k in SPLIT_NAMES}))
    numbered = DocDataModule(source=str(path), tokenizer=SMALL_TOKENIZER, split_file=str(by_hand))
    numbered.prepare()
    assert numbered.splits["test"]["text"] == first.splits["test"]["text"]
    # A re-save that changed only spacing and line endings keeps the same documents.
    respaced = {**rows, "text": [f"  {text.replace(' ', '  ')}\r\n" for text in rows["text"]]}
    datasets.Dataset.from_dict(respaced).to_csv(str(path), index=False)
    DocDataModule(source=str(path), tokenizer=SMALL_TOKENIZER, split_file=str(split_file)).prepare()
    # One row inserted at the top: every id now names the row that was before it.
    edited = {"text": ["new text", *rows["text"]], "label": [0, *rows["label"]]}
    datasets.Dataset.from_dict(edited).to_csv(str(path), index=False)
    message = one_line_error(source=str(path), split_file=str(split_file))
    assert message.startswith(f"{split_file}: 40 of the documents it names have other texts")
    # A split.json written without the hashes (by hand, or before them) is read as before.
    names = json.loads(split_file.read_text())
    split_file.write_text(json.dumps({s: names[s] for s in ("train", "val", "test")}))
    unchecked = DocDataModule(
        source=str(path), tokenizer=SMALL_TOKENIZER, split_file=str(split_file)
    )
    unchecked.prepare()
    assert unchecked.splits["test"]["id"] == first.splits["test"]["id"]


def test_a_split_file_whose_splits_overlap_is_refused(bbc, tmp_path):
    bbc.write_split(tmp_path / "split.json")
    split = json.loads((tmp_path / "split.json").read_text())
    split["train"].append(split["test"][0])
    (tmp_path / "split.json").write_text(json.dumps(split))
    message = one_line_error(source="bbc", split_file=str(tmp_path / "split.json"))
    assert f"id {split['test'][0]!r} is named twice" in message


def test_empty_dataset(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("text,label\n   ,a\n,b\n")
    message = one_line_error(source=str(path))
    assert "no training documents left" in message


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("latin1.csv", b"text,label\n\xff\xfe caf\xe9,a\nok,b\n", "save it as UTF-8"),
        ("empty.csv", b"", "No columns to parse"),
        ("broken.jsonl", b'{"text": "a", "label": 1}\n{broken\n', "could not be read"),
        # JSON's reader takes the bytes unchecked; a bare UnicodeDecodeError came later.
        (
            "cp1252.jsonl",
            b'{"text": "caf\xe9", "label": "a"}\n',
            "its train split is not valid UTF-8",
        ),
    ],
)
@pytest.mark.fault(
    "empty, malformed or unreadable data files",
    "one line naming the file and the cause",
)
def test_unreadable_files_name_the_cause(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content)
    message = one_line_error(source=str(path))
    assert message.startswith(f"{path}: could not be read") and expected in message


def test_unsupported_file_type(tmp_path):
    path = tmp_path / "docs.xlsx"
    path.write_bytes(b"PK")
    message = one_line_error(source=str(path))
    assert "unsupported file type '.xlsx'" in message


def test_bad_fractions_refused():
    with pytest.raises(DataError, match="data.test_fraction must be between 0 and 0.5"):
        DocDataModule(test_fraction=0.7)


@pytest.mark.parametrize(
    ("setting", "value"),
    [("batch_size", 0), ("eval_batch_size", 0), ("num_workers", -1), ("pad_to_multiple", 0)],
)
def test_impossible_batch_settings_are_one_line_before_any_data_is_read(setting, value):
    # batch_size 0 was the DataLoader's traceback, after the data had been read.
    with pytest.raises(DataError, match=f"data.{setting} must be"):
        DocDataModule(source="no-such-corpus.csv", **{setting: value})


@pytest.mark.parametrize(
    "content", ['["a", "b"]', '{"train": 5, "val": [], "test": []}', '{"train": [{"id": 1}]}']
)
def test_a_split_file_that_is_not_a_split_is_one_line(tmp_path, content):
    rows = topical_rows(20)
    path, split_file = tmp_path / "docs.csv", tmp_path / "split.json"
    datasets.Dataset.from_dict(rows).to_csv(str(path), index=False)
    split_file.write_text(content)
    module = DocDataModule(source=str(path), tokenizer=SMALL_TOKENIZER, split_file=str(split_file))
    with pytest.raises(DataError, match="split.json: not a split.json"):
        module.prepare()


def test_epoch_shuffle_sampler_replays_random_sampler_from_any_epoch():
    """A resumed run must see the orders an uninterrupted one sees, epoch for epoch."""
    from torch.utils.data import RandomSampler

    from docclass.data.samplers import EpochShuffleSampler

    uninterrupted = RandomSampler(range(37), generator=torch.Generator().manual_seed(5))
    orders = [list(uninterrupted) for _ in range(4)]
    assert orders[0] != orders[1]
    for epoch, order in enumerate(orders):
        resumed = EpochShuffleSampler(37, seed=5)  # a fresh process, as after a restart
        resumed.set_epoch(epoch)
        assert list(resumed) == order


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_single_file_names_rows_by_its_id_column_else_by_row_number(tmp_path, suffix):
    """Ids a user can find in the file: their own, else the row's number (first row: 1)."""
    rows = [{"text": "first text", "label": "a"}, {"text": "second text", "label": "b"}]
    plain, with_ids = tmp_path / f"plain{suffix}", tmp_path / f"ids{suffix}"
    if suffix == ".jsonl":
        plain.write_text("".join(json.dumps(row) + "\n" for row in rows))
        with_ids.write_text(
            "".join(json.dumps({"id": f"doc-{i}", **row}) + "\n" for i, row in enumerate(rows))
        )
    else:
        plain.write_text("text,label\nfirst text,a\nsecond text,b\n")
        with_ids.write_text("id,text,label\n17,first text,a\nx9,second text,b\n")
    assert load_source(SourceSpec(str(plain))).splits["train"]["id"] == ["1", "2"]
    expected = ["doc-0", "doc-1"] if suffix == ".jsonl" else ["17", "x9"]
    assert load_source(SourceSpec(str(with_ids))).splits["train"]["id"] == expected


def test_the_embedded_name_is_never_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bbc").mkdir()  # a folder of that name: "bbc" still reads the embedded corpus
    (tmp_path / "docs.csv").write_text("text,label\nx,y\n")
    assert local_source_path("bbc") is None
    assert local_source_path("docs.csv") == tmp_path / "docs.csv"
    assert local_source_path("ag_news") is None  # a hub name


@pytest.mark.fault(
    "a checkpoint written inside an epoch by P processes, resumed with another number",
    "one line naming both numbers and the fix: the batches done are the ranks' turns, which "
    "name other batches for another P (an epoch-end checkpoint resumes on any number)",
)
def test_a_mid_epoch_position_resumes_only_with_the_processes_that_wrote_it():
    from types import SimpleNamespace

    from docclass.errors import ConfigError

    datamodule = DocDataModule(source="bbc", tokenizer=SMALL_TOKENIZER)
    for batches_done, world_size, refused in ((3, 2, True), (3, 1, False), (0, 2, False)):
        datamodule.trainer = SimpleNamespace(world_size=1, ckpt_path="last.ckpt")
        saved = {"epoch": 1, "batches_done": batches_done, "batches_trained": 20}
        datamodule.load_state_dict({**saved, "world_size": world_size})
        if refused:
            with pytest.raises(ConfigError, match="on each of 2 processes; resume it with 2"):
                datamodule._take_resume_at()
        else:
            assert datamodule._take_resume_at() == (1, batches_done)


@pytest.mark.fault(
    "a class folder's .txt file that is binary (NUL bytes, or not UTF-16/32 after its mark)",
    "skipped with a warning naming the first and counted in `metrics.json` "
    "(`binary_files_skipped`), as `classify` refuses it; its bytes are never trained on as words",
)
def test_a_binary_file_in_a_class_folder_is_skipped_not_read_as_words(tmp_path, caplog):
    from docclass.data.sources import read_class_folders

    for name, text in (("sport", "The striker scored."), ("tech", "A new chip.")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text(text)
    (tmp_path / "tech" / "b.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00binary")
    (tmp_path / "tech" / "c.txt").write_bytes(b"\xff\xfe" + b"\x00" * 40)
    (tmp_path / "tech" / "d.txt").write_bytes("Chelsea pay £5m".encode("utf-16"))  # text
    with caplog.at_level("WARNING"):
        loaded = read_class_folders(tmp_path)
    assert sorted(loaded.splits["train"]["id"]) == ["sport/a.txt", "tech/a.txt", "tech/d.txt"]
    assert loaded.stats["binary_files_skipped"] == 2
    assert "2 .txt file(s)" in caplog.text and "tech/b.txt" in caplog.text
    # A folder of binary files only is no class: no output the model could never train.
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "x.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert read_class_folders(tmp_path).label_names == ["sport", "tech"]


def test_a_source_and_a_stream_named_from_the_home_folder_are_found(tmp_path, monkeypatch):
    # A config or the Python API hands over the ~ no shell expanded: "no such file" though the
    # file was there.
    monkeypatch.setenv("HOME", str(tmp_path))
    labelled_csv(tmp_path, ["sport", "tech"] * 10)
    loaded = load_source(SourceSpec(source="~/d.csv"))
    assert sum(len(split) for split in loaded.splits.values()) == 20
    rows = list(open_stream("~/d.csv"))
    assert len(rows) == 20 and rows[0]["text"] == "doc 0 words"


def test_a_preparation_that_fails_after_splitting_fails_alike_the_next_time(tmp_path):
    data = DocDataModule(
        source="bbc", tokenizer=SMALL_TOKENIZER, stream=str(tmp_path / "none" / "*.jsonl")
    )
    for _ in range(2):  # the second ask once ended in AttributeError on a missing tokenizer
        with pytest.raises(DataError, match="matches no files"):
            _ = data.vocab_size


def test_a_source_file_whose_name_holds_glob_characters_is_that_file(tmp_path):
    for name, word in (("corpus[2].csv", "named"), ("corpus2.csv", "matched")):
        rows = topical_rows(20)
        rows["text"] = [f"{word} {text}" for text in rows["text"]]
        datasets.Dataset.from_dict(rows).to_csv(str(tmp_path / name), index=False)
    texts = load_source(SourceSpec(str(tmp_path / "corpus[2].csv"))).splits["train"]["text"]
    assert texts and all(text.startswith("named ") for text in texts)


@pytest.mark.fault(
    "`data.bucket_documents`, `shuffle_buffer` or `tokenizer_documents` 0, "
    "`max_docs_per_class` 0, a negative `split_seed`",
    "one line naming the setting, before any data is read; never a whole stream in one buffer, "
    "or no cap in silence",
)
@pytest.mark.parametrize(
    ("setting", "value"),
    [("bucket_documents", 0), ("shuffle_buffer", 0), ("tokenizer_documents", 0),
     ("max_docs_per_class", 0), ("split_seed", -1)],
)  # fmt: skip
def test_impossible_data_sizes_are_refused_before_reading(setting, value):
    with pytest.raises(DataError, match=f"data.{setting} must be .*, got {value}"):
        DocDataModule(source="nowhere.csv", **{setting: value})


def test_class_folders_named_by_integers_are_ordered_as_numbers(tmp_path):
    for name in ("1", "2", "10"):
        (tmp_path / name).mkdir()
        for i in range(2):
            (tmp_path / name / f"{i}.txt").write_text(f"document {i} of class {name}")
    assert load_source(SourceSpec(str(tmp_path))).label_names == ["1", "2", "10"]


@pytest.mark.fault(
    "a dataset folder whose test.csv has no label column, or an extra one (Kaggle's layout)",
    "one line saying the files' columns differ and what to do; never datasets' bare CastError",
)
@pytest.mark.parametrize(
    ("test_columns", "said"),
    [(["text"], " (test): 2 document(s) have no label"),
     (["id", "text", "label"], ": its files do not all have the same columns")],
)  # fmt: skip
def test_split_files_with_other_columns_are_named_as_such(tmp_path, test_columns, said):
    rows = topical_rows(20)
    datasets.Dataset.from_dict(rows).to_csv(str(tmp_path / "train.csv"), index=False)
    test = {"id": ["a", "b"], "text": ["e f", "g h"], "label": [0, 1]}
    test = {column: test[column] for column in test_columns}
    datasets.Dataset.from_dict(test).to_csv(str(tmp_path / "test.csv"), index=False)
    assert one_line_error(source=str(tmp_path)).startswith(f"{tmp_path}{said}")


@pytest.mark.fault(
    "a folder laid out as aclImdb is: `train/<class>/*.txt` and `test/<class>/*.txt` (with "
    "`.txt` files beside the classes, and a `train/unsup/` of unlabelled documents)",
    "each split folder's class folders read as that split, ids prefixed with its name; a "
    "training class folder with no test counterpart refused in one line; never `train` and "
    "`test` read as two classes, `unsup` trained as one, nor each line of a file as a document",
)
def test_split_folders_of_class_folders_are_read_as_their_splits(tmp_path):
    root = tmp_path / "aclImdb"
    for split, classes in (("train", ("neg", "pos", "unsup")), ("test", ("neg", "pos"))):
        for name in classes:
            (root / split / name).mkdir(parents=True)
            for i in range(3):
                (root / split / name / f"{i}_7.txt").write_text(f"{name} {split} {i}\nline two")
        (root / split / "urls_pos.txt").write_text("http://a\nhttp://b\n")
    (root / "imdbEr.txt").write_text("0.1\n")
    with pytest.raises(DataError, match=r"class folder\(s\) \['unsup'\] of train/ have no test/"):
        load_source(SourceSpec(str(root)))
    shutil.rmtree(root / "train" / "unsup")
    loaded = load_source(SourceSpec(str(root)))
    assert loaded.label_names == ["neg", "pos"]
    assert {role: len(split) for role, split in loaded.splits.items()} == {"train": 6, "test": 6}
    test = loaded.splits["test"]
    assert test["id"][0] == "test/neg/0_7.txt" and test["text"][0] == "neg test 0\nline two"
    assert test["label"] == ["neg"] * 3 + ["pos"] * 3
    data = DocDataModule(source=str(root), tokenizer=SMALL_TOKENIZER, val_fraction=0.34)
    data.prepare()
    assert sorted(data.splits["test"]["id"]) == sorted(test["id"])


def test_a_class_folder_named_in_other_bytes_stays_a_class_beside_a_binary_file(tmp_path):
    # Its label is its printable name (caf\xe9): compared by that, it is no class "emptied"
    # by another folder's binary file.
    named = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(named)
    for i in range(2):
        with open(os.path.join(named, f"{i}.txt".encode()), "w") as file:
            file.write(f"a cafe story {i}")
    (tmp_path / "sport").mkdir()
    for i in range(2):
        (tmp_path / "sport" / f"{i}.txt").write_text(f"a match report {i}")
    (tmp_path / "sport" / "image.txt").write_bytes(b"\x89PNG\x00\x00\x00")
    loaded = load_source(SourceSpec(str(tmp_path)))
    assert loaded.label_names == ["caf\\xe9", "sport"]
    assert sorted(set(loaded.splits["train"]["label"])) == ["caf\\xe9", "sport"]
