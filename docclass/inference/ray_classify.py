"""``docclass classify --engine ray``: bulk classification on Ray Data, resumable, nothing lost.

The driver turns the inputs into a **plan** of shards without reading any document: loose
files grouped in order, a JSON Lines file cut at line boundaries, a Parquet file cut at row
groups, a CSV file whole (a quoted field may hold a newline, so it cannot be cut by bytes).
The plan is a Ray dataset with one block per shard; ``map_batches`` hands each shard to an
actor holding one ``DocClassifier``. The actor reads the shard with the same readers as
``docclass classify`` (so every bad input gets the same error row), classifies it with the
same ``classify_documents`` (so the same token-limited batcher cuts its batches) and writes
``part-NNNNNN.parquet`` under a temporary name, renamed into place when complete.

Why this gives every input row exactly once:

- a shard's rows are written by one rename (after an fsync), so a part file is whole or absent,
  and its Parquet metadata names the plan it belongs to;
- a worker killed mid-shard leaves no part; Ray restarts the actor and retries the shard (at
  most ``RETRIES`` times); a shard retried after its rename writes the same rows again;
- a run killed as a whole is started again with the same command: the plan is rebuilt and
  must equal ``_plan.json`` (same inputs, file sizes and times, settings and weights), and
  only the shards without a whole part of that plan are classified;
- workers check each file's size and time, and the model's fingerprint, against the plan, so
  an edited file or a path naming another file on a worker's node is an error, never rows.

Ray's own file readers are not used for documents: they stop the job at a malformed row, and a
position inside them cannot be named again after a restart, which resuming needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import resource
import socket
import stat
import sys
import uuid
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

from docclass.errors import ConfigError, DataError, RunStopped, UserError
from docclass.inference.classify import (
    JSONL_SUFFIXES,
    InputDocument,
    check_out_is_not_an_input,
    classify_documents,
    expand_argument,
    is_table,
    jsonl_rows,
    parquet_rows,
    read_file_documents,
    refuse_repeated_columns,
)

log = logging.getLogger(__name__)

PLAN_FILE = "_plan.json"
SUMMARY_FILE = "_summary.json"
LOCK_FILE = "_lock"
# Ray restarts a killed worker and retries its shard this many times, then the run stops (a
# document that kills its worker every time must not retry for ever).
RETRIES = 3
# Raised when the plan's layout changes, so a folder of an older layout is refused, not misread;
# and when the input readers change what a shard's rows are (2: strict CSV, ids kept as text), so
# a resumed run never mixes parts read both ways.
PLAN_VERSION = 2
# Each part's Parquet metadata names the plan it belongs to under this key.
PLAN_KEY = "docclass.plan"
# Rows are written to a part 1,024 at a time: a whole CSV file is one shard, and its rows
# must not all sit in a worker's memory.
WRITE_ROWS = 1024
SHARD_DOCUMENTS = 10_000
# JSON Lines files are scanned in blocks this large to find where each shard's lines begin.
SCAN_BYTES = 1 << 24


def part_name(index: int) -> str:
    return f"part-{index:06d}.parquet"


# ----------------------------------------------------------------------------------- the plan


def file_state(path: Path) -> list[int] | None:
    """Size and modification time of a regular file (None for anything else: a pipe's change
    with every write). A resumed run, and every worker, must read the bytes the plan saw."""
    try:
        return _state_of(path.stat())
    except OSError:
        return None


def _state_of(status: os.stat_result) -> list[int] | None:
    if not stat.S_ISREG(status.st_mode):
        return None
    return [status.st_size, status.st_mtime_ns]


def check_file(shard: dict[str, Any], key: str = "state") -> None:
    """Stop a shard whose file is not the one planned, rather than classify other bytes (a
    file edited since, or a relative path that names another file on this worker's node)."""
    path = Path(shard["path"])
    if shard.get(key) is not None and file_state(path) != shard[key]:
        raise ChangedInputError(
            f"{path}: not the file the run was planned on (its size or modified time differ); "
            "on a cluster give paths that name the same file on every node, and start a new "
            "--out for changed inputs"
        )


class ChangedInputError(DataError):
    """An input file differs from the one in the plan."""


def _jsonl_shards(path: Path, every: int) -> list[dict[str, Any]]:
    """Cut a JSON Lines file after every ``every``-th line: ``(start, end, first_line)``."""
    cuts = [(0, 1)]  # (byte where a shard's first line begins, that line's number)
    lines, next_cut, offset = 0, every, 0
    with open(path, "rb") as handle:
        state = _state_of(os.fstat(handle.fileno()))
        while block := handle.read(SCAN_BYTES):
            position, left = 0, block.count(b"\n")  # newlines in the block after ``position``
            while left >= next_cut - lines:
                for _ in range(next_cut - lines):
                    position = block.index(b"\n", position) + 1
                left -= next_cut - lines
                lines = next_cut
                cuts.append((offset + position, lines + 1))
                next_cut += every
            lines += left
            offset += len(block)
    if state is None or file_state(path) != state or offset != state[0]:
        raise ChangedInputError(f"{path}: changed while the run was planned; run it again")
    ends = [start for start, _ in cuts[1:]] + [offset]
    return [
        {"kind": "jsonl", "path": str(path), "state": state, "start": start, "end": end,
         "first_line": first}
        for (start, first), end in zip(cuts, ends, strict=True)
        if start < end or start == 0
    ]  # fmt: skip


def _parquet_shards(path: Path, every: int, text_column: str) -> list[dict[str, Any]]:
    """Consecutive row groups of about ``every`` rows; a row group is never split. A file
    whose text or id column is named twice raises here, so that it gets one error row, not
    one per shard."""
    import pyarrow.parquet as pq

    with open(path, "rb") as handle:
        state = _state_of(os.fstat(handle.fileno()))
        metadata = pq.ParquetFile(handle).metadata
    refuse_repeated_columns(metadata.schema.to_arrow_schema().names, text_column)
    if state is None or file_state(path) != state:
        raise ChangedInputError(f"{path}: changed while the run was planned; run it again")
    largest = max(
        (metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)), default=0
    )
    if largest > 4 * every:
        log.warning(
            "%s: row groups of up to %d rows, and a Parquet file is cut only between row "
            "groups, so fewer workers share it; write it with row groups of about %d rows "
            "(pyarrow.parquet.write_table(..., row_group_size=%d))",
            path, largest, every, every,
        )  # fmt: skip
    shards: list[dict[str, Any]] = []
    groups: list[int] = []
    first_row = next_row = 1
    for group in range(metadata.num_row_groups):
        groups.append(group)
        next_row += metadata.row_group(group).num_rows
        if next_row - first_row >= every:
            shards.append(_parquet_shard(path, state, groups, first_row))
            groups, first_row = [], next_row
    if groups or not shards:
        shards.append(_parquet_shard(path, state, groups, first_row))
    return shards


