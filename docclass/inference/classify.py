"""``docclass classify``: every input document gets exactly one output row, in input order.

Inputs are files, folders (recursively), globs, ``-`` (standard input, one document per line)
and tables (CSV / JSONL / Parquet, one document per row). They are read lazily and classified
in chunks, so memory stays flat however many documents come in; within a chunk, documents of
similar length share a batch.

What each bad input gets (the run goes on; ``--strict`` makes the exit status 1):

=============================  =================================================================
input                          row
=============================  =================================================================
empty / whitespace-only        ``error``: empty document
not valid UTF-8                classified as Windows-1252 (a Latin-1 "£"), with a ``warning``;
                               bytes no encoding reads (a table's, a damaged UTF-16 unit)
                               become U+FFFD, with a ``warning``
pipe, socket or device         ``error`` inside a folder or matched by a pattern (read when
                               named on its own)
damaged Parquet row group      one ``error`` row naming its rows (``c.parquet:11-20``)
binary (NUL bytes)             ``error``: binary file
unreadable file                ``error``: the operating system's reason
missing path / empty glob      ``error``: no such file
longer than the model reads    classified on its first ``max_tokens`` tokens, ``truncated: true``
table row without its text     ``error`` naming the column and the columns present
text or id column named twice  ``error`` naming it (a row read as a dict kept the last one)
CSV row the strict parser      ``error`` naming the line it starts on; the lines it swallowed
cannot read                    are read again one by one, as rows
CSV row with another field     ``error`` naming its line and both counts (an unquoted comma would
count than the header          cut the text and shift the id)
=============================  =================================================================

The output file is written under a hidden name beside it and renamed when every row is in, so
a killed run never leaves a file that looks finished; ``--out`` that is one of the inputs, or
lies inside an input folder, is refused before anything is read.
"""

from __future__ import annotations

import codecs
import collections
import csv
import fnmatch
import glob
import io
import json
import math
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from docclass.data.sources import (
    UTF16_MARKS,
    UTF32_MARKS,
    binary_reason,
    decode_text,
    printable_name,
)
from docclass.errors import ConfigError, one_line
from docclass.files import spreadsheet_safe
from docclass.inference.classifier import LONE_SURROGATE, DocClassifier
from docclass.interpret.records import EMPTY_DOCUMENT

JSONL_SUFFIXES = {".jsonl", ".ndjson"}
TABLE_SUFFIXES = {".csv", ".parquet", *JSONL_SUFFIXES}
# Tables in formats classify does not read. Taken for one text document each, a JSON array of
# 50 records came back as one labelled row and the other 49 documents had no row at all.
UNREAD_TABLE_SUFFIXES = {".json", ".tsv"}
NOT_UTF8 = (
    "not valid UTF-8: read by its UTF-16/32 mark, or as Windows-1252 (or UTF-8 with stray "
    "Windows-1252 quotes), as training reads class-folder files; save it as UTF-8"
)
CHUNK_DOCUMENTS = 1024
# A table column that names its rows; output rows carry it as their id.
ID_COLUMN = "id"


@dataclass
class InputDocument:
    """One document as read: text to classify, or the reason there is none."""

    id: str
    text: str | None = None
    error: str | None = None
    warning: str | None = None

    def __post_init__(self) -> None:
        # A file name that is not UTF-8 reaches Python as lone surrogates, which no writer can
        # encode: one such name ended the whole run. Its bad bytes are spelt out (caf\xe9.txt),
        # so two such names stay two ids.
        self.id = printable_name(self.id)


def decode_document(raw: bytes) -> tuple[str | None, str | None, str | None]:
    """``(text, error, warning)`` for a file's bytes, decoded as training decodes a class
    folder's files: a model trained on Windows-1252 files then reads the same words here."""
    reason = binary_reason(raw)
    if reason:
        return None, f"{reason}: not a text document", None
    text, was_legacy = decode_text(raw)
    warning = NOT_UTF8 if was_legacy else None
    return text, None, warning


def _read_file(path: Path) -> InputDocument:
    try:
        raw = path.read_bytes()
    except OSError as error:
        return InputDocument(str(path), error=f"cannot read: {error.strerror or error}")
    text, error, warning = decode_document(raw)
    return InputDocument(str(path), text, error, warning)


def _table_rows(path: Path, text_column: str) -> Iterator[InputDocument]:
    """One document per row, streamed: CSV and JSONL line by line, Parquet batch by batch."""
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        yield from jsonl_rows(path, text_column)
    elif suffix == ".parquet":
        yield from parquet_rows(path, text_column)
    else:
        yield from csv_rows(path, text_column)


