"""Calibrate every trained run of a sweep and tabulate ECE, Brier and NLL before and after:
``make calibration`` (after ``make corpora``; writes each run's calibration.json and
reports/calibration.json / .md).

Example:
    python -m scripts.calibration --runs reports/corpora-runs reports/bbc --out reports/calibration
"""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.calibration import calibrate_run, calibration_markdown, summarise

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument(
    "--runs", nargs="+", default=["reports/corpora-runs"],
    help="run folders, or folders holding <corpus>/<candidate>/seed*/ run folders",
)  # fmt: skip
parser.add_argument("--out", default="reports/calibration")
parser.add_argument(
    "--reuse", action="store_true", help="read the calibrations already stored for the weights"
)
args = parser.parse_args()
logging.basicConfig(level=logging.WARNING)
datasets.disable_progress_bars()
folders = []
for root in map(Path, args.runs):
    found = [root] if (root / "metrics.json").is_file() else sorted(root.glob("*/*/seed*"))
    folders += [folder for folder in found if (folder / "metrics.json").is_file()]
runs = []
for folder in folders:
    runs.append(calibrate_run(folder, reuse=args.reuse))
    print(runs[-1].get("skipped") or f"{folder}: T = {runs[-1]['temperature']:.3f}", flush=True)
summary = summarise(runs)
out = Path(args.out)
out.parent.mkdir(parents=True, exist_ok=True)
# Each run's scores before and after, without the diagram's bins (in its calibration.json).
compact = [
    {
        **run,
        **{
            split: {key: run[split][key] for key in ("before", "after", "ece_if_calibrated")}
            for split in ("validation", "test")
            if split in run
        },
    }
    for run in runs
]
figures = {"summary": summary, "runs": compact}
out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
out.with_suffix(".md").write_text(calibration_markdown(summary))
print(calibration_markdown(summary))
