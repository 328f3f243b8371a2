"""docclass beside nn.TransformerEncoder and two classic anchors, in one run: `make bench`.

Writes reports/bench.json and reports/bench.md (the README quotes the tables).
"""

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path

import datasets

from benchmarks.throughput import (
    bench_markdown,
    classic_anchors,
    inference_throughput,
    load_config_datamodule,
    training_throughput,
)
from docclass.train.callbacks import machine_summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/bbc.yaml")
    parser.add_argument("--ckpt", help="trained checkpoint for the inference figures")
    parser.add_argument("--seeds-summary", default="reports/bbc-seeds.json")
    parser.add_argument("--steps", type=int, default=8, help="optimiser steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="32", choices=["32", "bf16-mixed"])
    parser.add_argument("--out", default="reports/bench")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    started = time.perf_counter()
    datamodule, model_section = load_config_datamodule(args.config)
    figures = {
        "command": "python -m scripts.bench " + shlex.join(sys.argv[1:]),
        "machine": machine_summary(),
        "config": args.config,
        "rounds": args.rounds,
    }
    figures["training"] = training_throughput(
        datamodule, model_section, args.steps, args.rounds, args.device, args.precision
    )
    print(json.dumps(figures["training"]["contenders"], indent=1))
    if args.ckpt:
        texts = list(datamodule.splits["val"]["text"]) + list(datamodule.splits["test"]["text"])
        figures["inference"] = inference_throughput(
            args.ckpt, texts, args.rounds, device=args.device
        )
        print(json.dumps(figures["inference"], indent=1))
    anchors = []
    seeds = Path(args.seeds_summary)
    if seeds.is_file():
        summary = json.loads(seeds.read_text())
        test, train_s = summary["test_acc"], summary["train_time_s"]
        anchors.append(
            {
                "model": f"docclass ({args.config}, {len(summary['runs'])} seeds, mean ± sd)",
                "test_acc": f"{test['mean']:.3f} ± {test['std']:.3f}",
                "train": f"{train_s['mean']:.0f} s",
                "documents_per_s": figures.get("inference", {})
                .get("ways", {})
                .get("labels and probabilities", {})
                .get("documents_per_s", "—"),
            }
        )
    classic = classic_anchors(datamodule)
    for row in classic:
        anchors.append(
            {
                "model": row["model"],
                "test_acc": f"{row['test_acc']:.3f}",
                "train": f"{row['fit_s']:.1f} s",
                "documents_per_s": row["documents_per_s"],
            }
        )
    figures["tfidf_svm"] = classic[0]["figures"]
    if len(classic) > 1:
        figures["fasttext"] = classic[1]["figures"]
    figures["anchors"] = anchors
    figures["total_s"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    out.with_suffix(".md").write_text(bench_markdown(figures))
    print(bench_markdown(figures))


if __name__ == "__main__":
    main()