def _unreadable(path: Path, error: Exception) -> InputDocument:
    if isinstance(error, OSError):
        return InputDocument(str(path), error=f"cannot read: {error.strerror or error}")
    # A corrupt Parquet or CSV file: say so in its row, go on.
    return InputDocument(str(path), error=f"cannot read as a table: {error}")


# The csv module's default field limit (131,072 characters) is shorter than a long document, and
# a row past it would be lost; the C reader's own limit is a C long.
CSV_FIELD_LIMIT = 2**31 - 1
ROW_BAD_BYTES = "not valid UTF-8; undecodable bytes replaced with U+FFFD"
NOT_A_FILE = "not a regular file (a pipe, socket or device); name it on its own to read it"
LONE_SURROGATES = "holds lone surrogate escapes (not text); each replaced with U+FFFD"


def csv_rows(path: Path, text_column: str) -> Iterator[InputDocument]:
    """A CSV file's rows, numbered from 1 after the header. Read whole: a quoted field may hold
    a newline, so a CSV file cannot be cut at a byte offset. A byte-order mark (as spreadsheets
    write) is not part of the first column's name.

    Nothing is read silently wrong (:class:`_CsvRows`). A row the strict parser cannot read (a
    stray quote, or one that never closes, which the lenient parser let swallow the rows after
    it) gets an error row naming the line it starts on. A row with more or fewer fields than
    the header (an unquoted comma cut its text and shifted its id) gets one too, once empty
    fields past the header's are dropped. A blank line is no row, except inside a one-column
    file, where it is an empty cell (an empty document)."""
    try:
        csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
        # Bad bytes are kept as lone surrogates, so each row knows whether it had any.
        with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as handle:
            yield from _csv_records(path, iter(handle), text_column)
    except Exception as error:
        yield _unreadable(path, error)


def _csv_records(path: Path, lines: Iterator[str], text_column: str) -> Iterator[InputDocument]:
    records = _CsvRows(lines)
    header, error, _ = records.next_row()
    if error is not None:  # no row can be read against a header that cannot be
        raise csv.Error(f"its header (line 1) cannot be read: {error}")
    columns = [_valid_utf8(name)[0] for name in header or []]
    refuse_repeated_columns(columns, text_column)
    # A header's trailing comma names no column. A row filling it is an error, as any row with
    # more fields is: the field may be the rest of a text cut at an unquoted comma.
    named = len(columns)
    while named > 1 and columns[named - 1] == "":
        named -= 1
    number, blanks = 0, 0
    while True:
        fields, error, first = records.next_row()
        if fields is None and error is None:
            return  # blank lines at the end are no rows, whatever the columns
        if fields == []:
            # A blank line: no row (pandas skips it too), except in a one-column file, where it
            # is an empty cell, the next row's neighbour.
            blanks += named == 1
            continue
        for _ in range(blanks):
            number += 1
            yield _checked_row(path, number, {columns[0]: ""}, text_column, columns)
        number, blanks = number + 1, 0
        if error is not None:
            yield InputDocument(
                f"{path}:{number}",
                error=f"cannot read the row that starts on line {first}: {error}; the lines "
                "after it are read again one by one (close or double the quote)",
            )
            continue
        while len(fields) > named and fields[-1] == "":
            fields.pop()  # empty fields past the named columns (a trailing comma) cut nothing
        if len(fields) != named:
            records.read_again_inside(first)
            yield InputDocument(
                f"{path}:{number}",
                error=f"the row that starts on line {first} has {len(fields)} fields where the "
                f"header has {named} (an unquoted comma or quote in the text?); quote the field",
            )
            continue
        row = dict(zip(columns, fields, strict=False))
        yield _checked_row(path, number, row, text_column, columns)


class _CsvRows:
    """A CSV file's rows, parsed strictly, each with the line it starts on.

    A row that cannot be read (a stray quote, or one that never closes, which a lenient
    parser lets swallow the lines after it), or that spans lines with the wrong field count,
    gives its lines back but the first: they are read again, each line on its own, since a
    quote that went wrong there cannot be trusted to pair. Each line is then parsed at most
    twice, however many rows go wrong (a quote left open on every line does not make the
    reading quadratic). Lines are counted as the csv module splits them.
    """

    def __init__(self, lines: Iterator[str]) -> None:
        self.lines, self.pending = lines, collections.deque()
        self.consumed: list[str] = []  # the lines of the row being read
        self.line = 0  # lines read into rows so far
        self.alone_until = 0  # lines up to this one are read one by one

    def next_row(self) -> tuple[list[str] | None, str | None, int]:
        """``(fields, error, first line)``; fields and error None at the end."""
        self.consumed.clear()
        first = self.line + 1
        if first <= self.alone_until:
            self.consumed.append(self.pending.popleft())
            source: Iterator[str] = iter(self.consumed[:])
        else:
            source = self._source()
        try:
            fields = next(csv.reader(source, strict=True), None)
        except csv.Error as error:
            self.read_again_inside(first)
            return None, str(error), first
        self.line += len(self.consumed)
        return fields, None, first

    def read_again_inside(self, first: int) -> None:
        """Give back the last row (which starts on line ``first``) but its first line: the
        lines after it are read again, one by one."""
        inside = self.consumed[1:]
        self.pending.extendleft(reversed(inside))
        self.alone_until = max(self.alone_until, first + len(inside))
        self.line = first

    def _source(self) -> Iterator[str]:
        while True:
            if self.pending:
                line = self.pending.popleft()
            elif (line := next(self.lines, None)) is None:
                return
            self.consumed.append(line)
            yield line