def _parquet_shard(
    path: Path, state: list[int] | None, groups: list[int], first_row: int
) -> dict[str, Any]:
    return {
        "kind": "parquet", "path": str(path), "state": state, "row_groups": groups,
        "first_row": first_row,
    }  # fmt: skip


def _table_shards(path: Path, every: int, text_column: str) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if path.exists() and file_state(path) is None:
        # A pipe would be read here to plan, leaving nothing for the worker.
        raise ConfigError(
            f"{path}: a table for --engine ray must be a regular file (not a pipe or device); "
            "save it to a file first"
        )
    try:
        if suffix in JSONL_SUFFIXES:
            return _jsonl_shards(path, every)
        if suffix == ".parquet":
            return _parquet_shards(path, every, text_column)
    except ChangedInputError:
        raise
    except Exception:  # unreadable or corrupt: read whole, where it gets classify's error row
        pass
    return [{"kind": "files", "items": [{"path": str(path), "state": file_state(path)}]}]


def build_plan(
    inputs: list[str], text_column: str, settings: dict[str, Any], every: int = SHARD_DOCUMENTS
) -> dict[str, Any]:
    """Every input as shards, in input order, without reading a document."""
    shards: list[dict[str, Any]] = []
    loose: list[dict[str, Any]] = []

    def close_loose() -> None:
        if loose:
            shards.append({"kind": "files", "items": list(loose)})
            loose.clear()

    for argument in inputs:
        if argument == "-":
            raise ConfigError(
                "classify --engine ray: '-' (standard input) cannot be shared among workers or "
                "resumed; save it to a file and name the file"
            )
        for item in expand_argument(argument):
            if isinstance(item, InputDocument):
                loose.append({"id": item.id, "error": item.error or ""})
            elif is_table(item):
                close_loose()
                shards.extend(_table_shards(item, every, text_column))
            else:
                loose.append({"path": str(item), "state": file_state(item)})
            if len(loose) >= every:
                close_loose()
    close_loose()
    return {
        "version": PLAN_VERSION,
        "inputs": list(inputs),
        # Relative paths are read from here, and ids keep them as given, as classify does.
        "cwd": os.getcwd(),
        "text_column": text_column,
        "settings": settings,
        "shards": shards,
    }


