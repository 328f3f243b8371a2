"""Planted label noise: how well ``docclass audit`` finds labels flipped on purpose.

A config's split is written to a JSONL corpus (ids, texts and labels as the DataModule read
them) and a ``split.json``; a share of the training and validation labels is then flipped, each
to another class drawn at random (seeded), the test labels left alone. The audit runs on the
noisy copy through the ``docclass audit`` command; its flags are scored against the flips
(precision, recall), and its re-training against a run on the clean labels: the share of the
accuracy the noise cost that removing the flagged documents wins back, on the untouched test
split.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from docclass.inference.audit import (
    AUDIT_CSV,
    FILTERS,
    OUT_OF_SAMPLE,
    PLAN,
    SELF_CONFIDENCE_RULE,
    SUMMARY,
    find_label_issues,
    fit_run,
    run_child,
)
from docclass.train.lightning_cli import datamodule_from_config


def write_corpus(config: str, out: Path, overrides: list[str] = ()) -> dict[str, Any]:
    """The config's documents as ``corpus.jsonl`` and its split as ``split.json`` in ``out``."""
    datamodule = datamodule_from_config(config, list(overrides))
    datamodule.prepare()
    names = list(datamodule.label_names)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for split in ("train", "val", "test"):
        data = datamodule.splits[split]
        for doc_id, text, label in zip(data["id"], data["text"], data["label"], strict=True):
            rows.append({"id": doc_id, "text": text, "label": names[label], "split": split})
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    datamodule.write_split(out / "split.json")
    return {"rows": rows, "label_names": names}


def flip_labels(
    rows: list[dict[str, Any]], names: list[str], rate: float, seed: int
) -> tuple[list[dict[str, Any]], set[str]]:
    """A copy of ``rows`` with ``rate`` of the non-test labels flipped to another class drawn
    uniformly (seeded), and the ids flipped."""
    rng = np.random.default_rng(seed)
    pool = [i for i, row in enumerate(rows) if row["split"] != "test"]
    chosen = rng.choice(pool, size=round(rate * len(pool)), replace=False)
    noisy = [dict(row) for row in rows]
    for i in chosen:
        others = [n for n in names if n != rows[i]["label"]]
        noisy[i]["label"] = others[int(rng.integers(len(others)))]
    return noisy, {rows[i]["id"] for i in chosen}


def score_flags(flagged: set[str], flipped: set[str]) -> dict[str, float]:
    """Precision and recall of the flagged ids at finding the flipped ones."""
    hits = len(flagged & flipped)
    return {
        "flagged": len(flagged),
        "flipped": len(flipped),
        "found": hits,
        "precision": hits / len(flagged) if flagged else None,
        "recall": hits / len(flipped) if flipped else None,
    }


def recovered_share(clean: float, noisy: float, cleaned: float) -> float | None:
    """The share of the accuracy lost to the noise that the cleaned run wins back (None when
    the noise cost nothing)."""
    cost = clean - noisy
    return (cleaned - noisy) / cost if cost > 0 else None


def audit_noisy_copy(
    config: str, corpus: dict[str, Any], folder: Path, rate: float, seed: int, folds: int
) -> dict[str, Any]:
    """Flip ``rate`` of the labels, run ``docclass audit --retrain`` on the copy, score it."""
    noisy, flipped = flip_labels(corpus["rows"], corpus["label_names"], rate, seed)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "noisy.jsonl").open("w", encoding="utf-8") as handle:
        for row in noisy:
            handle.write(json.dumps(row) + "\n")
    (folder / "flipped.json").write_text(json.dumps(sorted(flipped)))
    _audit(_audit_command(config, folder, "audit", folds, "--retrain", "true"))
    summary = json.loads((folder / "audit" / SUMMARY).read_text())
    flagged = _flagged_ids(folder / "audit")
    if rule_flags(*out_of_sample(folder / "audit"), noisy)[summary["filter_by"]] != flagged:
        # The same rule on the same saved probabilities must flag the same documents.
        raise RuntimeError(f"{folder}: by_filter disagrees with the audit's own flags")
    rules = by_filter(folder / "audit", noisy, flipped)
    return {"rate": rate, **score_flags(flagged, flipped), "by_filter": rules, "audit": summary}