def _valid_utf8(value: str) -> tuple[str, bool]:
    """``value`` with the bad bytes it was read with (lone surrogates) replaced by U+FFFD, and
    whether there were any."""
    try:
        value.encode("utf-8")
        return value, False
    except UnicodeEncodeError:
        pass
    try:  # bytes a decoder kept as surrogates: each bad byte becomes one U+FFFD
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), True
    except UnicodeEncodeError:  # other lone surrogates (a JSON "\ud800" escape): one U+FFFD each
        return LONE_SURROGATE.sub("\ufffd", value), True


def _checked_row(
    path: Path, number: int, row: dict, text_column: str, columns: list[str]
) -> InputDocument:
    """A CSV row as a document, its bad bytes replaced and said in its ``warning`` (the
    header's are replaced too, but are not the row's)."""
    clean, bad = {}, False
    for name, value in row.items():
        if isinstance(name, str):
            name = _valid_utf8(name)[0]
        if isinstance(value, str):
            value, bad_value = _valid_utf8(value)
            bad |= bad_value
        clean[name] = value
    document = _row_document(path, number, clean, text_column, columns)
    document.warning = ROW_BAD_BYTES if bad else None
    return document


def jsonl_rows(
    path: Path, text_column: str, start: int = 0, end: int | None = None, first_line: int = 1
) -> Iterator[InputDocument]:
    """The JSON Lines rows that begin in bytes ``[start, end)``, numbered by their line in the
    whole file (``first_line`` is the number of the first line beginning at or after
    ``start``). Lines end at ``\\n`` only, so a part read alone numbers its lines exactly as
    the whole file read at once does."""
    try:
        with open(path, "rb") as handle:
            if start:
                handle.seek(start - 1)
                if handle.read(1) != b"\n":
                    handle.readline()  # the line under way at ``start`` belongs to the part before
            number = first_line
            while end is None or handle.tell() < end:
                at_start = handle.tell() == 0
                raw = handle.readline()
                if not raw:
                    break
                if at_start and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8) :]  # a byte-order mark, not part of the row
                try:
                    line, warning = raw.decode("utf-8"), None
                except UnicodeDecodeError:
                    line, warning = raw.decode("utf-8", errors="replace"), ROW_BAD_BYTES
                if line.strip():
                    document = _json_row(path, number, line, text_column)
                    document.warning = warning or document.warning
                    yield document
                number += 1
    except Exception as error:
        yield _unreadable(path, error)


def _json_row(path: Path, number: int, line: str, text_column: str) -> InputDocument:
    repeated: list[str] = []

    def keep_repeated(pairs: list[tuple[str, Any]]) -> dict:
        # Objects are built inside out, so the row's own object is the last one here.
        repeated[:] = [key for key, n in collections.Counter(k for k, _ in pairs).items() if n > 1]
        return dict(pairs)

    try:
        row = json.loads(line, object_pairs_hook=keep_repeated)
    except json.JSONDecodeError as error:
        return InputDocument(f"{path}:{number}", error=f"not JSON: {error.msg}")
    if not isinstance(row, dict):
        return InputDocument(f"{path}:{number}", error="not a JSON object")
    for key in (text_column, ID_COLUMN):
        if key in repeated:  # json.loads kept the last, silently
            return InputDocument(
                f"{path}:{number}", error=f"the key {key!r} appears more than once; keep one"
            )
    # A "\ud800" escape is valid JSON but no text: the tokenizer (text) or the writer (id)
    # refused it, and the run with it.
    cleaned = {key: _valid_utf8(row[key]) for key in (text_column, ID_COLUMN)
               if isinstance(row.get(key), str)}  # fmt: skip
    document = _row_document(
        path, number, {**row, **{key: text for key, (text, _) in cleaned.items()}},
        text_column, list(row),
    )  # fmt: skip
    if any(bad for _, bad in cleaned.values()):
        document.warning = LONE_SURROGATES
    return document


