"""docclass's recommended configs against TF-IDF + LinearSVC, corpus by corpus: `make corpora`.

Trains every candidate config under every seed on BBC and on each development corpus found
(plus folders given with --folder), recommends the one candidate with the best validation
accuracy averaged over the corpora, and writes reports/corpora.json and reports/corpora.md.
Runs already finished in --runs are reused, so an interrupted sweep continues where it stopped;
with --candidates, the other candidates' figures are carried over from the earlier --out JSON
(and marked so in the table).
"""

import argparse
import json
import logging
from pathlib import Path

import datasets

from benchmarks.corpora import (
    CANDIDATES,
    carry_over,
    choose_on_validation,
    compare_on_corpus,
    corpora_markdown,
    development_corpora,
    recommended_beats_svm,
)
from docclass.train.callbacks import machine_summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--datasets", default="../shared/datasets")
    parser.add_argument("--folder", action="append", default=[], help="another corpus folder")
    parser.add_argument("--only", nargs="*", help="corpus names to run (default: all found)")
    parser.add_argument("--candidates", nargs="*", choices=list(CANDIDATES))
    parser.add_argument("--runs", default="reports/corpora-runs")
    parser.add_argument("--out", default="reports/corpora")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()
    corpora = {"bbc": "bbc", **development_corpora(Path(args.datasets))}
    if not Path(args.datasets).is_dir():
        print(f"{args.datasets} not found: BBC and --folder corpora only")
    corpora.update({Path(folder).name: folder for folder in args.folder})
    if args.only:
        corpora = {name: source for name, source in corpora.items() if name in args.only}
    candidates = {c: CANDIDATES[c] for c in (args.candidates or CANDIDATES)}
    out = Path(args.out)
    earlier = (
        json.loads(out.with_suffix(".json").read_text()).get("corpora", {})
        if out.with_suffix(".json").is_file()
        else {}
    )
    figures = {"seeds": args.seeds, "machine": machine_summary(), "corpora": {}}
    # Corpora measured earlier and not run now stay in the table, every sweep marked as earlier
    # (and dropped where its candidate now means another config).
    figures["corpora"].update(
        {n: carry_over({**r, "candidates": {}}, r) for n, r in earlier.items() if n not in corpora}
    )
    for name, source in corpora.items():
        result = compare_on_corpus(name, source, args.seeds, Path(args.runs), candidates)
        figures["corpora"][name] = carry_over(result, earlier.get(name))
        # Chosen again over every corpus measured so far: one recipe for all of them.
        figures["recommended"] = choose_on_validation(figures["corpora"])
        for result in figures["corpora"].values():
            result["recommended"] = figures["recommended"]
            result["recommended_beats_svm"] = recommended_beats_svm(result)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
        out.with_suffix(".md").write_text(corpora_markdown(figures))
        print(corpora_markdown({"corpora": {name: figures["corpora"][name]}}), flush=True)


if __name__ == "__main__":
    main()