def _audit(command: list[str]) -> None:
    """``docclass audit`` to its end; SIGTERM to the benchmark stops it too, and the audit
    stops its fold (docclass's own run_child)."""
    returncode = run_child(command)
    if returncode:
        raise RuntimeError(f"{' '.join(command)} exited with {returncode} (its output is above)")


def _audit_command(config: str, folder: Path, out: str, folds: int, *options: str) -> list[str]:
    """``docclass audit`` of the noisy copy in ``folder`` (its own JSONL, the clean split)."""
    fit_args = ["--data.source", str(folder / "noisy.jsonl"),
                "--data.split_file", str(folder.parent / "split.json")]  # fmt: skip
    return [
        sys.executable, "-m", "docclass.cli", "audit", "--config", config,
        "--out", str(folder / out), "--folds", str(folds), "--fit_args", json.dumps(fit_args),
        *options,
    ]  # fmt: skip


def _flagged_ids(audit_dir: Path) -> set[str]:
    with (audit_dir / AUDIT_CSV).open(encoding="utf-8") as handle:
        return {row["id"] for row in csv.DictReader(handle)}


COMBINED = "audit-combined"


def combined_audit(config: str, other_config: str, folder: Path, folds: int) -> dict[str, Any]:
    """What a user runs with two configs (docs/audit.md): ``other_config`` audits the noisy
    copy too (no re-training), then ``config``'s audit averages its probabilities with the
    other's (``--with_audits``), flags by the given label's probability
    (``calibrated_count_by_self_confidence``) and re-trains without its flags. That audit's
    folds, and its run on the whole noisy split, are the first audit's, linked rather than
    trained again: the same plan and split, so ``docclass audit`` reuses them as its own."""
    other = f"audit-{Path(other_config).stem}"
    _audit(_audit_command(other_config, folder, other, folds, "--retrain", "false"))
    _link_finished_runs(folder / "audit", folder / COMBINED)
    command = _audit_command(
        config, folder, COMBINED, folds, "--retrain", "true",
        "--with_audits", json.dumps([str(folder / other)]),
        "--filter_by", SELF_CONFIDENCE_RULE,
    )  # fmt: skip
    _audit(command)
    noisy, flipped = _noisy_copy(folder)
    flagged = _flagged_ids(folder / COMBINED)
    names, mean = mean_probabilities([folder / COMBINED, folder / other])
    if rule_flags(names, mean, noisy)[SELF_CONFIDENCE_RULE] != flagged:
        # The benchmark's own mean of the two audits must flag what docclass's averaging did.
        raise RuntimeError(f"{folder / COMBINED}: ensemble_by_filter disagrees with its flags")
    summary = json.loads((folder / COMBINED / SUMMARY).read_text())
    return {
        "with_config": other_config, **score_flags(flagged, flipped), "audit": summary,
        "by_filter_other": by_filter(folder / other, noisy, flipped),
        "by_filter_mean": ensemble_by_filter([folder / COMBINED, folder / other], noisy, flipped),
    }  # fmt: skip


def _link_finished_runs(audit_dir: Path, combined: Path) -> None:
    """``combined`` starts as the plan, the folds and the whole-split run of ``audit_dir``
    (hard links: nothing is copied, and docclass replaces rather than edits a file it
    rewrites); left as it is when it holds a plan already (a resumed benchmark), linked again
    when it holds none (a copy stopped half-way)."""
    if (combined / PLAN).is_file():
        return
    # Without a plan the folder holds only links from a stopped copy: start it again.
    shutil.rmtree(combined, ignore_errors=True)
    combined.mkdir(parents=True)
    shutil.copytree(audit_dir / "folds", combined / "folds", copy_function=os.link)
    baseline = audit_dir / "retrain" / "baseline"
    if (baseline / "metrics.json").is_file():
        shutil.copytree(baseline, combined / "retrain" / "baseline", copy_function=os.link)
    # The plan last: a copy stopped half-way is not taken for a finished one.
    shutil.copy2(audit_dir / PLAN, combined / PLAN)


def by_filter(
    audit_dir: Path, noisy: list[dict[str, Any]], flipped: set[str]
) -> dict[str, dict[str, float]]:
    """Precision and recall of every cleanlab ``--filter_by`` rule on the audit's own
    out-of-sample probabilities (the folds' files, which the audit checked against their
    weights): what choosing another rule would have flagged, without training again."""
    names, probs = out_of_sample(audit_dir)
    return _rules_scored(names, probs, noisy, flipped)