def parquet_rows(
    path: Path, text_column: str, row_groups: list[int] | None = None, first_row: int = 1
) -> Iterator[InputDocument]:
    """A Parquet file's rows (or those of ``row_groups``), numbered from ``first_row``.

    Read one row group at a time: a damaged group becomes one error row naming its rows
    (``c.parquet:11-20``), and the other groups' rows are read, as the Ray engine's shards
    (whole row groups) read them. One read of the whole file lost every row after the damage,
    and the two engines gave other rows."""
    try:
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        columns = table.schema_arrow.names
        refuse_repeated_columns(columns, text_column)
        groups = range(table.num_row_groups) if row_groups is None else row_groups
        sizes = [table.metadata.row_group(group).num_rows for group in groups]
    except Exception as error:
        yield _unreadable(path, error)
        return
    number = first_row - 1
    for group, size in zip(groups, sizes, strict=True):
        last = number + size
        try:
            for batch in table.iter_batches(batch_size=1024, row_groups=[group]):
                for row in batch.to_pylist():
                    number += 1
                    yield _row_document(path, number, row, text_column, columns)
        except Exception as error:
            yield InputDocument(
                f"{path}:{number + 1}-{last}",
                error=f"cannot read these rows (row group {group}): {one_line(error)}",
            )
        number = last


def refuse_repeated_columns(columns: list[str], text_column: str) -> None:
    """A table whose header names its text or id column twice is not read: a row read as a
    dict kept the last of them, silently, and which one the writer meant is unknown."""
    for name in (text_column, ID_COLUMN):
        places = [number for number, column in enumerate(columns, 1) if column == name]
        if len(places) > 1:
            raise ValueError(
                f"its header names the column {name!r} {len(places)} times (columns "
                f"{', '.join(map(str, places))}); rename all but the one that holds the {name}"
            )


def _row_document(
    path: Path, number: int, row: dict, text_column: str, columns: Iterable[str] | None
) -> InputDocument:
    # The table's own id when it has one, so output rows join back to the input; else where
    # the row is (the file and its row number, the first row being 1).
    own_id = _id_text(row.get(ID_COLUMN))
    doc_id = own_id if own_id else f"{path}:{number}"
    value = row.get(text_column)
    if value is None:
        return InputDocument(
            doc_id,
            error=f"no {text_column!r} value (columns: {list(columns or [])}); set --text_column",
        )
    if isinstance(value, str):
        return InputDocument(doc_id, text=value)
    if isinstance(value, bytes | bytearray):
        # A Parquet binary column (as Spark and other writers leave text): decoded as a file
        # is, where str() made every row "b'Caf\\xc3\\xa9 …'" and classified that.
        text, error, warning = decode_document(bytes(value))
        return InputDocument(doc_id, text, error, warning)
    # A number, list or object is not a document; str() classified its Python spelling.
    return InputDocument(
        doc_id,
        error=f"the {text_column!r} value is a {type(value).__name__}, not text; write the "
        "document's text as a string",
    )


