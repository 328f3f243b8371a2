"""``classify --engine ray``: the same rows as ``classify``, each input row exactly once, through
a worker killed mid-shard and a driver killed mid-run (real SIGKILLs, on a local Ray with 2
workers started by the command itself).

A named pipe among the inputs makes the kills land mid-run without timing: the worker that reads
it blocks until the test writes the document, so the test knows which process holds which shard.
"""

import contextlib
import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import write_every_input_kind

from docclass import DocClassifier
from docclass.cli import main
from docclass.errors import ConfigError
from docclass.inference.classify import read_inputs
from docclass.inference.ray_classify import (
    PLAN_FILE,
    SUMMARY_FILE,
    ChangedInputError,
    ShardClassifier,
    _only_run,
    _stopped,
    build_plan,
    classify_on_ray,
    open_run_folder,
    part_name,
    plan_hash,
    read_shard,
    write_part,
)

# A guard against a hang, not a time limit: with the 2 cores shared by other jobs a local Ray
# start and a 14-document run took over 120 s, so a tighter guard failed a working command.
WAIT_S = 600
# The kill tests find a pipe's reader through /proc.
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture(scope="module")
def ckpt(fitted) -> Path:
    return fitted / "checkpoints" / "last.ckpt"


def hostile_arguments(root: Path) -> list[str]:
    names = ["folder", "empty.txt", "latin1.txt", "binary.bin", "long.txt", "rows.*",
             "missing.txt", "*.nothing"]  # fmt: skip
    return [str(root / name) for name in names]


@pytest.fixture
def drivers(tmp_path):
    """Starts ``classify --engine ray`` in its own process; whatever a test leaves running (it
    failed mid-way) is killed at the end, so no Ray outlives its test. Each run's environment
    carries a mark its Ray workers inherit, by which a test finds its own workers."""
    started: list[subprocess.Popen] = []
    mark = f"DOCCLASS_TEST_RUN={uuid.uuid4().hex}"

    def start(ckpt, arguments, out, *extra):
        command = [sys.executable, "-m", "docclass.cli", "classify", "--ckpt", str(ckpt),
                   "--text_column", "body", *map(str, arguments), "--engine", "ray",
                   "--out", str(out), "--workers", "2", "--progress", "false", *extra]  # fmt: skip
        # A file, not a pipe: Ray's forwarded worker logs could fill a pipe nobody reads yet.
        log = open(tmp_path / f"driver-{len(started)}.log", "w+")  # noqa: SIM115
        env = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
        process = subprocess.Popen(command, stderr=log, stdout=subprocess.DEVNULL, env=env)
        process.log, process.mark = log, mark
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.log.close()


def finished(process) -> str:
    process.wait(timeout=WAIT_S)
    process.log.seek(0)
    err = process.log.read()
    assert process.returncode == 0, err[-3000:]
    return err


def part_rows(out: Path) -> list[dict]:
    """Every row of every part file, parts in plan order."""
    plan = json.loads((out / PLAN_FILE).read_text())
    rows: list[dict] = []
    for index in range(len(plan["shards"])):
        rows += pq.read_table(out / part_name(index)).to_pylist()
    return rows


def local_rows(ckpt, arguments, tmp_path, capsys, *extra) -> list[dict]:
    out = tmp_path / "local.jsonl"
    main(["classify", "--ckpt", str(ckpt), "--text_column", "body", *map(str, arguments),
          "--out", str(out), *extra])  # fmt: skip
    capsys.readouterr()
    return [json.loads(line) for line in out.read_text().splitlines()]


