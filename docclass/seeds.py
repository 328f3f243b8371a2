"""Train one config under several seeds and report the spread: one lucky run proves nothing.

Each seed runs ``docclass fit`` in its own process (a clean state per run) into
``<out>/seed<N>/``; the summary with mean, min and max of validation and test metrics goes to
``<out>/seeds.json`` and is printed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from docclass.callbacks import machine_summary


def summarise(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def run_seeds(config: str, seeds: list[int], out: Path, overrides: list[str]) -> dict:
    """Fit ``config`` once per seed and collect each run's ``metrics.json``."""
    runs = []
    for seed in seeds:
        run_dir = out / f"seed{seed}"
        command = [
            sys.executable,
            "-m",
            "docclass.cli",
            "fit",
            "--config",
            config,
            "--seed_everything",
            str(seed),
            "--data.seed",
            str(seed),
            "--trainer.default_root_dir",
            str(run_dir),
            "--trainer.enable_progress_bar",
            "false",
            *overrides,
        ]
        started = time.perf_counter()
        subprocess.run(command, check=True)
        metrics = json.loads((run_dir / "metrics.json").read_text())
        runs.append(
            {
                "seed": seed,
                "val_acc": metrics["val"].get("acc"),
                "test_acc": metrics["test"]["accuracy"],
                "test_macro_f1": metrics["test"]["macro_f1"],
                "train_time_s": metrics["train_time_s"],
                "wall_s": time.perf_counter() - started,
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    summary = {
        "config": config,
        "machine": machine_summary(),
        "overrides": overrides,
        "runs": runs,
        **{
            key: summarise([r[key] for r in runs])
            for key in ("val_acc", "test_acc", "test_macro_f1", "train_time_s")
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "seeds.json").write_text(json.dumps(summary, indent=2))
    return summary
