"""Peak memory of `docclass classify` as the corpus grows: `make classify-memory`."""

import argparse
import json
from pathlib import Path

import datasets

from benchmarks.measures import classify_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--words", type=int, default=40, help="words per generated document")
    parser.add_argument("--out", default="reports/classify-memory.json")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    figures = classify_memory(args.ckpt, sorted(args.sizes), args.words)
    Path(args.out).write_text(json.dumps(figures, indent=2))
    for run in figures["runs"]:
        print(
            f"{run['documents']:>9,} documents → {run['rows_out']:,} rows in {run['seconds']} s "
            f"({run['documents_per_s']} docs/s), peak RSS {run['peak_rss_mib']} MiB"
        )


if __name__ == "__main__":
    main()
