"""The after-fit report on a 70,000-document test split, capped vs whole: `make report-cap`."""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.measures import report_cap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--documents", type=int, default=70_000)
    parser.add_argument("--cap", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    figures = report_cap(args.ckpt, args.documents, cap=args.cap)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(
        f"{figures['documents']:,} documents: capped report ({figures['cap']}) "
        f"{figures['capped_report_s']:.0f} s; whole report estimated "
        f"{figures['uncapped_estimate_s'] / 3600:.1f} h → {args.out}"
    )


if __name__ == "__main__":
    main()
