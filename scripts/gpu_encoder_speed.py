"""Whole-document fine-tuning on a GPU: docclass's MiniLM against transformers'
BertForSequenceClassification on the same window rows, bf16, eager and under torch.compile:
real tokens/s, counted TFLOP/s and MFU (benchmarks/gpu_encoder.py). Prints the figures and
writes them as JSON.

Example (on a GPU machine):
    python -m scripts.gpu_encoder_speed --steps 10 --distinct_batches 1
"""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.gpu_encoder import gpu_encoder_speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16-mixed", choices=["32", "bf16-mixed"])
    parser.add_argument("--compile", default="true", choices=["true", "false"])
    parser.add_argument("--batch_tokens", nargs="+", type=int, default=[0],
                        help="padded tokens a batch may hold; 0: the config's own")  # fmt: skip
    parser.add_argument(
        "--distinct_batches", type=int, default=0,
        help="cycle the first N batches (1: one shape, one compile); 0: every batch its own",
    )  # fmt: skip
    parser.add_argument("--out", default="reports/gpu-encoder-speed.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    figures = {}
    for budget in args.batch_tokens:
        key = f"batch_tokens_{budget or 'config'}"

        def write(so_far, key=key):
            # Written after every mode: a run stopped at its time limit keeps what it measured.
            figures[key] = so_far
            print(json.dumps({key: so_far}, indent=1), flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")

        write(gpu_encoder_speed(
            args.config, args.steps, args.rounds, args.device, args.precision,
            args.compile == "true", budget, args.distinct_batches, write,
        ))  # fmt: skip


if __name__ == "__main__":
    main()
