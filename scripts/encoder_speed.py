"""docclass's encoder beside transformers' BertForSequenceClassification on the same MiniLM
weights and batches (the 128-token config: transformers' BERT reads at most 512 positions), and
docclass's whole-document windows in length groups against one padding: `make encoder-speed`.
Prints the figures and writes them as JSON."""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.encoder_speed import encoder_speed, window_grouping_speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/minilm-128.yaml")
    parser.add_argument("--windows_config", default="configs/minilm.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="reports/encoder-speed.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    figures = encoder_speed(args.config, args.steps, args.rounds)
    windows = window_grouping_speed(args.windows_config, args.steps, args.rounds)
    figures["windows"] = windows
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    for kind in ("training", "inference"):
        speeds = figures[f"{kind}_real_tokens_per_s"]
        listed = ", ".join(f"{name} {value:,.0f}" for name, value in speeds.items())
        ratio = figures[f"{kind}_ratio_docclass_over_transformers"]
        print(f"{kind} real tokens/s ({figures['threads']} threads): {listed}; ratio {ratio}")
    slots = windows["slots_per_real_token"]
    for kind in ("training", "inference"):
        speeds = windows[f"{kind}_real_tokens_per_s"]
        listed = ", ".join(f"{name} {value:,.0f}" for name, value in speeds.items())
        ratio = windows[f"{kind}_ratio_groups_over_one_padding"]
        print(f"whole documents, {kind} real tokens/s: {listed}; ratio {ratio}")
    print(f"window-row slots per real token: {slots}")


if __name__ == "__main__":
    main()