def ensemble_by_filter(
    audit_dirs: list[Path], noisy: list[dict[str, Any]], flipped: set[str]
) -> dict[str, dict[str, float]]:
    """:func:`by_filter` on the mean of several audits' out-of-sample probabilities (other
    configs on the same noisy copy): whether models that err differently flag fewer sound
    labels."""
    distinct = {Path(folder).resolve() for folder in audit_dirs}
    if len(audit_dirs) < 2 or len(distinct) != len(audit_dirs):
        raise ValueError(f"an ensemble needs two or more different audits, got {audit_dirs}")
    return _rules_scored(*mean_probabilities(audit_dirs), noisy, flipped)


def mean_probabilities(audit_dirs: list[Path]) -> tuple[list[str], dict[str, np.ndarray]]:
    """Each document's out-of-sample probabilities averaged over the audits, by id. Refuses
    audits of other documents or other classes, which would mix up rows."""
    audits = [out_of_sample(folder) for folder in audit_dirs]
    names, first = audits[0]
    for folder, (other_names, probs) in zip(audit_dirs[1:], audits[1:], strict=True):
        if other_names != names or set(probs) != set(first):
            raise ValueError(f"{folder}: not an audit of the same documents and classes as "
                             f"{audit_dirs[0]}")  # fmt: skip
    return names, {i: np.mean([probs[i] for _, probs in audits], axis=0) for i in first}


def out_of_sample(audit_dir: Path) -> tuple[list[str], dict[str, np.ndarray]]:
    """An audit's label names and every document's out-of-sample probabilities, by id."""
    plan = json.loads((audit_dir / PLAN).read_text())
    probs = {}
    for fold, split in enumerate(plan["fold_splits"]):
        scored = json.loads((audit_dir / "folds" / f"fold-{fold}" / OUT_OF_SAMPLE).read_text())
        if sorted(scored["ids"]) != sorted(split["test"]):
            # A fold scored on other documents, or not all of its own, would shrink or mix the
            # audit without a word.
            raise ValueError(f"{audit_dir}: fold {fold} scored other documents than its plan's "
                             "test split; rerun docclass audit there")  # fmt: skip
        for doc_id, row in zip(scored["ids"], scored["probs"], strict=True):
            if doc_id in probs or len(row) != len(plan["label_names"]):
                raise ValueError(f"{audit_dir}: document {doc_id!r} scored twice or not once "
                                 "per class")  # fmt: skip
            probs[doc_id] = np.asarray(row, dtype=float)
    return plan["label_names"], probs


def rule_flags(
    names: list[str], probs: dict[str, np.ndarray], noisy: list[dict[str, Any]]
) -> dict[str, set[str]]:
    """The ids every cleanlab ``--filter_by`` rule flags on these probabilities."""
    given_label = {row["id"]: row["label"] for row in noisy}
    ids = list(probs)
    given = np.asarray([names.index(given_label[i]) for i in ids])
    table = np.stack([probs[i] for i in ids])
    return {
        rule: {ids[row] for row in find_label_issues(given, table, rule)[0]} for rule in FILTERS
    }


def _rules_scored(
    names: list[str], probs: dict[str, np.ndarray], noisy: list[dict[str, Any]], flipped: set[str]
) -> dict[str, dict[str, float]]:
    return {
        rule: score_flags(ids, flipped) for rule, ids in rule_flags(names, probs, noisy).items()
    }