def _id_text(value: Any) -> str | None:
    """A table's id as the text it is: a Parquet binary id decoded (``str`` spelled it
    ``"b'doc-17'"``), a whole number stored as a float (a pandas integer column with gaps)
    without its ``.0``, so output rows join back to the input's ids."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None  # a missing id in a float column (pandas writes NaN): named by its place
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))  # beyond 2**53 a float holds no whole number exactly
    return _valid_utf8(str(value))[0]  # a JSON "\ud800" id could not be written out


def expand_argument(argument: str) -> Iterator[Path | InputDocument]:
    """The files one argument names, in order, without reading them; an argument that names
    nothing is an error document. Hidden files and folders inside a folder are skipped."""
    path = Path(argument)
    if glob.has_magic(argument) and not os.path.lexists(argument):
        matches = pattern_matches(argument)
        if not matches:
            yield InputDocument(argument, error="no file matches this pattern")
        # A recursive pattern matches a folder and the files in it: each file is named once.
        seen: set[str] = set()
        for match in matches:
            # Each match as the path it is, never as a pattern again ("x*" may be a name).
            for item in _named_files(Path(match), match, matched=True):
                # As spelled: two links to one file stay two; a file, or an error row (a link
                # to nothing), met in a folder and again as a match of its own is one.
                key = str(item.id if isinstance(item, InputDocument) else item)
                if key in seen:
                    continue
                seen.add(key)
                yield item
        return
    yield from _named_files(path, argument)


def pattern_matches(pattern: str) -> list[str]:
    """The paths a glob pattern names, sorted, folders among them: those ``glob.glob(pattern,
    recursive=True)`` names, part by part as it matches them, except that a ``**`` part never
    names or enters a folder it is already inside (a link back up), nor, where at most a name
    follows it, a folder a link has led into already (:func:`_descend`): the same files, under
    the first link's name. Python's glob followed links back up round (one link named every
    file 40 times, two listed paths without end), and every path through folders linking to
    each other."""
    path = Path(pattern)
    if "**" not in path.parts:
        return sorted(glob.glob(pattern))  # no part reaches more than one folder down
    parts = list(path.parts)
    reached = [parts.pop(0)] if path.is_absolute() else [""]
    # As glob reads "docs/**/" and "docs/**/." (a final "." is not among the parts).
    folders_only = pattern.endswith(("/", os.sep, "/.", os.sep + "."))
    for number, part in enumerate(parts):
        folders = number < len(parts) - 1 or folders_only
        step: list[str] = []
        for folder in reached:
            if part == "**":
                # Past this part, at most a name left to match (not ".."): any path to a file
                # is as good as another, so a folder reached again through a link may be left.
                rest = parts[number + 1 :]
                once = len(rest) == 0 or (len(rest) == 1 and rest[0] not in ("**", ".."))
                step += _descend(folder, folders, once)
            elif glob.has_magic(part):
                # A hidden name only where the part spells its dot, as glob reads them.
                named = [
                    os.path.join(folder, name)
                    for name in _names(folder)
                    if (part.startswith(".") or not name.startswith("."))
                    and fnmatch.fnmatchcase(name, part)
                ]
                step += [name for name in named if not folders or os.path.isdir(name)]
            elif os.path.isdir(named := os.path.join(folder, part)) or (
                not folders and os.path.lexists(named)
            ):
                step.append(named)
        reached = step
    return sorted({name for name in reached if name})


def _descend(start: str, folders_only: bool, once: bool) -> list[str]:
    """What a ``**`` part names from folder ``start``: the folder itself and every name under
    it, hidden ones left out, linked folders followed, but never one the walk is inside (its
    real folder or one above it, or a folder it came through). With ``once``, not through a
    second link either into a folder a link has led into already: folders linking to each
    other made every path through them a name (thousands for seven folders), and the files
    are the same under each. The first link is the first listed: folders are listed depth
    first, each folder's names in sorted order, and a link counts when its folder is listed."""
    found = [start]
    real = Path(os.path.realpath(start or "."))
    linked_into: set[tuple[int, int] | None] = set()
    waiting = [(start, {_inode(str(folder)) for folder in (real, *real.parents)})]
    while waiting:
        folder, inside = waiting.pop()
        deeper = []
        for name in _names(folder):
            named = os.path.join(folder, name)
            if name.startswith("."):
                continue
            if not os.path.isdir(named):
                found += [] if folders_only else [named]
                continue
            key = _inode(named)
            linked = once and os.path.islink(named)
            if key is None or key in inside or (linked and key in linked_into):
                continue
            if linked:
                linked_into.add(key)
            found.append(named)
            deeper.append((named, inside | {key}))
        waiting += reversed(deeper)  # the first name is walked first
    return found


def _names(folder: str) -> list[str]:
    """A folder's names, sorted; none when it cannot be listed (glob says nothing of it)."""
    try:
        return sorted(os.listdir(folder or "."))
    except OSError:
        return []


def _named_files(
    path: Path, argument: str, matched: bool = False
) -> Iterator[Path | InputDocument]:
    """The files one path names: a folder's (:func:`_files_under`), the file, or an error.
    A pipe (or socket, device) is read when named on its own, an error row when ``matched``
    by a pattern, as inside a folder."""
    try:
        if path.is_dir():
            yield from _files_under(path)
            return
        if not path.exists():
            missing = "a link to nothing" if path.is_symlink() else "no such file or folder"
            yield InputDocument(argument, error=missing)
            return
        if matched and not path.is_file():
            yield InputDocument(argument, error=NOT_A_FILE)
            return
    except OSError as error:  # inside a folder that may be listed but not looked into
        yield InputDocument(argument, error=f"cannot read: {error.strerror or error}")
        return
    yield path


def _files_under(folder: Path) -> list[Path | InputDocument]:
    """The files under ``folder``, sorted as paths, hidden files and folders left out, with an
    error row for a folder that cannot be listed and for a broken link (they vanished
    silently). Linked folders are followed (:func:`_walk`)."""
    found: list[Path | InputDocument] = []
    unlisted: list[OSError] = []
    for root, names in _walk(folder, unlisted):
        for name in names:
            child = Path(root, name)
            if name.startswith("."):
                continue
            try:
                if child.is_file():
                    found.append(child)
                elif child.is_symlink() and not child.exists():
                    found.append(InputDocument(str(child), error="a link to nothing"))
                elif not child.is_dir():
                    # A pipe found in a folder would block the run on a reader's stdin;
                    # named on its own (a shell's <(…)) it is read.
                    found.append(InputDocument(str(child), error=NOT_A_FILE))
            except OSError:  # a folder readable but not searchable: the read says why
                found.append(child)
    found += [InputDocument(str(e.filename), error=f"cannot list: {e.strerror}") for e in unlisted]
    return sorted(found, key=lambda item: Path(getattr(item, "id", item)))