def read_shard(shard: dict[str, Any], text_column: str) -> Iterator[InputDocument]:
    """A shard's documents, read as ``docclass classify`` reads them; the file is checked
    against the plan before its first row and again after its last, before the part is kept."""
    kind = shard["kind"]
    if kind == "files":
        for item in shard["items"]:
            if "error" in item:
                yield InputDocument(item["id"], error=item["error"])
            else:
                check_file(item)
                yield from read_file_documents(Path(item["path"]), text_column)
                check_file(item)
        return
    check_file(shard)
    if kind == "jsonl":
        yield from jsonl_rows(
            Path(shard["path"]), text_column, shard["start"], shard["end"], shard["first_line"]
        )
    elif kind == "parquet":
        yield from parquet_rows(
            Path(shard["path"]), text_column, shard["row_groups"], shard["first_row"]
        )
    else:
        raise ValueError(f"unknown shard kind {kind!r}")
    check_file(shard)


# ------------------------------------------------------------------------------ the part files


def part_schema(labels: list[str]):
    """The columns of ``classify``'s CSV output, typed: one ``prob_<label>`` per class."""
    import pyarrow as pa

    word = pa.struct(
        [("word", pa.string()), ("score", pa.float64()), ("start", pa.int64()), ("end", pa.int64())]
    )
    return pa.schema(
        [
            ("id", pa.string()),
            ("label", pa.string()),
            ("score", pa.float64()),
            *((f"prob_{name}", pa.float64()) for name in labels),
            ("predicted", pa.string()),  # with --min_probability
            ("uncertain", pa.bool_()),
            ("truncated", pa.bool_()),
            ("method", pa.string()),
            ("top_words", pa.list_(word)),
            ("warning", pa.string()),
            ("error", pa.string()),
        ]
    )


def rows_table(rows: list[dict[str, Any]], labels: list[str], schema):
    import pyarrow as pa

    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for row in rows:
        probs = row.get("probs") or {}
        for name in schema.names:
            if name.startswith("prob_") and name[5:] in labels:
                columns[name].append(probs.get(name[5:]))
            elif name == "top_words":
                columns[name].append(
                    [{k: w[k] for k in ("word", "score", "start", "end")} for w in row[name]]
                    if row.get(name) is not None
                    else None
                )
            else:
                columns[name].append(row.get(name))
    return pa.table(columns, schema=schema)


def write_part(
    out: Path, index: int, rows: Iterator[dict[str, Any]], labels: list[str], digest: str
) -> None:
    """Write a shard's rows whole or not at all: streamed into a temporary file, flushed to
    disk, renamed into place. The part names its plan, so a resumed run counts only parts of
    its own plan as done."""
    final = out / part_name(index)
    # Unique on a shared folder, where two nodes' workers may have the same pid.
    temporary = out / f".{final.name}.{uuid.uuid4().hex}.tmp"
    schema = part_schema(labels).with_metadata({PLAN_KEY: digest})
    try:
        _write_rows(temporary, schema, rows, labels)
        _fsync(temporary)
        os.replace(temporary, final)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync(out)  # the rename itself, so a machine that stops now keeps the part


