"""Train one config under several seeds and report the spread: one lucky run proves nothing.

Each seed runs ``docclass fit`` in its own process (a clean state per run) into
``<out>/seed<N>/``; the summary with mean, sd, min and max of validation and test metrics is
returned (and written by ``python -m scripts.seeds``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from docclass.train.callbacks import machine_summary

SUMMARISED = ("val_acc", "test_acc", "test_macro_f1", "train_time_s")


def summarise(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def run_record(seed: int, run_dir: Path, wall_s: float | None) -> dict:
    """One seed's figures, read from the ``metrics.json`` its run wrote."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {
        "seed": seed,
        "val_acc": metrics["val"].get("acc"),
        "test_acc": metrics["test"]["accuracy"],
        "test_macro_f1": metrics["test"]["macro_f1"],
        "train_time_s": metrics["train_time_s"],
        "wall_s": wall_s,
    }


def run_seeds(
    config: str, seeds: list[int], out: Path, overrides: list[str], reuse: bool = False
) -> dict:
    """Fit ``config`` once per seed and collect each run's figures.

    With ``reuse``, a seed whose run folder already holds a ``metrics.json`` is not trained
    again (for adding seeds to a finished sweep; the caller vouches the settings are the same),
    and one that was stopped after an epoch resumes from its ``checkpoints/last.ckpt`` instead of
    starting over (a whole-document MiniLM run lasts most of an hour). A resumed run's
    ``train_time_s`` covers only its last part; its record says ``resumed``.
    """
    runs = []
    for seed in seeds:
        run_dir = out / f"seed{seed}"
        if reuse and (run_dir / "metrics.json").is_file():
            runs.append(run_record(seed, run_dir, None))
            continue
        command = [
            sys.executable, "-m", "docclass.cli", "fit", "--config", config,
            "--seed_everything", str(seed), "--data.seed", str(seed),
            "--trainer.default_root_dir", str(run_dir),
            "--trainer.enable_progress_bar", "false",
            *overrides,
        ]  # fmt: skip
        last = run_dir / "checkpoints" / "last.ckpt"
        resumed = reuse and last.is_file()
        if resumed:
            command += ["--ckpt_path", str(last)]
        started = time.perf_counter()
        subprocess.run(command, check=True)
        runs.append(
            {**run_record(seed, run_dir, time.perf_counter() - started), "resumed": resumed}
        )
        print(json.dumps(runs[-1]), flush=True)
    return {
        "config": config,
        "overrides": overrides,
        "machine": machine_summary(),
        "runs": runs,
        **{key: summarise([r[key] for r in runs]) for key in SUMMARISED},
    }