def _walk(folder: Path, unlisted: list[OSError]) -> Iterator[tuple[str, list[str]]]:
    """``(folder, file names)`` of every folder under ``folder``, hidden ones left out. Linked
    folders are followed, as a ``**`` glob follows them (``rglob`` did not, and their
    documents got no row), but not a link to a folder of the input itself (its files keep
    their real names, however the folders are listed), to the input or to a folder above it
    (out of the input), or to a folder already read."""
    # A link's target is one of the input's own folders when the input holds its real path:
    # no walk of the input's real folders needed to know them.
    inside = {Path(os.path.realpath(folder))}
    above = {*inside, *next(iter(inside)).parents}
    visited = {_inode(str(folder))}
    for root, folders, names in os.walk(folder, followlinks=True, onerror=unlisted.append):
        kept = []
        for name in sorted(folders):
            path = os.path.join(root, name)
            if name.startswith("."):
                continue
            if (key := _inode(path)) is None:  # listed, but not to be looked into
                unlisted.append(PermissionError(13, "Permission denied", path))
                continue
            if key in visited:
                continue
            if os.path.islink(path):
                target = Path(os.path.realpath(path))
                if _held(inside, target) or target in above:
                    continue
            visited.add(key)
            kept.append(name)
        folders[:] = kept
        yield root, names


def _inode(path: str) -> tuple[int, int] | None:
    """What names a folder however it is reached; None when it cannot be looked at."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def is_table(path: Path) -> bool:
    return path.suffix.lower() in TABLE_SUFFIXES


def read_file_documents(path: Path, text_column: str) -> Iterator[InputDocument]:
    """A table's rows, or a text file as one document."""
    if is_table(path):
        yield from _table_rows(path, text_column)
    elif (suffix := path.suffix.lower()) in UNREAD_TABLE_SUFFIXES:
        yield InputDocument(
            str(path),
            error=f"a {suffix} file is not read: tables are read from .csv, .jsonl (.ndjson) or "
            ".parquet; convert it to one of those, or rename it .txt to classify it as one "
            "document",
        )
    else:
        yield _read_file(path)


def _expand(argument: str, text_column: str, stdin: IO[str]) -> Iterator[InputDocument]:
    if argument == "-":
        yield from _stdin_documents(stdin)
        return
    for item in expand_argument(argument):
        if isinstance(item, InputDocument):
            yield item
        else:
            yield from read_file_documents(item, text_column)


# A code unit the stream's UTF-16/32 cannot decode becomes a lone surrogate, which
# _stdin_lines replaces with U+FFFD and names in the row's warning ("replace" did it silently).
FLAG_BAD_UNITS = "docclass-flag-bad-units"
codecs.register_error(FLAG_BAD_UNITS, lambda error: ("\ud800", error.end))


def _stdin_documents(stdin: IO[str]) -> Iterator[InputDocument]:
    """One document per line, decoded as a file's bytes are, whatever the locale (decoded by
    the locale, bad bytes reached the tokenizer as surrogates and ended the run): a UTF-16/32
    mark at the start decides the whole stream; a line holding NUL bytes is an error row."""
    lines: Iterable[str | bytes] = stdin
    if (binary := getattr(stdin, "buffer", None)) is not None:
        start = binary.peek(4)[:4] if hasattr(binary, "peek") else b""
        codec = next((c for m, c in (*UTF32_MARKS, *UTF16_MARKS) if start.startswith(m)), None)
        lines = binary
        if codec:
            # Lines end at "\n" as in the bytes read below; detached after, so that closing
            # the wrapper does not close standard input under the next "-".
            wrapper = io.TextIOWrapper(binary, encoding=codec, errors=FLAG_BAD_UNITS, newline="\n")
            try:
                yield from _stdin_lines(wrapper)
            finally:
                wrapper.detach()
            return
    yield from _stdin_lines(lines)