def _write_rows(path: Path, schema, rows: Iterator[dict[str, Any]], labels: list[str]) -> None:
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, schema) as writer:
        chunk: list[dict[str, Any]] = []
        written = 0
        for row in rows:
            chunk.append(row)
            if len(chunk) == WRITE_ROWS:
                writer.write_table(rows_table(chunk, labels, schema))
                written, chunk = written + len(chunk), []
        if chunk or not written:
            writer.write_table(rows_table(chunk, labels, schema))


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def part_done(path: Path, digest: str) -> bool:
    """A part file that is whole (its footer reads) and of this plan."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # absent, or cut short by a machine that stopped: classified again
        return False
    return metadata.get(PLAN_KEY.encode()) == digest.encode()


def plan_hash(plan: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


def peak_rss_mib() -> float:
    """This process's peak resident memory. Linux's VmHWM starts afresh at exec; getrusage's
    figure would include the process this one was forked from (a raylet, a benchmark)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class ShardClassifier:
    """A Ray Data actor: one model, many shards. Each call classifies and writes its shards
    and returns one small summary row per shard."""

    def __init__(
        self,
        ckpt: str,
        out: str,
        cwd: str,
        device: str,
        threads: int,
        text_column: str,
        batch_size: int,
        top_words: int,
        method: str | None,
        digest: str,
        weights: str,
        calibrated: bool = True,
        temperature: float = 1.0,
        min_probability: float | None = None,
    ) -> None:
        import torch

        from docclass.inference.classifier import DocClassifier

        torch.set_num_threads(max(1, threads))
        # The tokenizer's own thread pool would otherwise take every core of the node.
        os.environ["RAYON_NUM_THREADS"] = str(max(1, threads))
        if Path(cwd).is_dir():  # the driver's, so relative paths name the planned files
            os.chdir(cwd)
        self.classifier = DocClassifier.load(ckpt, device)
        if self.classifier.trained.fingerprint != weights:
            raise ChangedInputError(
                f"{ckpt}: not the weights the run was planned with (the file changed, or names "
                "another model on this node); start a new --out"
            )
        if (self.classifier.temperature if calibrated else 1.0) != temperature:
            raise ChangedInputError(
                f"{ckpt}: its calibration temperature changed since the run was planned "
                "(calibrated again); rows of one run must share it: start a new --out"
            )
        if top_words and method is None:
            raise ValueError("a worker writes the plan's word-score method: pass it")
        self.calibrated, self.min_probability = calibrated, min_probability
        self.out, self.digest = Path(out), digest
        self.text_column, self.batch_size = text_column, batch_size
        self.top_words, self.method = top_words, method

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        summary: dict[str, list[Any]] = {key: [] for key in SUMMARY_COLUMNS}
        for index, shard_json in zip(batch["index"], batch["shard"], strict=True):
            shard = json.loads(str(shard_json))
            rows = classify_documents(
                self.classifier,
                read_shard(shard, self.text_column),
                self.batch_size,
                self.top_words,
                method=self.method,
                calibrated=self.calibrated,
                min_probability=self.min_probability,
            )
            try:
                write_part(self.out, int(index), rows, self.classifier.labels, self.digest)
                failed = ""
            except ChangedInputError as error:  # the user's to fix: no part, the run goes on
                failed = str(error)
            summary["index"].append(int(index))
            summary["failed"].append(failed)
            summary["worker"].append(f"{socket.gethostname()}:{os.getpid()}")
            summary["peak_rss_mib"].append(peak_rss_mib())
        return summary


SUMMARY_COLUMNS = ("index", "failed", "worker", "peak_rss_mib")


# ---------------------------------------------------------------------------------- the driver


def _first_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    for key in new:
        if old.get(key) != new[key]:
            return key
    return next((key for key in old if key not in new), "version")


