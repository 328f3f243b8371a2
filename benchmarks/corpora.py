"""docclass's recommended configs against TF-IDF + LinearSVC on several corpora, same splits.

For every corpus (the embedded BBC News, each folder of ``train/val/test.jsonl`` in the
development-corpora folder when present, and any folder given), each candidate config is
trained under every seed in its own process; the SVM is fitted on the very split the
DataModule made (de-duplicated, same documents). The recommended config is one candidate for
every corpus, the one with the best **validation** accuracy averaged over the corpora; its test
figures are the ones held against the SVM. Test figures never choose.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.anchors import tfidf_svm_anchor
from benchmarks.seeds import run_seeds
from docclass.train.lightning_cli import datamodule_from_config

# Candidates: a name, a config, and overrides that fit it to a corpus's document length.
CANDIDATES = {
    "from scratch": ("configs/bbc.yaml", []),
    "MiniLM 128": ("configs/minilm-128.yaml", []),
    "MiniLM whole": ("configs/minilm.yaml", []),
    # make demo's recipe: whole documents, the lowest five blocks held and cached, 2 epochs.
    "MiniLM demo": ("configs/demo.yaml", []),
}


def corpus_overrides(source: str) -> list[str]:
    """Point a config at a corpus: the embedded BBC needs nothing, a folder its files."""
    if source == "bbc":
        return []
    return [
        "--data.source", source, "--data.val_split", "validation",
        "--data.text_column", "text", "--data.label_column", "label",
    ]  # fmt: skip


def svm_on_split(config: str, overrides: list[str]) -> dict[str, Any]:
    """TF-IDF + LinearSVC on the split the config's DataModule makes (accuracy and macro-F1)."""
    datamodule = datamodule_from_config(config, overrides)
    figures = tfidf_svm_anchor(datamodule)
    figures["documents"] = {s: len(datamodule.splits[s]) for s in ("train", "val", "test")}
    figures["classes"] = datamodule.num_classes
    return figures


def compare_on_corpus(
    name: str,
    source: str,
    seeds: list[int],
    out: Path,
    candidates: dict[str, tuple[str, list[str]]] = CANDIDATES,
) -> dict[str, Any]:
    """Every candidate under every seed, the SVM, and the candidate validation picks."""
    data = corpus_overrides(source)
    result: dict[str, Any] = {"source": source, "svm": svm_on_split("configs/bbc.yaml", data)}
    result["candidates"] = {}
    for label, (config, extra) in candidates.items():
        started = time.perf_counter()
        # The after-fit report is not what is measured here; it would add minutes per run.
        overrides = [*data, *extra, "--report_after_fit", "false"]
        sweep = run_seeds(config, seeds, out / name / _slug(label), overrides, reuse=True)
        sweep["wall_s"] = time.perf_counter() - started
        result["candidates"][label] = sweep
    return result


def carry_over(
    result: dict[str, Any],
    earlier: dict[str, Any] | None,
    candidates: dict[str, tuple[str, list[str]]] = CANDIDATES,
) -> dict[str, Any]:
    """``result`` with the sweeps of candidates not run now taken from an earlier
    ``corpora.json``'s entry for the same corpus, marked ``carried_over``: a sweep of hours is
    not repeated for a candidate whose config did not change. A sweep is carried only under
    its own candidate's current config: figures of a candidate since renamed,
    removed or pointed at another config are dropped, never shown under its name."""
    for label, sweep in ((earlier or {}).get("candidates") or {}).items():
        if label in result["candidates"] or label not in candidates:
            continue
        if sweep.get("config") == candidates[label][0]:
            result["candidates"][label] = {**sweep, "carried_over": True}
    return result


def choose_on_validation(corpora: dict[str, dict[str, Any]]) -> str:
    """The one candidate to recommend for every corpus: the best validation accuracy averaged
    over the corpora (each corpus's mean over seeds). Test figures play no part.

    One recipe rather than one per corpus: the recommendation is what a user runs on a corpus
    nobody has measured, and a per-corpus choice on a validation split of a few hundred
    documents picks noise (on BBC the two candidates differ by less than one document)."""
    # Candidates measured on every corpus.
    names = [
        name
        for name in next(iter(corpora.values()))["candidates"]
        if all(name in corpus["candidates"] for corpus in corpora.values())
    ]

    def mean_validation(name: str) -> float:
        return sum(c["candidates"][name]["val_acc"]["mean"] for c in corpora.values()) / len(
            corpora
        )

    return max(names, key=mean_validation)


def _slug(label: str) -> str:
    return label.lower().replace(" ", "-")


def development_corpora(folder: Path) -> dict[str, str]:
    """Each sub-folder holding train/val/test JSONL, by name; empty when the folder is absent."""
    if not folder.is_dir():
        return {}
    return {
        sub.name: str(sub)
        for sub in sorted(folder.iterdir())
        if all((sub / f"{split}.jsonl").is_file() for split in ("train", "val", "test"))
    }


def corpora_markdown(figures: dict[str, Any]) -> str:
    """The table `make corpora` writes: per corpus, SVM vs each candidate, test mean ± sd."""
    lines = [
        "| corpus | model | val acc | test acc | test macro-F1 | train time | chosen |",
        "|---|---|---|---|---|---|---|",
    ]
    for corpus, result in figures["corpora"].items():
        svm = result["svm"]
        lines.append(
            f"| {corpus} | TF-IDF + LinearSVC | {svm['val_acc']:.3f} | {svm['test_acc']:.3f} "
            f"| {svm['test_macro_f1']:.3f} | {svm['fit_s']:.0f} s | |"
        )
        for label, sweep in result["candidates"].items():
            chosen = "✔" if label == result["recommended"] else ""
            earlier = ", earlier sweep" if sweep.get("carried_over") else ""
            lines.append(
                f"| {corpus} | docclass {label} ({len(sweep['runs'])} seeds{earlier}) "
                f"| {_spread(sweep['val_acc'])} | {_spread(sweep['test_acc'])} "
                f"| {_spread(sweep['test_macro_f1'])} | {sweep['train_time_s']['mean']:.0f} s "
                f"| {chosen} |"
            )
    return "\n".join(lines) + "\n"


def _spread(summary: dict[str, float]) -> str:
    return f"{summary['mean']:.3f} ± {summary['std']:.3f}"


def recommended_beats_svm(result: dict[str, Any]) -> dict[str, bool]:
    """Whether the validation-chosen config is at least the SVM on test (mean over seeds)."""
    chosen = result["candidates"][result["recommended"]]
    svm = result["svm"]
    return {
        "accuracy": chosen["test_acc"]["mean"] >= svm["test_acc"],
        "macro_f1": chosen["test_macro_f1"]["mean"] >= svm["test_macro_f1"],
    }
