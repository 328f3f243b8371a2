"""Spread of a config over seeds; extra ``docclass fit`` arguments go after ``--``.

python scripts/seeds.py configs/bbc.yaml --seeds 0 1 2 --out reports/seeds/bbc -- --model.n_layers 2
"""

import argparse
import json
import sys
from pathlib import Path

from docclass.seeds import run_seeds

argv = sys.argv[1:]
overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
own = argv[: argv.index("--")] if "--" in argv else argv
parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
)
parser.add_argument("config")
parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
parser.add_argument("--out", type=Path, required=True)
args = parser.parse_args(own)
summary = run_seeds(args.config, args.seeds, args.out, overrides)
print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
