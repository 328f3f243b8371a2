"""Plant label noise in a config's corpus and measure ``docclass audit`` on it:
``make label-audit`` (writes reports/label-audit.json / .md; about 20 minutes per noise rate
and flip seed for the BBC from-scratch config on 2 CPU cores). Finished runs in --runs are reused.

Example:
    python -m scripts.label_audit --config configs/bbc.yaml --rates 0.05 0.1 0.2

With --with_config CONFIG, every noisy copy is audited by that config too, then by the first
config with the two averaged (--with_audits), flagged by calibrated_count_by_self_confidence and
re-trained: each copy's folders audit, audit-<CONFIG's name> and audit-combined. Example:
    python -m scripts.label_audit --rates 0.1 0.2 --with_config configs/minilm-128.yaml \
        --out reports/label-audit-combined

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
from docclass.errors import UserError
from docclass.files import write_atomically

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--config", default="configs/bbc.yaml")
parser.add_argument("--rates", nargs="+", type=float, default=[0.05, 0.1, 0.2])
parser.add_argument(
    "--seeds", nargs="+", type=int, default=[0], help="seeds of the flips (one audit each)"
)
parser.add_argument("--folds", type=int, default=5)
parser.add_argument("--runs", default="reports/label-audit-runs")
parser.add_argument(
    "--out", help="reports/label-audit, or reports/label-audit-ensemble with --ensemble"
)
parser.add_argument(
    "--with_config",
    help="a second config (e.g. configs/minilm-128.yaml) that audits every noisy copy too; then "
    "--config's audit averaged with it, flagged by calibrated_count_by_self_confidence and "
    "re-trained (the three commands of docs/audit.md)",
)
parser.add_argument(
    "--ensemble", nargs="+", help="two or more runs folders: other configs' planted-noise audits"
)
args = parser.parse_args()
logging.basicConfig(level=logging.WARNING)
datasets.disable_progress_bars()
# Made before any training: a missing --out folder once ended a three-hour run at its last line.
out = Path(args.out or ("reports/label-audit-ensemble" if args.ensemble else "reports/label-audit"))
out.parent.mkdir(parents=True, exist_ok=True)
if args.ensemble:
    ignored = [f"--{name}" for name in ("config", "rates", "seeds", "folds", "runs", "with_config")
               if getattr(args, name) != parser.get_default(name)]  # fmt: skip
    if ignored:
        parser.error(f"--ensemble trains nothing, so {' '.join(ignored)} would be ignored: drop it")
    figures = ensemble_runs([Path(run) for run in args.ensemble])
    table = ensemble_markdown(figures)
else:
    if args.with_config and (
        Path(args.with_config).resolve() == Path(args.config).resolve()
        or Path(args.with_config).stem == "combined"
    ):
        # The same config twice would be averaged with itself; "combined" names the folder
        # of the combined audit.
        parser.error(f"--with_config {args.with_config}: give another config than --config, "
                     "not named combined.yaml")  # fmt: skip
    try:
        figures = planted_noise(
            args.config, Path(args.runs), args.rates, args.seeds, args.folds, args.with_config
        )
    except UserError as error:
        # One line, as docclass itself ends (a SIGTERM, a failed clean fit, a bad config): what
        # stopped and how to resume, where a traceback would bury it. A failed audit child and
        # the benchmark's own checks raise other errors and keep their tracebacks.
        parser.exit(2, f"label_audit: error: {error}\n")
    table = label_audit_markdown(figures)
write_atomically(out.with_suffix(".json"), json.dumps(figures, indent=2) + "\n")
write_atomically(out.with_suffix(".md"), table)
print(table)
