"""Training tokens/s, counted FLOPs and MFU of a config's model on a GPU, and predict() speed
(benchmarks/training_flops.py). Prints the figures and writes them as JSON.

Example (on a GPU machine):
    python -m scripts.gpu_speed --config configs/bbc.yaml --ckpt RUN/checkpoints/last.ckpt
"""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.throughput import load_config_datamodule
from benchmarks.training_flops import predict_speed, training_flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/bbc.yaml")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=0, help="0: the config's")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16-mixed", choices=["32", "bf16-mixed"])
    parser.add_argument("--ckpt", help="also time predict() with this model")
    parser.add_argument("--out", default="reports/gpu-speed.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    datamodule, model_section = load_config_datamodule(args.config)
    figures = {"config": args.config}
    figures |= training_flops(
        datamodule, model_section, args.steps, args.batch_size, args.device, args.precision
    )
    if args.ckpt:
        texts = [t for split in ("val", "test") for t in datamodule.splits[split]["text"]]
        figures["predict"] = predict_speed(args.ckpt, texts, args.device)
    print(json.dumps(figures, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
