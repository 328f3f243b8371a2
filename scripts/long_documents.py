"""Full vs windowed self-attention as documents grow: `make long-documents`.

Training-step time and memory of the default block at 512 … 8,192 tokens (speed only; the
accuracy comparison is `python -m scripts.seeds` on configs/bbc-long.yaml vs truncation at 512).
"""

import argparse
import json
from pathlib import Path

from benchmarks.measures import attention_scaling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--out", default="reports/long-documents.json")
    args = parser.parse_args()
    figures = attention_scaling(args.lengths, window=args.window)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    for row in figures["rows"]:
        cells = [
            f"{name}: {row[name]['ms_per_step']} ms, +{row[name]['peak_mib']} MiB"
            for name in row
            if isinstance(row[name], dict)
        ]
        print(
            f"{row['tokens']:>5} tokens  "
            + "  ".join(cells)
            + f"  ratio {row['full / window time']}×"
        )


if __name__ == "__main__":
    main()
