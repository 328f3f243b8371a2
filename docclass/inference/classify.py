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
not valid UTF-8                classified after decoding with U+FFFD for the bad bytes, with a
                               ``warning`` — one stray byte (a Latin-1 "£") should not cost the
                               document, and guessing another encoding can silently be wrong
binary (NUL bytes)             ``error``: binary file
unreadable file                ``error``: the operating system's reason
missing path / empty glob      ``error``: no such file
longer than the model reads    classified on its first ``max_tokens`` tokens, ``truncated: true``
table row without its text     ``error`` naming the column and the columns present
=============================  =================================================================
"""

from __future__ import annotations

import csv
import glob
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jsonargparse.typing import NonNegativeInt, PositiveInt

from docclass.inference.classifier import DocClassifier, WordScoreMethod
from docclass.interpret.records import EMPTY_DOCUMENT

TABLE_SUFFIXES = {".csv", ".jsonl", ".parquet"}
# Sniffing this much of a file is enough to tell text from binary.
SNIFF_BYTES = 8192
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


def decode_document(raw: bytes) -> tuple[str | None, str | None, str | None]:
    """``(text, error, warning)`` for a file's bytes."""
    if b"\x00" in raw[:SNIFF_BYTES]:
        return None, "binary file (NUL bytes): not a text document", None
    try:
        return raw.decode("utf-8-sig"), None, None
    except UnicodeDecodeError as error:
        text = raw.decode("utf-8", errors="replace")
        warning = (
            f"not valid UTF-8 (first bad byte at offset {error.start}); undecodable bytes "
            "replaced with U+FFFD"
        )
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
    try:
        if suffix == ".csv":
            with open(path, newline="", encoding="utf-8", errors="replace") as handle:
                reader = csv.DictReader(handle)
                for number, row in enumerate(reader, start=1):
                    yield _row_document(path, number, row, text_column, reader.fieldnames)
        elif suffix == ".jsonl":
            with open(path, encoding="utf-8", errors="replace") as handle:
                for number, line in enumerate(handle, start=1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as error:
                        yield InputDocument(f"{path}:{number}", error=f"not JSON: {error.msg}")
                        continue
                    if not isinstance(row, dict):
                        yield InputDocument(f"{path}:{number}", error="not a JSON object")
                        continue
                    yield _row_document(path, number, row, text_column, list(row))
        else:
            import pyarrow.parquet as pq

            table = pq.ParquetFile(path)
            columns = table.schema_arrow.names
            number = 0
            for batch in table.iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    number += 1
                    yield _row_document(path, number, row, text_column, columns)
    except OSError as error:
        yield InputDocument(str(path), error=f"cannot read: {error.strerror or error}")
    except Exception as error:  # a corrupt Parquet or CSV file: say so in its row, go on
        yield InputDocument(str(path), error=f"cannot read as a table: {error}")


def _row_document(
    path: Path, number: int, row: dict, text_column: str, columns: Iterable[str] | None
) -> InputDocument:
    # The table's own id when it has one, so output rows join back to the input; else where
    # the row is (the file and its row number, the first row being 1).
    own_id = row.get(ID_COLUMN)
    doc_id = str(own_id) if own_id not in (None, "") else f"{path}:{number}"
    value = row.get(text_column)
    if value is None:
        return InputDocument(
            doc_id,
            error=f"no {text_column!r} value (columns: {list(columns or [])}); set --text-column",
        )
    return InputDocument(doc_id, text=str(value))


def _expand(argument: str, text_column: str, stdin: IO[str]) -> Iterator[InputDocument]:
    if argument == "-":
        for number, line in enumerate(stdin, start=1):
            yield InputDocument(f"stdin:{number}", text=line.rstrip("\n"))
        return
    path = Path(argument)
    if path.is_dir():
        for child in sorted(p for p in path.rglob("*") if p.is_file()):
            if not any(part.startswith(".") for part in child.relative_to(path).parts):
                yield from _expand_file(child, text_column)
        return
    if not path.exists() and glob.has_magic(argument):
        matches = sorted(glob.glob(argument, recursive=True))
        if not matches:
            yield InputDocument(argument, error="no file matches this pattern")
        for match in matches:
            yield from _expand(match, text_column, stdin)
        return
    if not path.exists():
        yield InputDocument(argument, error="no such file or folder")
        return
    yield from _expand_file(path, text_column)


def _expand_file(path: Path, text_column: str) -> Iterator[InputDocument]:
    if path.suffix.lower() in TABLE_SUFFIXES:
        yield from _table_rows(path, text_column)
    else:
        yield _read_file(path)


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
) -> Iterator[dict[str, Any]]:
    """One output row per input document, in order, ``chunk`` documents in memory at a time."""
    pending: list[InputDocument] = []

    def flush() -> Iterator[dict[str, Any]]:
        texts = [d.text for d in pending if d.error is None and d.text and d.text.strip()]
        results = (
            iter(classifier.predict(texts, batch_size, top_words, method=method))
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
        self.csv.writerow(flat)


def output_kind(path: str | None) -> str:
    """``csv`` for a ``.csv`` path, else ``jsonl`` (standard output included)."""
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
) -> dict[str, int]:
    """What ``docclass classify`` runs. Returns counts: documents, errors, warnings, truncated."""
    from tqdm import tqdm

    classifier = DocClassifier.load(ckpt, device)
    kind = output_kind(out)
    to_stdout = out is None or out == "-"
    if not to_stdout:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    handle = sys.stdout if to_stdout else open(out, "w", encoding="utf-8", newline="")
    counts = {"documents": 0, "errors": 0, "warnings": 0, "truncated": 0}
    show = sys.stderr.isatty() if progress is None else progress
    try:
        writer = RowWriter(handle, kind, classifier.labels)
        documents = read_inputs(inputs, text_column)
        rows = classify_documents(classifier, documents, batch_size, top_words, method=method)
        for row in tqdm(rows, desc="classifying", unit="doc", disable=not show, file=sys.stderr):
            writer.write(row)
            counts["documents"] += 1
            counts["errors"] += row.get("error") is not None
            counts["warnings"] += "warning" in row
            counts["truncated"] += bool(row.get("truncated"))
    finally:
        if not to_stdout:
            handle.close()
        else:
            handle.flush()
    return counts


