"""Measurements the README quotes, run by thin scripts in ``scripts/`` (never by unit tests)."""

from __future__ import annotations

import json
import resource
import statistics
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


def batching_speed(ckpt: str, texts: list[str], group: int = 8, repeats: int = 3) -> dict[str, Any]:
    """Forward passes per second for groups of ``group`` documents, three ways, interleaved.

    ``one at a time``: a forward pass per document; ``one padded batch``: the group padded to
    its longest; ``length_batches``: the group split into batches of similar length. The
    groups are what a server sees: consecutive documents of mixed length.
    """
    import torch

    from docclass.checkpoint import load_classifier
    from docclass.model import length_batches, pad_token_ids
    from docclass.tokenizer import encode_batch

    classifier = load_classifier(ckpt)
    model = classifier.model.eval()
    limit = classifier.max_tokens
    ids = [e.ids[:limit] if limit else e.ids for e in encode_batch(classifier.tokenizer, texts)]
    ids = [row for row in ids if row]
    groups = [ids[i : i + group] for i in range(0, len(ids) - group + 1, group)]
    pad_id = model.config.pad_id

    def run(batches_of: Any) -> None:
        for rows in groups:
            for batch in batches_of(rows):
                model(*pad_token_ids(batch, pad_id))

    ways = {
        "one at a time": lambda rows: [[row] for row in rows],
        "one padded batch": lambda rows: [rows],
        "length_batches": lambda rows: [
            [rows[i] for i in g] for g in length_batches([len(r) for r in rows], len(rows))
        ],
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    with torch.inference_mode():
        run(ways["one padded batch"])  # warm-up
        for _ in range(repeats):
            for name, batches_of in ways.items():
                started = time.perf_counter()
                run(batches_of)
                seconds[name].append(time.perf_counter() - started)
    n_documents = len(groups) * group
    baseline = statistics.median(seconds["one at a time"])
    return {
        "checkpoint": ckpt,
        "documents": n_documents,
        "group": group,
        "mean_tokens": round(sum(len(r) for g in groups for r in g) / n_documents, 1),
        "torch_threads": torch.get_num_threads(),
        "ways": {
            name: {
                "documents_per_s": round(n_documents / statistics.median(times), 1),
                "speed_vs_one_at_a_time": round(baseline / statistics.median(times), 2),
            }
            for name, times in seconds.items()
        },
    }
