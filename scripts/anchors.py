"""TF-IDF + linear SVM accuracy on docclass's de-duplicated BBC splits.

Example:
    python -m scripts.anchors --split-seeds 0 1 --out reports/bbc-anchors.json
"""

import argparse
import json
import logging
from pathlib import Path

from benchmarks.anchors import tfidf_svm_anchor
from docclass.data.tokenizer import TokenizerSpec
from docclass.train.callbacks import machine_summary
from docclass.train.datamodule import DocDataModule

parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
)
parser.add_argument("--split-seeds", type=int, nargs="+", default=[0, 1])
parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
args = parser.parse_args()
logging.basicConfig(level=logging.WARNING)
results = {"machine": machine_summary(), "tfidf_linear_svm": {}}
for split_seed in args.split_seeds:
    # The tokenizer is irrelevant to the anchor; a small one keeps set-up quick.
    datamodule = DocDataModule(
        source="bbc", split_seed=split_seed, tokenizer=TokenizerSpec(vocab_size=500)
    )
    figures = tfidf_svm_anchor(datamodule)
    results["tfidf_linear_svm"][f"split_seed_{split_seed}"] = figures
    print(f"split_seed {split_seed}: " + json.dumps(figures))
if args.out:
    args.out.write_text(json.dumps(results, indent=2) + "\n")