def classify_command(
    inputs: list[str],
    ckpt: str,
    out: str | None = None,
    text_column: str = "text",
    top_words: NonNegativeInt = 0,
    batch_size: PositiveInt = 64,
    device: str = "auto",
    strict: bool = False,
    progress: bool | None = None,
    method: WordScoreMethod | None = None,
) -> dict[str, int]:
    """Classify documents in bulk: one output row per input document, in order.

    Args:
        inputs: files, folders (recursive), globs, '-' (stdin, one document per line), or
            CSV / JSONL / Parquet tables (one document per row).
        ckpt: checkpoint written by 'docclass fit', a folder written by 'docclass export', or
            hub:owner/name@<commit> (a folder on the hub, pinned).
        out: output file: .csv for CSV, else JSON Lines (default: standard output).
        text_column: text column of table inputs.
        top_words: add the K words with the highest word scores to each row.
        batch_size: most documents per forward pass (on the CPU a pass also stops at 2,048
            tokens, which is faster there than larger batches).
        device: auto (CUDA if available), cpu, cuda.
        strict: exit with status 1 if any document got an error.
        progress: progress bar on stderr (default: when stderr is a terminal).
        method: the word-score method of --top_words (default: the one the model's own
            faithfulness measurements trust most).
    """
    counts = run_classify(
        ckpt, inputs, out, text_column, top_words, batch_size, device, progress, method
    )
    print(
        f"classified {counts['documents'] - counts['errors']} of {counts['documents']} documents"
        f" ({counts['errors']} errors, {counts['warnings']} warnings, "
        f"{counts['truncated']} truncated)",
        file=sys.stderr,
    )
    if strict and counts["errors"]:
        sys.exit(1)
    return counts