def assert_same_rows(parts: list[dict], local: list[dict]) -> None:
    assert [row["id"] for row in parts] == [row["id"] for row in local]
    for part, row in zip(parts, local, strict=True):
        for key in ("label", "error", "warning", "method"):
            assert part[key] == row.get(key), (key, part, row)
        assert bool(part["truncated"]) == bool(row.get("truncated")), (part, row)
        assert part["score"] == pytest.approx(row.get("score"), abs=1e-6)
        for label, probability in (row.get("probs") or {}).items():
            assert part[f"prob_{label}"] == pytest.approx(probability, abs=1e-6)
        for theirs, ours in zip(part["top_words"] or [], row.get("top_words") or [], strict=True):
            assert (theirs["word"], theirs["start"], theirs["end"]) == (
                ours["word"], ours["start"], ours["end"])  # fmt: skip
            assert theirs["score"] == pytest.approx(ours["score"], abs=1e-6)
        if row.get("label") is None:
            assert all(v is None for k, v in part.items() if k.startswith("prob_"))


# -------------------------------------------------------------------------- the plan (no Ray)


def test_the_plan_reads_every_document_once_in_input_order(tmp_path, monkeypatch):
    root = write_every_input_kind(tmp_path / "in")
    lines = [json.dumps({"body": f"document {n}"}) for n in range(23)]
    lines[4], lines[9], lines[15] = "", "{not json", "[1, 2]"  # blank, broken, not an object
    # CRLF endings, a lone carriage return inside a line, no newline after the last line.
    (root / "many.jsonl").write_bytes(
        ("\r\n".join(lines[:12]) + "\r\n" + "\n".join(lines[12:]))
        .encode()
        .replace(b"document 13", b"document\r13")
    )
    pq.write_table(
        pa.table({"body": [f"row {n}" if n != 5 else None for n in range(10)]}),
        root / "groups.parquet",
        row_group_size=3,
    )
    # Its text column named twice: one error row for the file, not one per row group's shard.
    twice = pa.Table.from_arrays([pa.array(["a", "b", "c"])] * 2, names=["body", "body"])
    pq.write_table(twice, root / "twice.parquet", row_group_size=1)
    arguments = [*hostile_arguments(root), str(root / "many.jsonl"), str(root / "groups.parquet"),
                 str(root / "twice.parquet")]  # fmt: skip
    whole = [dataclasses.asdict(d) for d in read_inputs(arguments, "body")]
    assert len(whole) == 14 + 22 + 10 + 1
    assert "'body' 2 times" in whole[-1]["error"]
    for every, block in ((1, 7), (2, 1), (4, 64), (4, 1 << 24), (100, 5)):
        # Blocks far smaller than the file, so that cuts fall at and across block edges.
        monkeypatch.setattr("docclass.inference.ray_classify.SCAN_BYTES", block)
        plan = build_plan(arguments, "body", {}, every)
        parts = [
            dataclasses.asdict(d) for shard in plan["shards"] for d in read_shard(shard, "body")
        ]
        assert parts == whole, every
        jsonl = [s for s in plan["shards"] if s["kind"] == "jsonl" and "many" in s["path"]]
        parquet = [s for s in plan["shards"] if s["kind"] == "parquet" and "groups" in s["path"]]
        assert len(jsonl) == -(-23 // every)  # cut after every `every` lines
        assert len(parquet) == (4 if every <= 3 else 2 if every == 4 else 1)  # groups 3,3,3,1


def test_json_lines_named_ndjson_are_cut_into_shards_as_jsonl(tmp_path):
    lines = tmp_path / "rows.ndjson"
    lines.write_text("".join(f'{{"id": "N-{i}", "text": "row {i}"}}\n' for i in range(5)))
    plan = build_plan([str(lines)], "text", {}, every=2)
    assert [shard["kind"] for shard in plan["shards"]] == ["jsonl"] * 3
    read = [d.id for shard in plan["shards"] for d in read_shard(shard, "text")]
    assert read == [f"N-{i}" for i in range(5)]


@pytest.mark.fault(
    "classify --engine ray: an input file edited after the run was planned (or, on a cluster, "
    "a relative path naming another file on a worker's node)",
    "its shard is not classified: the worker reports the reason and writes no part; a resumed "
    "run with the edited file is refused in one line; a worker given other weights refuses to "
    "start",
)
def test_a_file_changed_after_planning_is_never_classified(tmp_path, ckpt, worker_side_effects):
    document = tmp_path / "a.txt"
    document.write_text("Shares rose after profits beat forecasts.")
    plan = build_plan([str(document)], "text", {"weights": "w"})
    out = tmp_path / "parts"
    assert open_run_folder(out, plan) == [0]
    document.write_text("Film wins award at festival, and more words than before.")
    with pytest.raises(ChangedInputError, match="not the file the run was planned on"):
        list(read_shard(plan["shards"][0], "text"))
    weights = docclass_weights(ckpt)
    temperature = DocClassifier.load(ckpt, "cpu").temperature
    worker = ShardClassifier(
        str(ckpt), str(out), os.getcwd(), "cpu", 1, "text", 8, 0, None, plan_hash(plan), weights,
        True, temperature,
    )  # fmt: skip
    summary = worker({"index": [0], "shard": [json.dumps(plan["shards"][0])]})
    assert "a.txt: not the file" in summary["failed"][0]
    assert not list(out.glob("*part-000000*"))  # neither the part nor its temporary file
    # A worker whose checkpoint path holds other weights refuses to start.
    with pytest.raises(ChangedInputError, match="not the weights the run was planned with"):
        ShardClassifier(str(ckpt), str(out), os.getcwd(), "cpu", 1, "text", 8, 0, None, "h", "w")
    # One whose checkpoint was calibrated again since the plan refuses too: its rows would
    # carry other probabilities than the parts already written.
    with pytest.raises(ChangedInputError, match="calibration temperature changed"):
        ShardClassifier(
            str(ckpt), str(out), os.getcwd(), "cpu", 1, "text", 8, 0, None, "h", weights,
            True, temperature * 2,
        )  # fmt: skip
    # The same command now plans other bytes: refused rather than mixed with the first plan.
    with pytest.raises(ConfigError, match="'shards' differs from its _plan.json"):
        open_run_folder(out, build_plan([str(document)], "text", {"weights": "w"}))
    with pytest.raises(ConfigError, match="'settings' differs"):
        open_run_folder(out, {**plan, "settings": {"weights": "other"}})


@pytest.fixture
def worker_side_effects(monkeypatch):
    """A worker built in this process sets torch's threads, the tokenizer's pool and the
    folder, as a Ray worker should; put them back, so later tests train as before."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("RAYON_NUM_THREADS", os.environ.get("RAYON_NUM_THREADS", ""))
    monkeypatch.chdir(os.getcwd())
    yield
    torch.set_num_threads(threads)


def test_workers_write_the_plan_s_method_whatever_the_report_says_later(
    tmp_path, fitted, monkeypatch, worker_side_effects
):
    """The driver hands the workers the method its plan records; a report written for other
    weights while the run goes on (or none on a worker's node) changes nothing. Ray itself is
    stood in for by the same worker built in this process."""
    import shutil

    from docclass.inference import ray_classify

    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    ckpt, report = run / "checkpoints" / "last.ckpt", run / "report" / "report.json"
    default = DocClassifier.load(ckpt, "cpu").default_method
    document = tmp_path / "a.txt"
    document.write_text("Shares rose after profits beat forecasts at the bank.")
    handed = {}

    def in_this_process(plan, todo, worker, *_):
        report.write_text(json.dumps({**json.loads(report.read_text()), "weights": "another"}))
        handed.update(worker)
        shard_classifier = ShardClassifier(**worker)
        for index in todo:
            shard_classifier({"index": [index], "shard": [json.dumps(plan["shards"][index])]})
        return {}

    monkeypatch.setattr(ray_classify, "_run_shards", in_this_process)
    out = tmp_path / "parts"
    classify_on_ray(str(ckpt), [str(document)], str(out), top_words=2)
    assert json.loads((out / PLAN_FILE).read_text())["settings"]["method"] == default
    assert DocClassifier.load(ckpt, "cpu").default_method != default  # the default moved
    [row] = pq.read_table(out / part_name(0)).to_pylist()
    assert row["method"] == default and row["top_words"]
    with pytest.raises(ValueError, match="plan's word-score method"):
        ShardClassifier(**{**handed, "method": None})


def docclass_weights(ckpt) -> str:
    from docclass.inference.classifier import DocClassifier

    return DocClassifier.load(ckpt, "cpu").trained.fingerprint


@pytest.mark.fault(
    "classify --engine ray: an --out folder with part files but no plan, a part of another "
    "plan, a part cut short by a machine that stopped, a second run on the same folder",
    "refused in one line, or the part classified again: a part counts as done only when its "
    "footer reads and names this run's plan",
)
def test_only_whole_parts_of_this_plan_count_as_done(tmp_path, ckpt):
    for n in range(3):
        (tmp_path / f"{n}.txt").write_text(f"Shares rose after profits beat forecasts {n}.")
    plan = build_plan([str(tmp_path / "*.txt")], "text", {"weights": "w"}, every=1)
    out = tmp_path / "parts"
    assert open_run_folder(out, plan) == [0, 1, 2]
    labels = ["business", "tech"]
    row = {"id": "x", "label": "tech", "score": 0.9, "probs": {"business": 0.1, "tech": 0.9}}
    write_part(out, 0, iter([row]), labels, plan_hash(plan))
    write_part(out, 1, iter([row]), labels, "another plan")
    (out / part_name(2)).write_bytes((out / part_name(0)).read_bytes()[:-40])  # no footer
    assert open_run_folder(out, plan) == [1, 2]
    assert pq.read_table(out / part_name(0)).to_pylist()[0]["prob_tech"] == 0.9

    (out / PLAN_FILE).unlink()
    with pytest.raises(ConfigError, match="holds part files but no _plan.json"):
        open_run_folder(out, plan)
    with _only_run(out), pytest.raises(ConfigError, match="another docclass run is writing"):
        with _only_run(out):
            pass
    with pytest.raises(ConfigError, match="is a file"):
        with _only_run(tmp_path / "0.txt"):
            pass


def test_a_table_that_is_a_pipe_is_refused(tmp_path):
    os.mkfifo(tmp_path / "rows.jsonl")
    with pytest.raises(ConfigError, match="must be a regular file"):
        build_plan([str(tmp_path / "rows.jsonl")], "text", {})


def test_a_stopped_run_names_the_workers_exception():
    ray_message = (
        "ray::MapWorker(MapBatches(ShardClassifier)).submit() (pid=1)\n"
        '  File "x.py", line 6, in __call__\n'
        "MemoryError: cannot allocate 2 GiB\n\n"
        "ray.exceptions.UserCodeException: UDF failed to process a data block."
    )
    stopped = _stopped(RuntimeError(ray_message), "/nowhere", 7)
    assert str(stopped) == (
        "/nowhere: the run stopped with 0 of 7 part files written (MemoryError: cannot allocate "
        "2 GiB); once the cause is fixed, the same command keeps them and classifies the rest"
    )


@pytest.mark.fault(
    "classify --engine ray on a Ray it starts: a worker asking for more CPUs or GPUs than the "
    "machine has (`--num_gpus 1` without a GPU, `--cpus_per_worker 8` on 2 cores)",
    "one line naming the flag and what the machine has (the run waited for ever)",
)
def test_a_worker_larger_than_this_machine_is_refused(monkeypatch):
    import ray

    from docclass.inference.ray_classify import _refuse_what_this_machine_lacks

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    for resources, message in (({"cpus": 8, "gpus": 0}, "--cpus_per_worker 8: .* has 2 CPU"),
                               ({"cpus": 1, "gpus": 1}, "--num_gpus 1: .* has 0 GPU")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            _refuse_what_this_machine_lacks({"workers": None, **resources})
    _refuse_what_this_machine_lacks({"workers": None, "cpus": 2, "gpus": 0})


def test_a_plan_refuses_standard_input(tmp_path, capsys, ckpt):
    with pytest.raises(SystemExit) as exit_info:
        main(["classify", "--ckpt", str(ckpt), "-", "--engine", "ray", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("docclass: error:") and "standard input" in line


def test_ray_output_must_be_a_folder(tmp_path, capsys, ckpt):
    for out in ("rows.jsonl", "-"):
        with pytest.raises(SystemExit):
            main(["classify", "--ckpt", str(ckpt), str(tmp_path), "--engine", "ray",
                  "--out", out])  # fmt: skip
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--out <folder>" in line


# ----------------------------------------------------------------------------- on a local Ray


@pytest.mark.fault(
    "classify --engine ray: every bad input of classify (empty, binary, non-UTF-8, too long, "
    "row without its text, missing path, empty glob)",
    "the same error, warning and truncated rows as classify, in the same order; then a run "
    "with other inputs into the same --out is one line",
)
def test_ray_rows_equal_classify_rows(tmp_path, capsys, ckpt, drivers):
    root = write_every_input_kind(tmp_path / "in")
    arguments = hostile_arguments(root)
    out = tmp_path / "parts"
    err = finished(drivers(ckpt, arguments, out, "--top_words", "2"))
    local = local_rows(ckpt, arguments, tmp_path, capsys, "--top_words", "2")
    assert_same_rows(part_rows(out), local)
    assert len(local) == 14 and sum(row.get("error") is not None for row in local) == 7
    assert "classified 7 of 14 documents (7 errors, 1 warnings, 1 truncated)" in err
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["documents"] == 14 and summary["errors"] == 7
    # Loose files share a shard; each table has its own.
    assert summary["shards_classified"] == summary["shards"] == 5

    # Other inputs into the same folder would mix two runs' rows: refused, nothing written.
    with pytest.raises(SystemExit):
        main(["classify", "--ckpt", str(ckpt), str(root / "folder"), "--engine", "ray",
              "--out", str(out)])  # fmt: skip
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds a run of other inputs" in line and "'inputs'" in line


def pipe_readers(pipe: Path, other_than: set[int]) -> list[int]:
    """The processes with the named pipe open (Linux's /proc)."""
    found = []
    target = os.path.realpath(pipe)
    for link in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            if os.readlink(link) == target:
                pid = int(link.split("/")[2])
                if pid not in other_than:
                    found.append(pid)
        except OSError:
            continue
    return found


def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WAIT_S} s for {what}")
        time.sleep(0.05)
    return value


@contextlib.contextmanager
def held_pipe(root: Path) -> Iterator[tuple[list[str], Path, int]]:
    """The inputs below, with the pipe held open for writing, so that a worker's read waits
    for the test's data instead of seeing the end of the file."""
    arguments, pipe = blocking_inputs(root)
    writer = os.open(pipe, os.O_RDWR)
    try:
        yield arguments, pipe, writer
    finally:
        os.close(writer)


def blocking_inputs(root: Path) -> tuple[list[str], Path]:
    """40 short documents with a named pipe in the middle: its reader waits for the test."""
    root.mkdir(parents=True)
    topics = ["shares profits market", "film award festival", "match striker goal"]
    for n in range(40):
        (root / f"doc{n:02d}.txt").write_text(f"{topics[n % 3]} number {n} " * 5)
    pipe = root / "pipe.txt"
    os.mkfifo(pipe)
    return [str(root / "doc0*.txt"), str(root / "doc1*.txt"), str(pipe),
            str(root / "doc[23]*.txt")], pipe  # fmt: skip


PIPE_TEXT = b"The film won the award at the festival."


def settled_parts(out: Path, mark: str) -> dict[str, int] | None:
    """Part files and their modified times, once no process of the run (its environment
    carries ``mark``) is left to add one."""
    if [p for p in glob.glob("/proc/[0-9]*/environ") if mark.encode() in _read(p)]:
        return None
    return {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


@pytest.mark.fault(
    "classify --engine ray: a worker process killed (SIGKILL) while it holds a shard",
    "Ray restarts it and retries the shard: every input row exactly once",
)
@linux_only
def test_a_killed_worker_loses_and_repeats_nothing(tmp_path, capsys, ckpt, drivers):
    out, me = tmp_path / "parts", {os.getpid()}
    with held_pipe(tmp_path / "in") as (arguments, pipe, _):
        run = drivers(ckpt, arguments, out, "--shard_documents", "4")
        victim = wait_for(lambda: pipe_readers(pipe, me), "a worker to read the pipe")[0]
        # The victim waits on the pipe, mid-shard. Before it is killed, the pipe's name is
        # given to a file of the same text: Ray runs a retried actor task at least once, so
        # the shard may be read more than once, and a second read of a pipe finds it empty
        # where a second read of a file (what users classify) finds the same bytes.
        text_file = tmp_path / "pipe-text"
        text_file.write_bytes(PIPE_TEXT)
        os.replace(text_file, pipe)
        os.kill(victim, signal.SIGKILL)
    err = finished(run)
    rows = part_rows(out)
    errors = [(row["id"], row["error"]) for row in rows if row["error"]]
    assert "classified 41 of 41 documents (0 errors" in err, (errors, err[-2000:])
    local = local_rows(ckpt, [a for a in arguments if "pipe" not in a], tmp_path, capsys)
    assert sorted(row["id"] for row in rows) == sorted([row["id"] for row in local] + [str(pipe)])
    piped = next(row for row in rows if row["id"] == str(pipe))
    assert piped["label"] and piped["error"] is None


@pytest.mark.fault(
    "classify --engine ray: the driver killed (SIGKILL) mid-run, then the same command again",
    "the resumed run skips the part files already written (not rewritten) and ends with every "
    "input row exactly once",
)
@linux_only
def test_a_killed_run_resumes_without_redoing_written_parts(tmp_path, capsys, ckpt, drivers):
    out, me = tmp_path / "parts", {os.getpid()}
    with held_pipe(tmp_path / "in") as (arguments, pipe, writer):
        first = drivers(ckpt, arguments, out, "--shard_documents", "4")
        wait_for(lambda: pipe_readers(pipe, me), "a worker to read the pipe")
        # The pipe's shard (the sixth of 11) cannot finish; let the other worker write parts.
        wait_for(lambda: len(list(out.glob("part-*.parquet"))) >= 3, "parts to be written")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        # Ray's own processes go when their driver goes; the pipe's reader among them. The
        # parts are counted once the killed run's workers are gone and none is being renamed.
        wait_for(lambda: not pipe_readers(pipe, me), "the killed run's workers to exit")
        written = wait_for(lambda: settled_parts(out, first.mark), "the killed run to settle")
        assert part_name(5) not in written and 3 <= len(written) < 11
        second = drivers(ckpt, arguments, out, "--shard_documents", "4")
        wait_for(lambda: pipe_readers(pipe, me), "the resumed run to read the pipe")
        os.write(writer, PIPE_TEXT)
    err = finished(second)
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["shards"] == 11 and summary["shards_skipped"] == len(written)
    assert summary["shards_classified"] == 11 - len(written) and summary["documents"] == 41
    assert f"({len(written)} found written, {11 - len(written)} classified now)" in err
    for name, modified in written.items():  # not classified or written again
        assert (out / name).stat().st_mtime_ns == modified
    rows = part_rows(out)
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)) == 41
    local = local_rows(ckpt, [a for a in arguments if "pipe" not in a], tmp_path, capsys)
    assert_same_rows([row for row in rows if row["id"] != str(pipe)], local)


def test_the_default_engine_never_imports_ray(tmp_path, ckpt):
    (tmp_path / "a.txt").write_text("Shares rose after profits beat forecasts.")
    script = (
        "import sys; from docclass.cli import main\n"
        f"main(['classify', '--ckpt', {str(ckpt)!r}, {str(tmp_path / 'a.txt')!r},"
        f" '--out', {str(tmp_path / 'rows.jsonl')!r}])\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'ray'], 'ray imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=WAIT_S)
    assert json.loads((tmp_path / "rows.jsonl").read_text())["label"]
