"""Plant label noise in a config's corpus and measure ``docclass audit`` on it:
``make label-audit`` (writes reports/label-audit.json / .md; about 20 minutes per noise rate
and flip seed for the BBC demo config on 2 CPU cores). Finished runs in --runs are reused.

Example:
    python -m scripts.label_audit --config configs/bbc.yaml --rates 0.05 0.1 0.2

With --ensemble RUNS RUNS…, nothing is trained: the noisy copies that every one of those runs
folders audited are scored on the mean of their out-of-sample probabilities (written to --out).
"""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.label_audit import (
    ensemble_markdown,
    ensemble_runs,
    label_audit_markdown,
    planted_noise,
)

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--config", default="configs/bbc.yaml")
parser.add_argument("--rates", nargs="+", type=float, default=[0.05, 0.1, 0.2])
parser.add_argument(
    "--seeds", nargs="+", type=int, default=[0], help="seeds of the flips (one audit each)"
)
parser.add_argument("--folds", type=int, default=5)
parser.add_argument("--runs", default="reports/label-audit-runs")
parser.add_argument("--out", default="reports/label-audit")
parser.add_argument("--ensemble", nargs="+", help="runs folders of other configs' audits")
args = parser.parse_args()
logging.basicConfig(level=logging.WARNING)
datasets.disable_progress_bars()
if args.ensemble:
    figures = ensemble_runs([Path(run) for run in args.ensemble])
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    out.with_suffix(".md").write_text(ensemble_markdown(figures))
    print(ensemble_markdown(figures))
    raise SystemExit(0)
figures = planted_noise(args.config, Path(args.runs), args.rates, args.seeds, args.folds)
out = Path(args.out)
out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
out.with_suffix(".md").write_text(label_audit_markdown(figures))
print(label_audit_markdown(figures))
