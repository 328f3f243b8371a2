"""Spread of a config over seeds; extra ``docclass fit`` arguments go after ``--``.

Example:
    python -m scripts.seeds configs/bbc.yaml --seeds 0 1 2 --out reports/seeds/bbc \\
        --summary reports/bbc-seeds.json -- --model.n_layers 2
"""

import argparse
import json
import sys
from pathlib import Path

from benchmarks.seeds import run_seeds

argv = sys.argv[1:]
overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
own = argv[: argv.index("--")] if "--" in argv else argv
parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
)
parser.add_argument("config")
parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
parser.add_argument("--out", type=Path, required=True, help="folder for the runs")
parser.add_argument("--summary", type=Path, help="also write the summary JSON here")
parser.add_argument("--reuse", action="store_true", help="keep seeds already run under --out")
args = parser.parse_args(own)
summary = run_seeds(args.config, args.seeds, args.out, overrides, reuse=args.reuse)
if args.summary:
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
