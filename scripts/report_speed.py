"""Time the HTML report (all word-score methods) of a split: `make report-speed`.

Prints the figures and writes them as JSON. The README quotes them.
"""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.measures import time_report
from docclass.inference.reporting import CONFIG_SUFFIXES
from docclass.train.lightning_cli import report_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--data", required=True, help="config (its split) or data source")
    parser.add_argument("--split", default="test")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="reports/report-speed.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    # The report as the config's own after-fit report makes it (its faithfulness sample).
    sample = None
    if Path(args.data).suffix.lower() in CONFIG_SUFFIXES:
        sample = report_settings(args.data)["report_faithfulness_documents"]
    figures = time_report(
        args.ckpt, args.data, args.split, args.repeats, faithfulness_documents=sample
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2))
    print(
        f"{figures['documents']} documents: explain {figures['median_explain_s']} s + "
        f"faithfulness ({figures['faithfulness_documents']} documents) "
        f"{figures['median_faithfulness_s']} s + counterfactuals and agreement "
        f"{figures['median_counterfactuals_and_agreement_s']} s + pages "
        f"{figures['median_pages_s']} s = {figures['median_total_s']} s (median of "
        f"{figures['repeats']}; load {figures['load_s']} s) → {args.out}"
    )


if __name__ == "__main__":
    main()
