"""Padding cost of batching documents of mixed length on this machine: `make batching-speed`."""

import argparse
import json
from pathlib import Path

import datasets

from benchmarks.measures import batching_speed
from docclass.data.sources import SourceSpec, load_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--documents", type=int, default=400, help="BBC articles to run")
    parser.add_argument("--group", type=int, default=8, help="documents arriving together")
    parser.add_argument("--out", default="reports/batching-speed.json")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    texts = load_source(SourceSpec("bbc")).splits["train"]["text"][: args.documents]
    figures = batching_speed(args.ckpt, texts, group=args.group)
    Path(args.out).write_text(json.dumps(figures, indent=2))
    print(
        f"{figures['documents']} BBC articles ({figures['mean_tokens']} tokens on average) in "
        f"groups of {figures['group']}, {figures['torch_threads']} torch threads:"
    )
    for name, way in figures["ways"].items():
        print(
            f"  {name}: {way['documents_per_s']} docs/s "
            f"({way['speed_vs_one_at_a_time']}× one at a time)"
        )


if __name__ == "__main__":
    main()