def open_run_folder(out: Path, plan: dict[str, Any]) -> list[int]:
    """Write ``_plan.json`` on a first run, check it on a resumed one; return the shards that
    still need a part file."""
    out.mkdir(parents=True, exist_ok=True)
    plan_path = out / PLAN_FILE
    if not plan_path.exists() and any(out.glob("part-*.parquet")):
        raise ConfigError(
            f"{out}: holds part files but no {PLAN_FILE}, so nothing says which run wrote them; "
            "give a new --out, or empty that folder"
        )
    if plan_path.exists():
        try:
            old = json.loads(plan_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ConfigError(f"{plan_path}: unreadable ({error}); give a new --out") from error
        if old != plan:
            differs = _first_difference(old, plan)
            raise ConfigError(
                f"{out}: holds a run of other inputs, files or settings ({differs!r} differs "
                f"from its {PLAN_FILE}); give a new --out, or delete that folder"
            )
    else:
        temporary = out / f".{PLAN_FILE}.tmp"
        temporary.write_text(json.dumps(plan), encoding="utf-8")
        _fsync(temporary)
        os.replace(temporary, plan_path)
        _fsync(out)
    for stale in out.glob(".part-*.tmp"):  # left by a worker killed while writing
        stale.unlink(missing_ok=True)
    digest = plan_hash(plan)
    return [i for i in range(len(plan["shards"])) if not part_done(out / part_name(i), digest)]


def _start_ray(address: str | None) -> bool:
    """Join the cluster at ``address``, or start a local Ray; True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=True,
            configure_logging=True,
        )
    except Exception as error:  # no cluster there, or one of another Ray version
        raise ConfigError(
            f"--address {address or '(none: RAY_ADDRESS, else a local Ray)'}: Ray did not "
            f"start or join a cluster ({_first_line(error)})"
        ) from error
    # Ray Data logs every execution's plan and progress at INFO; the run's own counts suffice.
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return True


def _check_settings(out: str, inputs: list[str], device: str, num_gpus: float) -> None:
    """Refuse, before any plan, what the run could not do as asked."""
    if not out or out == "-" or out.lower().endswith((".csv", ".jsonl", ".json")):
        raise ConfigError(
            f"--out {out!r}: --engine ray writes Parquet parts into a folder; give --out <folder>"
        )
    if device.startswith("cuda") and not num_gpus:
        raise ConfigError(
            f"--device {device} with --engine ray: give each worker a GPU with --num_gpus 1 (or "
            "0.5 for two workers a GPU); without it workers run on CPUs"
        )
    check_out_is_not_an_input(out, inputs)  # its parts would be read back as tables


def classify_on_ray(
    ckpt: str,
    inputs: list[str],
    out: str,
    text_column: str = "text",
    top_words: int = 0,
    batch_size: int = 64,
    device: str = "auto",
    method: str | None = None,
    address: str | None = None,
    workers: int | None = None,
    cpus_per_worker: int = 1,
    num_gpus: float = 0,
    shard_documents: int = SHARD_DOCUMENTS,
    progress: bool | None = None,
    calibrated: bool = True,
    min_probability: float | None = None,
) -> dict[str, Any]:
    """Classify on Ray Data into ``out/part-*.parquet``; run it again to resume.

    Returns counts: documents, errors, warnings, truncated (of the whole run, resumed parts
    included), shards, shards_skipped (found written), shards_classified, and each worker's
    peak memory.
    """
    _require_ray()
    _check_settings(out, inputs, device, num_gpus)
    out_dir = Path(out)
    settings = _model_settings(ckpt, top_words, method, batch_size, calibrated, min_probability)
    settings["device"] = device if num_gpus else "cpu"  # one run's rows come from one device
    plan = build_plan(inputs, text_column, settings, shard_documents)
    with _only_run(out_dir):
        todo = open_run_folder(out_dir, plan)
        worker = {
            "ckpt": str(ckpt), "out": str(out_dir.resolve()), "cwd": plan["cwd"],
            "device": settings["device"], "threads": cpus_per_worker,
            "text_column": text_column, "batch_size": batch_size, "top_words": top_words,
            # The plan's method, not --method: left None, each worker chose the default again
            # from whatever report/ it saw then, and one run could write two methods' rows.
            "method": settings["method"], "digest": plan_hash(plan),
            "weights": settings["weights"],
            "calibrated": calibrated, "temperature": settings["temperature"],
            "min_probability": min_probability,
        }  # fmt: skip
        peaks: dict[str, float] = {}
        if todo:
            show = sys.stderr.isatty() if progress is None else progress
            resources = {"workers": workers, "cpus": cpus_per_worker, "gpus": num_gpus}
            peaks = _run_shards(plan, todo, worker, resources, address, show)
        shards = len(plan["shards"])
        result: dict[str, Any] = {
            **_count_parts(out_dir, shards, plan_hash(plan)),
            "shards": shards,
            "shards_skipped": shards - len(todo),
            "shards_classified": len(todo),
            "temperature": settings["temperature"] if settings["calibrated"] else None,
            # Keyed by host:pid, so a worker Ray restarted counts again.
            "worker_processes": len(peaks),
            "worker_peak_rss_mib": peaks,
        }
        (out_dir / SUMMARY_FILE).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


def _require_ray() -> None:
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            "classify --engine ray needs Ray: pip install -e '.[ray]' (or pip install 'ray[data]')"
        ) from error


@contextlib.contextmanager
def _only_run(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock for the run: two runs in one folder would delete each other's
    temporary files and race to write the plan."""
    import fcntl

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; --engine ray writes into a folder")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK_FILE, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            raise ConfigError(
                f"{out}: another docclass run is writing this folder; wait for it, or give "
                "another --out"
            ) from error
        yield


