"""ERASER comprehensiveness / sufficiency (AOPC) of every word-score method: `make faithfulness`.

Removal by dropping words' tokens from the attention mask, and by replacing them with [UNK];
a random ranking (5 seeds) is the floor. Higher comprehensiveness and lower sufficiency are
more faithful.
"""

import argparse
import json
import logging
import time
from pathlib import Path

import datasets

from docclass.checkpoint import load_classifier
from docclass.explain import explain_documents
from docclass.faithfulness import FRACTIONS, faithfulness_table
from docclass.reporting import load_documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--data", default="configs/bbc.yaml")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", default="reports/faithfulness-bbc.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    classifier = load_classifier(args.ckpt)
    documents = load_documents(args.data, args.ckpt, args.split)
    texts = list(documents.texts)[: args.limit]
    records = explain_documents(classifier, texts)
    figures = {"checkpoint": args.ckpt, "data": documents.description, "documents": len(texts),
               "fractions": list(FRACTIONS), "random_seeds": 5, "removal": {}}  # fmt: skip
    for removal in ("mask", "unk"):
        started = time.perf_counter()
        table = faithfulness_table(classifier, texts, records, removal=removal)
        figures["removal"][removal] = {"seconds": round(time.perf_counter() - started, 1),
                                       "aopc": table}  # fmt: skip
        print(f"removal by {removal} ({figures['removal'][removal]['seconds']} s):")
        floor = table["random"]["comprehensiveness"]
        for name, row in sorted(table.items(), key=lambda kv: -kv[1]["comprehensiveness"]):
            print(
                f"  {name:16s} comprehensiveness {row['comprehensiveness']:.3f} "
                f"({row['comprehensiveness'] / floor:.0f}× random)  "
                f"sufficiency {row['sufficiency']:.3f}"
            )
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
