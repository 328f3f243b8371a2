"""CPU inference options for ``classify`` beside TF-IDF + SVM and fastText, in one run:
``make inference-options`` → reports/inference-options.json and .md.

Example:
    python -m scripts.inference_options --ckpt reports/bbc/checkpoints/last.ckpt
"""

import argparse
import json
import logging
import time
from pathlib import Path

import datasets

from benchmarks.throughput import (
    BEFORE_PREDICT,
    classic_anchors,
    encoder_batching_speed,
    inference_options,
    inference_throughput,
    load_config_datamodule,
)
from docclass.train.callbacks import machine_summary


def markdown(figures: dict) -> str:
    lines = [
        "# CPU inference options",
        "",
        f"Machine: {figures['machine']['processor']}, {figures['machine']['cpu_count']} CPU "
        f"cores, torch {figures['machine']['torch']}. {figures['options']['documents']} BBC "
        "validation + test articles, batches of 64, median of interleaved rounds.",
        "",
        "| way | documents/s | speed ÷ before | accuracy | largest probability change |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in figures["options"]["options"].items():
        lines.append(
            f"| docclass model call, {name} | {row['documents_per_s']} | "
            f"{row['speed_vs_before']}× | {row['accuracy']:.4f} | "
            f"{row['max_probability_difference']:.1e} |"
        )
    ways = figures["classify"]["ways"]
    before_s = 1 / ways[BEFORE_PREDICT]["documents_per_s"]
    for name, row in ways.items():
        speed = round(before_s * row["documents_per_s"], 2)
        lines.append(f"| docclass predict(), {name} | {row['documents_per_s']} | {speed}× | | |")
    encoder = figures["encoder"]
    for name, row in encoder["ways"].items():
        lines.append(
            f"| MiniLM recipe ({encoder['config']}, {encoder['max_tokens']} tokens) model call, "
            f"{name} | {row['documents_per_s']} | {row['speed_vs_before']}× | | |"
        )
    for row in figures["anchors"]:
        lines.append(
            f"| {row['model']} | {row['documents_per_s']:.1f} | | {row['test_acc']:.4f} | |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", default="reports/bbc/checkpoints/last.ckpt")
    parser.add_argument("--config", default="configs/bbc.yaml")
    parser.add_argument("--encoder_config", default="configs/minilm.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="reports/inference-options")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    started = time.perf_counter()
    datamodule, _ = load_config_datamodule(args.config)
    names = datamodule.label_names
    splits = [datamodule.splits["val"], datamodule.splits["test"]]
    texts = [text for split in splits for text in split["text"]]
    labels = [names[label] for split in splits for label in split["label"]]
    figures = {"machine": machine_summary(), "ckpt": args.ckpt}
    figures["options"] = inference_options(args.ckpt, texts, labels, args.rounds)
    print(json.dumps(figures["options"], indent=1), flush=True)
    figures["classify"] = inference_throughput(args.ckpt, texts, args.rounds)
    figures["encoder"] = encoder_batching_speed(args.encoder_config, args.rounds)
    anchors = [
        {key: row[key] for key in ("model", "test_acc", "documents_per_s")}
        for row in classic_anchors(datamodule)
    ]
    figures["anchors"] = anchors
    figures["total_s"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(figures))
    print(markdown(figures))


if __name__ == "__main__":
    main()