def _model_settings(
    ckpt: str,
    top_words: int,
    method: str | None,
    batch_size: int,
    calibrated: bool = True,
    min_probability: float | None = None,
) -> dict[str, Any]:
    """What the plan records of the model. Loaded once here, so that a bad checkpoint is one
    line before Ray starts, and so that a resumed run must use the same weights."""
    from docclass.inference.classifier import DocClassifier

    classifier = DocClassifier.load(ckpt, "cpu")
    classifier.check_threshold(min_probability, calibrated)  # one line before Ray starts
    return {
        "docclass": version("docclass"),
        "ckpt": str(ckpt),
        "weights": classifier.trained.fingerprint,
        "labels": classifier.labels,
        "top_words": top_words,
        "method": (method or classifier.default_method) if top_words else None,
        "batch_size": batch_size,
        # A resumed run's rows must share the first part's probabilities: 1 means raw.
        "temperature": classifier.temperature if calibrated else 1.0,
        "calibrated": calibrated and classifier.temperature_fitted,
        "min_probability": min_probability,
    }


def _run_shards(
    plan: dict[str, Any],
    todo: list[int],
    worker: dict[str, Any],
    resources: dict[str, Any],
    address: str | None,
    show: bool,
) -> dict[str, float]:
    """Classify the ``todo`` shards on Ray; return each worker's peak memory (MiB)."""
    import ray
    import ray.data
    from tqdm import tqdm

    # ray.init makes SIGTERM a SystemExit, so the ``finally`` below stops the Ray it started.
    started = False
    peaks: dict[str, float] = {}
    failures: list[str] = []
    try:
        started = _start_ray(address)
        if started:
            _refuse_what_this_machine_lacks(resources)
        workers, gpus = _worker_count(resources), resources["gpus"]
        ray.data.DataContext.get_current().enable_progress_bars = False
        rows = [{"index": i, "shard": json.dumps(plan["shards"][i])} for i in todo]
        with warnings.catch_warnings():
            # Ray 2.60 names no parameter for an actor's restarts and retries: its own docs pass
            # them as remote args, which it marks deprecated for 2.64 (the pin is 2.60.x).
            warnings.simplefilter("ignore", DeprecationWarning)
            summaries = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
                ShardClassifier,
                batch_size=1,
                compute=ray.data.ActorPoolStrategy(size=workers),
                num_cpus=resources["cpus"],
                num_gpus=gpus,
                fn_constructor_kwargs=worker,
                max_restarts=RETRIES,
                max_task_retries=RETRIES,
            )
        with tqdm(total=len(todo), desc="shards", unit="shard", disable=not show) as bar:
            for row in summaries.iter_rows():
                bar.update(1)
                pid = str(row["worker"])
                peaks[pid] = max(peaks.get(pid, 0.0), row["peak_rss_mib"])
                if row["failed"]:
                    failures.append(row["failed"])
    except ConfigError:
        raise
    except Exception as error:
        raise _stopped(error, worker["out"], len(plan["shards"])) from error
    finally:
        if started:
            ray.shutdown()
    if failures:
        raise DataError(
            f"{failures[0]} ({len(failures)} part files not written; the others are; for the "
            "changed inputs start a new --out)"
        )
    return peaks


