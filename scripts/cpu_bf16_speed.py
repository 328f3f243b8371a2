"""`make cpu-bf16-speed`: a held-block run's training parts in float32 and in bf16 on this CPU,
side by side in one run (benchmarks/cpu_bf16.py). Prints the figures and writes them as JSON."""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.cpu_bf16 import cpu_bf16_speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="reports/cpu-bf16-speed.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    figures = cpu_bf16_speed(args.config, args.steps, args.rounds)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    print(
        f"{figures['batches']} batches, {figures['real_tokens']:,} real tokens, "
        f"{figures['threads']} threads, native bf16: {figures['native_cpu_bf16']}"
    )
    for part, medians in figures["median_seconds"].items():
        print(
            f"{part}: float32 {medians['float32']} s, bf16 {medians['bf16']} s "
            f"(x{figures['speedup_bf16'][part]})"
        )
    steps = figures["median_seconds"]["training_steps"]
    print(
        f"training steps with the attention in bf16 too: {steps['bf16, attention in bf16']} s "
        f"(the float32 attention x{figures['speedup_float32_attention_in_bf16_steps']})"
    )
    print(f"bf16 states' relative error: {figures['bf16_state_relative_error']}")


if __name__ == "__main__":
    main()
