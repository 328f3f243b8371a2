"""`make ray-classify`: documents/s of `classify --engine ray` (2 workers) ÷ single-process
`classify` on the same machine and the same Parquet corpora, one million short documents and
100,000 BBC-length ones; each worker's peak memory."""

import argparse
import json
import platform
import shutil
import tempfile
from pathlib import Path

import datasets
import torch

from benchmarks.ray_engine import compare_engines, planning_speed, write_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", default="reports/bbc/checkpoints/last.ckpt")
    parser.add_argument("--short", type=int, default=1_000_000, help="40-word documents")
    parser.add_argument("--long", type=int, default=100_000, help="whole BBC articles")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="reports/ray-classify.json")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    results = {
        "checkpoint": args.ckpt,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads available",
        "corpora": {},
    }
    for name, size, words in (("short", args.short, 40), ("long", args.long, None)):
        workdir = Path(tempfile.mkdtemp(prefix=f"ray-classify-{name}-"))
        try:
            corpus = workdir / "corpus.parquet"
            facts = write_corpus(corpus, size, words)
            figures = compare_engines(args.ckpt, corpus, workdir, args.workers)
            results["corpora"][name] = {**facts, **figures}
            if name == "short":
                results["planning_jsonl"] = planning_speed(corpus, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        run = results["corpora"][name]
        print(
            f"{name}: {run['documents']:,} documents (median {run['median_words']} words): "
            f"single process {run['single_process']['documents_per_s']} docs/s, "
            f"Ray × {args.workers} {run['ray']['documents_per_s']} docs/s → "
            f"{run['ray_over_single']}×; worker peak RSS {run['ray']['worker_peak_rss_mib']} MiB"
        )
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