def _stdin_lines(lines: Iterable[str | bytes]) -> Iterator[InputDocument]:
    for number, line in enumerate(lines, start=1):
        warning = None
        if isinstance(line, bytes):
            if b"\x00" in line:
                yield InputDocument(f"stdin:{number}", error="binary (NUL bytes): not text")
                continue
            # UTF-8, else Windows-1252 (a Latin-1 pipe's "Café"); the stream's mark, if any,
            # was looked for before ("ÿþ" starting a later line is Windows-1252).
            text, was_legacy = decode_text(line, by_mark=False)
            warning = NOT_UTF8 if was_legacy else None
        else:
            text, bad = _valid_utf8(line.removeprefix("\ufeff") if number == 1 else line)
            warning = ROW_BAD_BYTES if bad else None
        text = text.rstrip("\n").removesuffix("\r")
        yield InputDocument(f"stdin:{number}", text=text, warning=warning)


def read_inputs(
    arguments: Iterable[str], text_column: str = "text", stdin: IO[str] | None = None
) -> Iterator[InputDocument]:
    """Every document the arguments name, lazily, in order."""
    stdin = stdin if stdin is not None else sys.stdin
    for argument in arguments:
        yield from _expand(argument, text_column, stdin)


def classify_documents(
    classifier: DocClassifier,
    documents: Iterable[InputDocument],
    batch_size: int = 64,
    top_words: int = 0,
    chunk: int = CHUNK_DOCUMENTS,
    method: str | None = None,
    calibrated: bool = True,
    min_probability: float | None = None,
) -> Iterator[dict[str, Any]]:
    """One output row per input document, in order, ``chunk`` documents in memory at a time
    (probabilities calibrated unless ``calibrated`` is False, rows below ``min_probability``
    uncertain: :meth:`DocClassifier.predict`)."""
    pending: list[InputDocument] = []

    def flush() -> Iterator[dict[str, Any]]:
        texts = [d.text for d in pending if d.error is None and d.text and d.text.strip()]
        results = (
            iter(
                classifier.predict(
                    texts,
                    batch_size,
                    top_words,
                    method=method,
                    calibrated=calibrated,
                    min_probability=min_probability,
                )  # fmt: skip
            )
            if texts
            else iter(())
        )
        for document in pending:
            row: dict[str, Any] = {"id": document.id}
            if document.error is not None:
                row.update(label=None, score=None, error=document.error)
            elif not document.text or not document.text.strip():
                row.update(label=None, score=None, error=EMPTY_DOCUMENT)
            else:
                row.update(next(results))
            if document.warning:
                row["warning"] = document.warning
            yield row
        pending.clear()

    for document in documents:
        pending.append(document)
        if len(pending) >= chunk:
            yield from flush()
    yield from flush()


class RowWriter:
    """JSON Lines, or CSV with one ``prob_<label>`` column per class (chosen by extension)."""

    def __init__(self, handle: IO[str], kind: str, labels: list[str]) -> None:
        self.handle, self.kind, self.labels = handle, kind, labels
        if kind == "csv":
            self.fields = ["id", "label", "score", *(f"prob_{n}" for n in labels)]
            self.fields += ["predicted", "uncertain"]  # with --min_probability
            self.fields += ["truncated", "method", "top_words", "warning", "error"]
            self.csv = csv.DictWriter(handle, self.fields, extrasaction="ignore")
            self.csv.writeheader()

    def write(self, row: dict[str, Any]) -> None:
        if self.kind == "jsonl":
            self.handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            return
        flat = dict(row)
        for name, p in (row.get("probs") or {}).items():
            flat[f"prob_{name}"] = p
        if row.get("top_words"):
            flat["top_words"] = " ".join(f"{w['word']}:{w['score']:.4f}" for w in row["top_words"])
        self.csv.writerow({name: spreadsheet_safe(value) for name, value in flat.items()})


# Names of formats classify does not write: JSON Lines under such a name reads as a broken file.
OTHER_FORMATS = (".parquet", ".json", ".xlsx", ".xls", ".tsv", ".feather", ".arrow")
# Nor compressed files: plain text under such a name reads as a corrupt archive.
COMPRESSED = ".gz .gzip .tgz .bz2 .xz .lzma .z .zst .zstd .zip .lz4 .br .7z .tar".split()


def output_kind(path: str | None) -> str:
    """``csv`` for a ``.csv`` path, else ``jsonl`` (standard output, pipes and other names
    included); a path named for another table format is refused."""
    if path and path.lower().endswith((*OTHER_FORMATS, *COMPRESSED)):
        compressed = path.lower().endswith(tuple(COMPRESSED))
        raise ConfigError(
            f"--out {path}: classify writes plain CSV (.csv) or JSON Lines (.jsonl), not "
            f"{Path(path).suffix}; name the file .csv or .jsonl"
            + (" and compress it once written" if compressed else "")
        )
    return "csv" if path and path.lower().endswith(".csv") else "jsonl"


