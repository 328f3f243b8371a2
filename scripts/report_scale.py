"""How large the HTML report grows and how fast it opens, at 300 and 1,000 documents: `make
report-scale` (after `make scratch`).

Two corpora: a synthetic 150-class intent corpus of short requests with long class names
(:func:`docclass.data.synthetic.intent_corpus`, written to ``data/synthetic/intents150/`` and
learnt by a small model trained here from scratch), and BBC News articles with the from-scratch
model's checkpoint. Each report is made by ``docclass report`` in a fresh process with the project's
default options; then its folder is measured by kind of file, and ``index.html`` and the
largest document page are opened in headless Chromium as the browser test opens them (median of
3 loads, each in a fresh browser context). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from docclass.data.synthetic import intent_corpus
from docclass.train.callbacks import machine_summary

MB = 1_000_000
# Issue 28's goals for 1,000 documents.
GOALS = {
    "intents150_folder_bytes": 10 * MB,
    "bbc_folder_bytes": 50 * MB,
    "index_bytes": 1 * MB,
    "index_first_contentful_paint_ms": 1000,
}
# Per class: training, validation and test requests (CLINC150 has 100, 20 and 30).
INTENT_SPLITS = {"train": 100, "validation": 10, "test": 10}
# Chromium exactly as tests/report/test_report.py launches it.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Paint entries of the page, waited for (a page may paint after its load event).
PAINT_JS = """() => new Promise(resolve => {
  const done = () => {
    const paint = {};
    for (const entry of performance.getEntriesByType('paint')) paint[entry.name] = entry.startTime;
    const navigation = performance.getEntriesByType('navigation')[0];
    resolve({paint, dom_content_loaded: navigation.domContentLoadedEventEnd,
             load: navigation.loadEventEnd});
  };
  if (performance.getEntriesByType('paint').some(e => e.name === 'first-contentful-paint')) {
    return done();
  }
  new PerformanceObserver((list, observer) => { observer.disconnect(); done(); })
    .observe({type: 'paint', buffered: true});
  setTimeout(done, 10000);
})"""


def docclass(*args: str) -> list[str]:
    return [sys.executable, "-m", "docclass.cli", *args]


def run(command: list[str], threads: int | None = None) -> tuple[str, float]:
    """Run a command (with ``threads`` torch threads, else torch's default); its stdout and
    wall seconds. On failure, its last lines and exit."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        print("\n".join((result.stdout + result.stderr).splitlines()[-20:]), file=sys.stderr)
        sys.exit(f"failed ({result.returncode}): {' '.join(command[3:])}")
    return result.stdout, time.perf_counter() - started


# -- the synthetic corpus and its model ---------------------------------------------------------


def write_intents(folder: Path, seed: int) -> dict:
    """``train.jsonl``, ``validation.jsonl`` and ``test.jsonl`` of the 150-class intent corpus,
    split per class (the loaders read a folder of such files as a dataset with these splits)."""
    rows = intent_corpus(n_classes=150, n_per_class=sum(INTENT_SPLITS.values()), seed=seed)
    n_train, n_val = INTENT_SPLITS["train"], INTENT_SPLITS["validation"]
    splits: dict[str, list[dict]] = defaultdict(list)
    taken: dict[str, int] = defaultdict(int)
    for row in rows:  # shuffled: each split keeps the corpus's order
        k = taken[row["label"]]
        taken[row["label"]] += 1
        split = "train" if k < n_train else "validation" if k < n_train + n_val else "test"
        splits[split].append(row)
    folder.mkdir(parents=True, exist_ok=True)
    for name, split_rows in splits.items():
        lines = "".join(json.dumps(row) + "\n" for row in split_rows)
        (folder / f"{name}.jsonl").write_text(lines)
    names = sorted(taken)
    words = [len(row["text"].split()) for row in rows]
    return {
        "folder": str(folder),
        "classes": len(names),
        "documents": {name: len(split_rows) for name, split_rows in splits.items()},
        "mean_words": round(sum(words) / len(words), 2),
        "longest_class_name_chars": max(map(len, names)),
        "class_names_over_30_chars": sum(len(name) > 30 for name in names),
        "seed": seed,
    }


def fit_intents(folder: Path, run_dir: Path, epochs: int, threads: int | None) -> dict:
    """The tiny config, a little wider, trained on the intent corpus (about two minutes on
    2 cores); its test accuracy from the run's metrics."""
    command = docclass(
        "fit", "--config", "configs/tiny.yaml", "--data.source", str(folder),
        "--data.val_split", "validation", "--data.max_docs_per_class", "null",
        "--model.d_model", "64", "--data.batch_size", "32",
        "--trainer.max_epochs", str(epochs), "--trainer.callbacks=[]",
        "--report_after_fit", "false", "--trainer.default_root_dir", str(run_dir),
    )  # fmt: skip
    _, wall = run(command, threads)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {
        "command": " ".join(["docclass", *command[3:]]),
        "fit_s": round(wall, 1),
        "train_s": round(metrics["train_time_s"], 1),
        "epochs": metrics["epochs_trained"],
        "torch_threads": threads,
        "test_accuracy": round(metrics["test"]["accuracy"], 4),
        "checkpoint": str(run_dir / "checkpoints" / "last.ckpt"),
    }


# -- one report: made, measured, opened -----------------------------------------------------


def make_report(
    ckpt: str, data: str, split: str, out: Path, documents: int, threads: int | None
) -> dict:
    """``docclass report`` on the first ``documents`` of the split, explaining all of them,
    and the machine's load around it (the seconds mean little when another job shared it)."""
    shutil.rmtree(out, ignore_errors=True)
    command = docclass(
        "report", "--ckpt", ckpt, "--data", data, "--split", split, "--out", str(out),
        "--limit", str(documents), "--max_documents", str(documents),
    )  # fmt: skip
    load_before, code = os.getloadavg()[0], report_code_hash()
    stdout, wall = run(command, threads)
    said = re.search(r"report: (\d+) documents in ([\d.]+) s", stdout)
    return {
        "command": " ".join(["docclass", *command[3:]]),
        "documents": int(said.group(1)) if said else None,
        "report_wall_s": round(wall, 1),
        "report_own_s": float(said.group(2)) if said else None,
        "torch_threads": threads or "torch's default",
        "report_code_sha256": code,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def json_sizes(value: dict) -> dict[str, int]:
    """Bytes of each top-level field, as compact JSON."""
    return {key: len(json.dumps(part, separators=(",", ":"))) for key, part in value.items()}


def html_parts(path: Path) -> dict:
    """An HTML file's bytes by kind: styles, scripts, JSON data (by top-level field), inline
    images (data: URIs), the rest (markup and text, also by ``<h2>`` section); and gzipped, as
    a server would send it."""
    raw = path.read_bytes()
    html = raw.decode("utf-8")
    parts: dict[str, int] = defaultdict(int)
    data_fields: dict[str, int] = defaultdict(int)
    blocks = re.compile(r"<(style|script)\b([^>]*)>(.*?)</\1>", re.S)
    for match in blocks.finditer(html):
        is_json = "application/json" in match.group(2)
        kind = "json_data" if is_json else match.group(1)
        parts[kind] += len(match.group(0).encode())
        if is_json:
            try:
                data = json.loads(match.group(3))
            except ValueError:
                continue
            for key, size in (json_sizes(data) if isinstance(data, dict) else {}).items():
                data_fields[key] += size
    for match in re.finditer(r"""(?:src|href)=["'](data:[^"']*)""", blocks.sub("", html)):
        parts["inline_images"] += len(match.group(1))
    parts["markup_and_text"] = len(raw) - sum(parts.values())
    # Markup and text by section (<h2>), without scripts, styles and inline images.
    bare = re.sub(r"""(src|href)=["']data:[^"']*""", r"\1=", blocks.sub("", html))
    sections = {}
    for section in re.split(r"(?=<h2\b)", bare):
        title = re.match(r"<h2[^>]*>(.*?)</h2>", section, re.S)
        name = re.sub(r"<[^>]+>|\s+", " ", title.group(1)).strip()[:60] if title else "(top)"
        sections[name] = sections.get(name, 0) + len(section.encode())
    return {
        "bytes": len(raw),
        "gzip_bytes": len(gzip.compress(raw, 6)),
        "parts": dict(parts),
        "json_data_fields": dict(sorted(data_fields.items(), key=lambda kv: -kv[1])),
        "markup_by_section": dict(sorted(sections.items(), key=lambda kv: -kv[1])),
    }


def folder_sizes(out: Path) -> dict:
    """Total bytes, bytes of each top-level entry (folders summed), the document pages and
    the explanation records."""
    by_entry: dict[str, int] = defaultdict(int)
    total = files = 0
    for path in out.rglob("*"):
        if path.is_file():
            size = path.stat().st_size
            top = path.relative_to(out).parts[0]
            by_entry[top + ("/" if (out / top).is_dir() else "")] += size
            total, files = total + size, files + 1
    pages = sorted((out / "docs").glob("*.html"), key=lambda p: p.stat().st_size)
    page_sizes = [p.stat().st_size for p in pages]
    return {
        "folder_bytes": total,
        "files": files,
        "by_entry": dict(sorted(by_entry.items(), key=lambda kv: -kv[1])),
        "pages": {
            "count": len(pages),
            "mean_bytes": round(statistics.mean(page_sizes)) if pages else 0,
            "median_bytes": round(statistics.median(page_sizes)) if pages else 0,
            "max_bytes": page_sizes[-1] if pages else 0,
            "largest": pages[-1].name if pages else None,
        },
        "explanations": explanation_sizes(out),
    }


def explanation_sizes(out: Path) -> dict:
    """The explanation records (``explanations.jsonl``, gzipped or not): bytes on disk and
    uncompressed, by top-level field, and the words per document."""
    path = next(out.glob("explanations.jsonl*"), None)
    if path is None:
        return {"file": None}
    fields: dict[str, int] = defaultdict(int)
    words, uncompressed = [], 0
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            uncompressed += len(line.encode())
            record = json.loads(line)
            words.append(len(record.get("words", [])))
            for key, size in json_sizes(record).items():
                fields[key] += size
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "uncompressed_bytes": uncompressed,
        "records": len(words),
        "mean_words_per_document": round(statistics.mean(words), 1) if words else 0,
        "fields": dict(sorted(fields.items(), key=lambda kv: -kv[1])),
    }


def chromium():
    """Headless Chromium through Playwright, found as the browser test finds it."""
    executable = os.environ.get("DOCCLASS_CHROMIUM") or shutil.which("chromium")
    if not executable:
        sys.exit("Chromium not found: run 'make browser' (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    return playwright, playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)


def paint_times(browser, path: Path, loads: int = 3) -> dict:
    """First paint, first contentful paint, DOMContentLoaded and load of ``path`` (ms from
    navigation start, by the page's own Performance API), median of ``loads`` fresh loads."""
    runs = []
    for _ in range(loads):
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        page = context.new_page()
        page.goto(path.resolve().as_uri(), wait_until="load")
        timing = page.evaluate(PAINT_JS)
        context.close()
        runs.append(
            {
                "first_paint_ms": timing["paint"].get("first-paint"),
                "first_contentful_paint_ms": timing["paint"].get("first-contentful-paint"),
                "dom_content_loaded_ms": timing["dom_content_loaded"],
                "load_ms": timing["load"],
            }
        )
    medians = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        medians[key] = None if None in values else round(statistics.median(values), 1)
    return {**medians, "loads": runs}


def measure(browser, out: Path) -> dict:
    sizes = folder_sizes(out)
    largest = out / "docs" / sizes["pages"]["largest"]
    return {
        **sizes,
        "index_html": html_parts(out / "index.html"),
        "largest_page_html": html_parts(largest),
        "chromium": {
            "index": paint_times(browser, out / "index.html"),
            "largest_page": paint_times(browser, largest),
        },
    }


# -- the run -----------------------------------------------------------------------------------


def goals_met(corpus: str, figures: dict) -> dict:
    fcp = figures["chromium"]["index"]["first_contentful_paint_ms"]
    return {
        "folder": figures["folder_bytes"] <= GOALS[f"{corpus}_folder_bytes"],
        "index": figures["index_html"]["bytes"] <= GOALS["index_bytes"],
        "index_paint": fcp is not None and fcp <= GOALS["index_first_contentful_paint_ms"],
    }


# The code that writes a report: hashed before each one, so that reports made while it was being
# edited say so (each `docclass report` process imports it when it starts).
REPORT_CODE = ("docclass/report", "docclass/interpret", "docclass/inference/reporting.py")


def report_code_hash() -> str:
    digest = hashlib.sha256()
    for root in map(Path, REPORT_CODE):
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def git_state() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    changed = git("status", "--porcelain", "--", "docclass").splitlines()
    return {"commit": git("rev-parse", "HEAD"), "uncommitted_in_docclass": changed}


def print_table(reports: list[dict]) -> None:
    header = (
        f"{'report':16s} {'docs':>5s} {'folder MB':>9s} {'index KB':>8s} {'jsonl MB':>8s} "
        f"{'docs/ MB':>8s} {'page KB':>7s} {'max KB':>7s} {'report s':>8s} {'FCP ms':>7s} "
        f"{'page FCP':>8s}"
    )
    print(header)
    for r in reports:
        entries = r["by_entry"]
        print(
            f"{r['name']:16s} {r['documents'] or 0:5d} {r['folder_bytes'] / MB:9.1f} "
            f"{r['index_html']['bytes'] / 1000:8.0f} "
            f"{r['explanations'].get('bytes', 0) / MB:8.1f} {entries.get('docs/', 0) / MB:8.1f} "
            f"{r['pages']['mean_bytes'] / 1000:7.0f} {r['pages']['max_bytes'] / 1000:7.0f} "
            f"{r['report_wall_s']:8.0f} "
            f"{r['chromium']['index']['first_contentful_paint_ms'] or float('nan'):7.0f} "
            f"{r['chromium']['largest_page']['first_contentful_paint_ms'] or float('nan'):8.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bbc-ckpt", default="reports/bbc/checkpoints/last.ckpt")
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--epochs", type=int, default=8, help="epochs of the intent model")
    parser.add_argument("--seed", type=int, default=0, help="seed of the intent corpus")
    parser.add_argument("--data-dir", type=Path, default=Path("data/synthetic/intents150"))
    parser.add_argument("--work", type=Path, default=Path("reports/report-scale"))
    parser.add_argument(
        "--reuse-model", action="store_true", help="keep an intent model trained by a former run"
    )
    parser.add_argument(
        "--fit-threads",
        type=int,
        default=1,
        help="torch threads of the intent model's training: its batches are small, and two "
        "threads on a shared 2-core machine wait on each other for many times longer",
    )
    parser.add_argument(
        "--report-threads", type=int, default=None, help="torch threads of the reports"
    )
    parser.add_argument("--out", type=Path, default=Path("reports/report-scale.json"))
    args = parser.parse_args()
    if not Path(args.bbc_ckpt).is_file():
        sys.exit(f"{args.bbc_ckpt} not found: run 'make scratch' first")
    started = time.perf_counter()
    corpus = write_intents(args.data_dir, args.seed)
    print(f"intent corpus: {corpus['documents']} → {args.data_dir}")
    run_dir = args.work / "intents150-model"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if args.reuse_model and ckpt.is_file():
        model = {"checkpoint": str(ckpt), "reused": True}
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        model = fit_intents(args.data_dir, run_dir, args.epochs, args.fit_threads)
        print(f"intent model: test accuracy {model['test_accuracy']} in {model['fit_s']} s")
    # BBC's test split has 213 articles: the config's training split (1,700 after
    # de-duplication, shuffled by the stratified split) gives 1,000.
    plans = [
        ("intents150", str(ckpt), str(args.data_dir), "test"),
        ("bbc", args.bbc_ckpt, "configs/bbc.yaml", "train"),
    ]
    reports = []
    playwright, browser = chromium()
    try:
        for name, checkpoint, data, split in plans:
            for size in args.sizes:
                out = args.work / f"{name}-{size}"
                made = make_report(checkpoint, data, split, out, size, args.report_threads)
                figures = {"name": f"{name}-{size}", "corpus": name, "data": data, "split": split}
                figures.update(made)
                figures.update(measure(browser, out))
                if size == 1000:
                    figures["goals_met"] = goals_met(name, figures)
                reports.append(figures)
                print(f"{name}-{size}: {figures['folder_bytes'] / MB:.1f} MB in "
                      f"{made['report_wall_s']} s → {out}")  # fmt: skip
    finally:
        browser.close()
        playwright.stop()
    result = {
        "command": " ".join(["python -m scripts.report_scale", *sys.argv[1:]]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_summary(),
        "git": git_state(),
        "total_s": round(time.perf_counter() - started),
        "goals_for_1000_documents": GOALS,
        "units": "bytes; MB = 10^6 bytes; times in ms from navigation start (median of 3)",
        "intents150": {"corpus": corpus, "model": model},
        "reports": reports,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(reports)
    if len({r["report_code_sha256"] for r in reports}) > 1:
        print("the report code changed during the run: see report_code_sha256 in the JSON")
    print(f"→ {args.out} ({result['total_s']} s)")


if __name__ == "__main__":
    main()
