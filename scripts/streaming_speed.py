"""The streamed training path beside the in-memory one on BBC: `make streaming-speed`."""

import argparse
import json
from pathlib import Path

import datasets

from benchmarks.measures import streaming_speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/bbc.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="reports/streaming-speed.json")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    figures = streaming_speed(args.config, rounds=args.rounds)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{figures['train_documents']} BBC training documents in {figures['shards']} shards:")
    for name, row in figures["ways"].items():
        print(
            f"  {name}: padding efficiency {row['padding_efficiency']:.3f}, one epoch read in "
            f"{row['epoch_read_s']} s, training {row['train_real_tokens_per_s']:,} real tokens/s "
            f"({row['train_speed_vs_in_memory']}× in memory)"
        )
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