def planted_noise(
    config: str, out: Path, rates: list[float], seeds: list[int] | None = None, folds: int = 5,
    with_config: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The clean run and one audit per noise rate and flip seed, with every figure the issue
    asks for (the training seed stays the config's: the seeds draw other flips); with
    ``with_config``, each copy's :func:`combined_audit` too."""
    # One audit per distinct seed: a repeated one would count the same run twice.
    seeds = list(dict.fromkeys(seeds or [0]))
    corpus = write_corpus(config, out)
    split = json.loads((out / "split.json").read_text())
    clean_args = ["--data.source", str(out / "corpus.jsonl")]
    clean = fit_run(config, clean_args, split, out / "clean")["test"]
    results = []
    for rate in rates:
        for seed in seeds:
            folder = out / (f"noise-{rate:.2f}" + (f"-seed{seed}" if seed else ""))
            result = audit_noisy_copy(config, corpus, folder, rate, seed, folds)
            results.append({"seed": seed, **result, **_test_figures(clean, result)})
            if with_config:
                combined = combined_audit(config, with_config, folder, folds)
                results[-1]["combined"] = {**combined, **_test_figures(clean, combined)}
            print(json.dumps(_without_summaries(results[-1])), flush=True)
    return {"config": config, "seeds": seeds, "folds": folds, "clean": clean,
            "with_config": with_config, "results": results}  # fmt: skip


def _without_summaries(result: dict[str, Any]) -> dict[str, Any]:
    """A run's figures for the log, without the audits' whole summaries."""
    shown = {k: v for k, v in result.items() if k != "audit"}
    if "combined" in shown:
        shown["combined"] = _without_summaries(shown["combined"])
    return shown


def _test_figures(clean: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    retrain = result["audit"]["retrain"]
    noisy, cleaned = retrain["baseline"]["accuracy"], retrain["cleaned"]["accuracy"]
    # In documents too: one test document is 1/n of accuracy, and the noise may cost a few.
    n = clean["n_documents"]
    return {
        "clean_accuracy": clean["accuracy"],
        "noisy_accuracy": noisy,
        "cleaned_accuracy": cleaned,
        "recovered": recovered_share(clean["accuracy"], noisy, cleaned),
        "test_documents": n,
        "cost_documents": round((clean["accuracy"] - noisy) * n),
        "won_back_documents": round((cleaned - noisy) * n),
    }


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def label_audit_markdown(figures: dict[str, Any]) -> str:
    """The planted-noise table: a row per rate and flip seed, then each rate's mean ± sd; with
    a second config, the same for the combined audits and the rules on the mean."""
    lines = [
        f"Planted label noise on `{figures['config']}` ({figures['folds']} folds, flip seeds "
        f"{', '.join(map(str, figures['seeds']))}; test accuracy on clean labels "
        f"{figures['clean']['accuracy']:.4f}).",
        "",
        *_runs_table(figures["results"]),
    ]
    lines += _filter_table(figures["results"])
    lines += _spreads(figures["results"])
    combined = [{"rate": r["rate"], "seed": r["seed"], **r["combined"]}
                for r in figures["results"] if r.get("combined")]  # fmt: skip
    if combined:
        other = f"`{combined[0]['with_config']}`"
        lines += [
            "",
            f"With {other} auditing the same copies: `docclass audit --with_audits` (the two "
            f"configs' probabilities averaged), `--filter_by {SELF_CONFIDENCE_RULE}`, "
            f"`--retrain true` (re-trained: `{figures['config']}`).",
            "",
            *_runs_table(combined),
        ]
        lines += _spreads(combined)
        lines += _filter_table(
            [{**r, "by_filter": r["by_filter_other"]} for r in combined],
            f"{other}'s own out-of-sample probabilities",
        )
        lines += _filter_table(
            [{**r, "by_filter": r["by_filter_mean"]} for r in combined],
            "The mean of the two configs' out-of-sample probabilities",
        )
    return "\n".join(lines) + "\n"


def _runs_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| noise | flip seed | flipped | flagged | precision | recall | test acc. noisy "
        "| without flagged | recovered (test documents lost → won back) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        recovered = "—" if r["recovered"] is None else f"{r['recovered']:.2f}"
        lines.append(
            f"| {r['rate']:.0%} | {r['seed']} | {r['flipped']} | {r['flagged']} | "
            f"{_share(r['precision'])} | {_share(r['recall'])} | {r['noisy_accuracy']:.4f} | "
            f"{r['cleaned_accuracy']:.4f} | {recovered} ({r['cost_documents']} → "
            f"{r['won_back_documents']}) |"
        )
    return lines


def _spreads(results: list[dict[str, Any]]) -> list[str]:
    """Each rate's mean ± sd over its flip seeds, where it has two or more."""
    lines = []
    for rate in sorted({r["rate"] for r in results}):
        runs = [r for r in results if r["rate"] == rate]
        if len(runs) > 1:
            lines.append(
                f"\n{rate:.0%} over {len(runs)} flip seeds: precision "
                f"{_spread([r['precision'] for r in runs])}, recall "
                f"{_spread([r['recall'] for r in runs])}; test documents lost → won back "
                + ", ".join(f"{r['cost_documents']} → {r['won_back_documents']}" for r in runs)
                + "."
            )
    return lines


def _filter_table(
    results: list[dict[str, Any]], source: str = "The same out-of-sample probabilities"
) -> list[str]:
    """Precision / recall of each cleanlab rule on the same probabilities, a row per run."""
    runs = [r for r in results if r.get("by_filter")]
    if not runs:
        return []
    rules = list(runs[0]["by_filter"])
    lines = [
        "",
        f"{source} under each `--filter_by` rule (precision / recall, documents flagged):",
        "",
        "| noise | flip seed | " + " | ".join(f"`{rule}`" for rule in rules) + " |",
        "|---|---|" + "---|" * len(rules),
    ]
    for r in runs:
        cells = [
            f"{_share(f['precision'])} / {_share(f['recall'])} ({f['flagged']})"
            for f in (r["by_filter"][rule] for rule in rules)
        ]
        lines.append(f"| {r['rate']:.0%} | {r['seed']} | " + " | ".join(cells) + " |")
    return lines


def _spread(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if len(known) < 2:
        return "—" if not known else f"{known[0]:.3f} (1 of {len(values)} runs)"
    return f"{np.mean(known):.3f} ± {np.std(known, ddof=1):.3f}"


def ensemble_runs(runs: list[Path]) -> dict[str, Any]:
    """:func:`ensemble_by_filter` for every noisy copy (``noise-*`` folder) that each planted-
    noise runs folder audited, after checking that they flipped the same labels."""
    names = sorted(p.name for p in runs[0].glob("noise-*") if (p / "audit" / PLAN).is_file())
    results = []
    for name in names:
        folders = [run / name for run in runs]
        if not all((folder / "audit" / PLAN).is_file() for folder in folders):
            print(f"{name}: not audited in every runs folder, left out", flush=True)
            continue
        noisy, flipped = _noisy_copy(folders[0])
        for folder in folders[1:]:
            # The same ids flipped to the same classes: else the mean would blend models
            # trained on other labels, scored against the first copy's.
            if _noisy_copy(folder) != (noisy, flipped):
                raise ValueError(f"{folder}: another noisy copy than {folders[0]}")
        members = {
            str(run): by_filter(folder / "audit", noisy, flipped)
            for run, folder in zip(runs, folders, strict=True)
        }
        mean = ensemble_by_filter([f / "audit" for f in folders], noisy, flipped)
        results.append({"copy": name, "members": members, "mean": mean})
    if not results:
        raise ValueError(f"no noisy copy was audited in every one of {[str(r) for r in runs]}")
    return {"runs": [str(run) for run in runs], "results": results}


def _noisy_copy(folder: Path) -> tuple[list[dict[str, Any]], set[str]]:
    rows = [json.loads(line) for line in (folder / "noisy.jsonl").open(encoding="utf-8")]
    labels = [{"id": row["id"], "label": row["label"]} for row in rows]
    return labels, set(json.loads((folder / "flipped.json").read_text()))


def ensemble_markdown(figures: dict[str, Any]) -> str:
    """Each rule on each run's probabilities and on their mean, a row per noisy copy (the
    rules the figures were scored under: a record from before a rule was added lacks it)."""
    rules_scored = list(figures["results"][0]["mean"]) if figures["results"] else list(FILTERS)
    lines = [
        "Label audits of the same noisy copies by "
        + " and ".join(f"`{run}`" for run in figures["runs"])
        + ": each cleanlab rule on each audit's out-of-sample probabilities and on their mean "
        "(precision / recall, documents flagged).",
        "",
        "| noisy copy | probabilities | " + " | ".join(f"`{r}`" for r in rules_scored) + " |",
        "|---|---|" + "---|" * len(rules_scored),
    ]
    for result in figures["results"]:
        mean = f"mean of the {len(result['members'])}"
        rows = [
            *((f"`{run}`", rules) for run, rules in result["members"].items()),
            (mean, result["mean"]),
        ]
        for source, rules in rows:
            cells = [
                f"{_share(f['precision'])} / {_share(f['recall'])} ({f['flagged']})"
                for f in (rules[rule] for rule in rules_scored)
            ]
            lines.append(f"| {result['copy']} | {source} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