def _refuse_what_this_machine_lacks(resources: dict[str, Any]) -> None:
    """A Ray this run started holds this machine's CPUs and GPUs and never more: a worker asking
    for more waited for ever, Ray's autoscaler saying every 35 s that no node could hold it."""
    import ray

    available = ray.cluster_resources()
    for flag, key, wanted in (("--cpus_per_worker", "CPU", resources["cpus"]),
                              ("--num_gpus", "GPU", resources["gpus"])):  # fmt: skip
        if wanted and wanted > available.get(key, 0):
            raise ConfigError(
                f"{flag} {wanted}: this machine's Ray has {available.get(key, 0):g} {key}(s); "
                f"ask for at most that, or give --address of a cluster that has more"
            )


def _worker_count(resources: dict[str, Any]) -> int:
    """``--workers``, else as many as the cluster's CPUs (or GPUs) hold."""
    import ray

    if resources["workers"] is not None:
        return resources["workers"]
    available = ray.cluster_resources()
    if resources["gpus"]:
        return max(1, int(available.get("GPU", 0) / resources["gpus"]))
    return max(1, int(available.get("CPU", 1) / resources["cpus"]))


def _stopped(error: Exception, out: str, shards: int) -> UserError:
    """A run Ray could not finish, as one line: what stopped it and how far it got. A worker's
    refusal (the weights or a file changed) is the user's to fix; a worker that died (and was
    retried ``RETRIES`` times) or another failure leaves the written parts, which the same
    command keeps when it runs again."""
    reason = _first_line(error)
    if "ChangedInputError" in reason:
        return DataError(reason.split(": ", 1)[1])
    written = sum(1 for _ in Path(out).glob("part-*.parquet"))
    return RunStopped(
        f"{out}: the run stopped with {written} of {shards} part files written ({reason}); "
        "once the cause is fixed, the same command keeps them and classifies the rest"
    )


def _first_line(error: Exception) -> str:
    """The first exception named in ``error``'s message (Ray's holds the worker's traceback),
    else its type."""
    lines = [line for line in str(error).splitlines() if USER_EXCEPTION.match(line)]
    return lines[0] if lines else type(error).__name__


USER_EXCEPTION = re.compile(r"^(?!ray\.)[A-Za-z_][\w.]*(Error|Exception|Interrupt): ")


def _count_parts(out_dir: Path, shards: int, digest: str) -> dict[str, int]:
    """The run's counts, read back from every part file (the resumed ones included)."""
    import pyarrow.parquet as pq

    missing = [i for i in range(shards) if not part_done(out_dir / part_name(i), digest)]
    if missing:
        raise RunStopped(
            f"{out_dir}: {len(missing)} of {shards} part files missing after the run (first: "
            f"{part_name(missing[0])}); the same command classifies them"
        )
    counts = {"documents": 0, "errors": 0, "warnings": 0, "truncated": 0, "uncertain": 0}
    for index in range(shards):
        columns = ["error", "warning", "truncated", "uncertain"]
        table = pq.read_table(out_dir / part_name(index), columns=columns)
        counts["documents"] += table.num_rows
        counts["errors"] += table.num_rows - table["error"].null_count
        counts["warnings"] += table.num_rows - table["warning"].null_count
        counts["truncated"] += sum(bool(v) for v in table["truncated"].to_pylist())
        counts["uncertain"] += sum(bool(v) for v in table["uncertain"].to_pylist())
    return counts
