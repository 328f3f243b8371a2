"""Measurements the README quotes, run by thin scripts in ``scripts/`` (never by unit tests)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from docclass.sources import SourceSpec, load_source


def write_generated_corpus(path: Path, n_documents: int, words_per_document: int) -> None:
    """A JSONL corpus of ``n_documents`` made by cycling through BBC article openings."""
    texts = load_source(SourceSpec("bbc")).splits["train"]["text"]
    openings = [" ".join(text.split()[:words_per_document]) for text in texts]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(n_documents):
            handle.write(json.dumps({"text": openings[i % len(openings)]}) + "\n")


def classify_memory(
    ckpt: str, sizes: list[int], words_per_document: int = 40, batch_size: int = 64
) -> dict[str, Any]:
    """Peak resident memory of ``docclass classify`` over generated corpora of each size.

    Each size runs in a fresh process (``getrusage`` of children gives its peak RSS), so the
    figures are comparable: flat memory means the peak does not grow with the corpus.
    """
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        for size in sizes:
            corpus = Path(workdir) / f"corpus-{size}.jsonl"
            write_generated_corpus(corpus, size, words_per_document)
            out = Path(workdir) / "out.jsonl"
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "docclass.cli", "classify", "--ckpt", ckpt, str(corpus),
                 "--out", str(out), "--device", "cpu", "--batch-size", str(batch_size),
                 "--no-progress"],
                check=True,
                capture_output=True,
            )  # fmt: skip
            seconds = time.perf_counter() - started
            peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            with open(out, encoding="utf-8") as handle:
                rows = sum(1 for _ in handle)
            runs.append(
                {
                    "documents": size,
                    "rows_out": rows,
                    "seconds": round(seconds, 1),
                    "documents_per_s": round(size / seconds, 1),
                    # ru_maxrss of children is the maximum over all of them so far; sizes run in
                    # increasing order, so a flat pipeline shows the same figure every time.
                    "peak_rss_mib": round(peak_kib / 1024, 1),
                    "peak_grew": peak_kib > before,
                }
            )
            corpus.unlink()
    return {"checkpoint": ckpt, "words_per_document": words_per_document, "runs": runs}
