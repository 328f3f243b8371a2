"""Documents/s of ``classify --engine ray`` against single-process ``classify``, in one run."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from docclass.data.sources import SourceSpec, load_source
from docclass.inference.ray_classify import SUMMARY_FILE, build_plan

ROW_GROUP = 10_000


def write_corpus(path: Path, n_documents: int, words: int | None) -> dict[str, Any]:
    """A Parquet corpus cycling through BBC training articles: their first ``words`` words, or
    whole (``None``). Row groups of 10,000 let the Ray engine cut it into parts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = load_source(SourceSpec("bbc")).splits["train"]["text"]
    if words is not None:
        texts = [" ".join(text.split()[:words]) for text in texts]
    column = [texts[i % len(texts)] for i in range(n_documents)]
    pq.write_table(pa.table({"text": column}), path, row_group_size=ROW_GROUP)
    lengths = sorted(len(text.split()) for text in column[: len(texts)])
    return {"documents": n_documents, "median_words": lengths[len(lengths) // 2]}


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds and the process's own peak resident memory (MiB): Linux's VmHWM, read
    while it runs. It starts afresh at exec, unlike ``getrusage``, whose figure for a child
    includes this benchmark's own memory at the fork."""
    with tempfile.TemporaryFile("w+") as log:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        peak = 0.0
        while process.poll() is None:
            peak = max(peak, _vm_hwm_mib(process.pid))
            time.sleep(0.2)
        seconds = time.perf_counter() - started
        if process.returncode:
            log.seek(0)
            raise RuntimeError(f"{command[:6]} failed:\n{log.read()[-3000:]}")
    return seconds, peak


def _vm_hwm_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def planning_speed(corpus: Path, workdir: Path) -> dict[str, Any]:
    """How fast the driver plans a JSON Lines file (its one full read of an input)."""
    import pyarrow.parquet as pq

    jsonl = workdir / "corpus.jsonl"
    with open(jsonl, "w", encoding="utf-8") as handle:
        for text in pq.read_table(corpus, columns=["text"])["text"].to_pylist():
            handle.write(json.dumps({"text": text}) + "\n")
    size = jsonl.stat().st_size
    started = time.perf_counter()
    plan = build_plan([str(jsonl)], "text", {})
    seconds = time.perf_counter() - started
    jsonl.unlink()
    return {
        "jsonl_mb": round(size / 1e6, 1),
        "shards": len(plan["shards"]),
        "seconds": round(seconds, 2),
        "mb_per_s": round(size / 1e6 / seconds),
    }


def compare_engines(
    ckpt: str, corpus: Path, workdir: Path, workers: int, batch_size: int = 64
) -> dict[str, Any]:
    """Classify ``corpus`` once in one process and once on a local Ray of ``workers`` workers
    (one torch thread each), from fresh processes, and count every row out."""
    import pyarrow.parquet as pq

    documents = pq.ParquetFile(corpus).metadata.num_rows
    base = [sys.executable, "-m", "docclass.cli", "classify", "--ckpt", ckpt, str(corpus),
            "--batch_size", str(batch_size), "--progress", "false"]  # fmt: skip
    single_out = workdir / "single.jsonl"
    single_s, single_rss = timed([*base, "--out", str(single_out), "--device", "cpu"])
    with open(single_out, encoding="utf-8") as handle:
        single_rows = sum(1 for _ in handle)
    parts = workdir / "parts"
    ray_s, driver_rss = timed(
        [*base, "--engine", "ray", "--out", str(parts), "--workers", str(workers)]
    )
    summary = json.loads((parts / SUMMARY_FILE).read_text())
    ray_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in parts.glob("part-*.parquet"))
    return {
        "documents": documents,
        "single_process": {
            "seconds": round(single_s, 1),
            "documents_per_s": round(documents / single_s, 1),
            "rows_out": single_rows,
            "peak_rss_mib": round(single_rss, 1),
        },
        "ray": {
            "workers": workers,
            "seconds": round(ray_s, 1),
            "documents_per_s": round(documents / ray_s, 1),
            "rows_out": ray_rows,
            "part_files": summary["shards"],
            "worker_peak_rss_mib": sorted(summary["worker_peak_rss_mib"].values()),
            "driver_peak_rss_mib": round(driver_rss, 1),
        },
        "ray_over_single": round(single_s / ray_s, 3),
    }