def run_classify(
    ckpt: str,
    inputs: list[str],
    out: str | None = None,
    text_column: str = "text",
    top_words: int = 0,
    batch_size: int = 64,
    device: str = "auto",
    progress: bool | None = None,
    method: str | None = None,
    calibrated: bool = True,
    min_probability: float | None = None,
) -> dict[str, int]:
    """What ``docclass classify`` runs. Returns counts: documents, errors, warnings, truncated,
    uncertain."""
    from tqdm import tqdm

    # /dev/stdout opened anew would be truncated (`>> log` would lose the log): the stream it is.
    to_stdout = out is None or out in ("-", "/dev/stdout")
    kind = output_kind(out)
    if not to_stdout:
        check_out_is_not_an_input(out, inputs)
    classifier = DocClassifier.load(ckpt, device)
    classifier.check_threshold(min_probability, calibrated)  # before any output is written
    handle, partial = (sys.stdout, None) if to_stdout else _open_output(Path(out))
    finished = False
    counts = {"documents": 0, "errors": 0, "warnings": 0, "truncated": 0, "uncertain": 0}
    # Which probabilities the rows carry, for the summary line.
    counts["temperature"] = (
        classifier.temperature if calibrated and classifier.temperature_fitted else None
    )
    show = sys.stderr.isatty() if progress is None else progress
    try:
        writer = RowWriter(handle, kind, classifier.labels)
        documents = read_inputs(inputs, text_column)
        rows = classify_documents(
            classifier, documents, batch_size, top_words, method=method, calibrated=calibrated,
            min_probability=min_probability,
        )  # fmt: skip
        for row in tqdm(rows, desc="classifying", unit="doc", disable=not show, file=sys.stderr):
            writer.write(row)
            counts["documents"] += 1
            counts["errors"] += row.get("error") is not None
            counts["warnings"] += "warning" in row
            counts["truncated"] += bool(row.get("truncated"))
            counts["uncertain"] += bool(row.get("uncertain"))
        finished = True
    finally:
        if to_stdout:
            handle.flush()
        else:
            handle.close()
        if partial is not None and finished:
            os.replace(partial, out)
        elif partial is not None:  # stopped by an error: no file that looks like a finished run's
            partial.unlink(missing_ok=True)
    return counts


def _open_output(out: Path) -> tuple[IO[str], Path | None]:
    """The handle rows are written to, and the hidden partial file to rename to ``out`` at the
    end (None for a pipe, a device or a link such as ``/dev/stdout``: written as rows come)."""
    # Not for a link either (``/dev/stdout`` redirected to a file is a link to a regular file):
    # renaming over it would replace the link, not write where it points.
    try:
        if out.is_symlink() or (out.exists() and not out.is_file()):
            return open(out, "w", encoding="utf-8", newline=""), None
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        return open(partial, "w", encoding="utf-8", newline=""), partial
    except OSError as error:
        # A folder, a path under a file, a folder that cannot be written: torch's and Python's
        # tracebacks named the hidden partial file, not the --out given.
        raise ConfigError(
            f"--out {out}: cannot be written ({error.strerror or error}); give a file path in "
            "a folder you can write to"
        ) from None


def check_out_is_not_an_input(out: str, inputs: Iterable[str]) -> None:
    """Refuse an output path that is one of the inputs or lies inside an input folder (or a
    folder a pattern names): it would be read back as documents, or overwrite one."""
    target = Path(os.path.realpath(out))  # realpath: a link loop among the inputs is no error
    for argument in inputs:
        if argument == "-":
            continue
        literal = os.path.lexists(argument) or not glob.has_magic(argument)
        named = [argument] if literal else pattern_matches(argument)
        walked: set[Path] = set()
        roots: set[Path] = set()
        for source in (Path(os.path.realpath(name)) for name in named):
            # A folder's linked folders are read as its own (_walk): an output in one is inside.
            # A folder a walked one holds, by its real path (a ** pattern's matches), is not
            # walked again: what it reaches, that walk reached.
            if _is_folder(source) and not _held(roots, source):
                roots.add(source)
                walked |= {Path(os.path.realpath(root)) for root, _ in _walk(source, [])}
            if target == source or source in target.parents or walked & set(target.parents):
                raise ConfigError(
                    f"--out {out} is {'inside ' if target != source else ''}the input "
                    f"{argument}: it would be read as documents or overwrite one; write the "
                    "output outside the inputs"
                )


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _held(roots: set[Path], path: Path) -> bool:
    """Whether ``path`` lies in one of ``roots`` by real folders, none hidden (as :func:`_walk`
    reads them); looked up folder by folder, so many roots cost no more than one."""
    for folder in (path, *path.parents):
        if folder in roots:
            return True
        if folder.name.startswith("."):
            return False
    return False
