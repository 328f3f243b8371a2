"""How calibrated the trained runs' probabilities are, before and after the temperature:
``docclass calibrate`` on every run folder of a sweep, then ECE, Brier and NLL on test by corpus
and candidate, with their spread over seeds.

A run is calibrated on the weights its test scores were measured on: the checkpoint whose
fingerprint ``metrics.json`` names, or, for runs written before docclass recorded it,
``last.ckpt`` when its test accuracy recomputed here is the recorded one. The run's own saved
config (``logs/version_N/config.yaml``) gives the splits, exactly as in training.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from docclass.artifacts.load import checkpoint_fingerprint, load_classifier
from docclass.errors import DataError
from docclass.inference.calibration import calibrate, check_same_source, write_calibration
from docclass.inference.model_facts import run_calibration
from docclass.inference.reporting import check_same_split, documents_from_datamodule
from docclass.train.lightning_cli import datamodule_from_config


def tested_checkpoint(run_dir: Path) -> tuple[Path | None, str]:
    """The checkpoint whose weights were tested, and how that is known."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    named = metrics["test"].get("weights")
    checkpoints = sorted(
        (run_dir / "checkpoints").glob("*.ckpt"), key=lambda p: p.name != "last.ckpt"
    )
    if named:
        for path in checkpoints:
            if checkpoint_fingerprint(path) == named:
                return path, "named by metrics.json"
        return None, "no checkpoint holds the tested weights"
    last = run_dir / "checkpoints" / "last.ckpt"
    return (last, "last.ckpt, test accuracy checked") if last.is_file() else (None, "no last.ckpt")


# Arguments of test/validate (verbose) and predict (return_predictions): a config saved by one
# of those calls into the run folder is not the fit's, and the data module does not take it.
EVALUATION_ONLY_KEYS = ("verbose", "return_predictions")


def saved_config(run_dir: Path, into: Path) -> Path:
    """The run's own resolved config (the latest fit's logger version), written into ``into``
    without the arguments of the ``fit`` call itself (``ckpt_path``, ``weights_only``), which
    only ``fit`` accepts."""
    versions = sorted(
        (run_dir / "logs").glob("version_*/config.yaml"),
        key=lambda p: int(p.parent.name.split("_")[-1]),
    )
    configs = [yaml.safe_load(path.read_text()) for path in versions]
    configs = [c for c in configs if not any(key in c for key in EVALUATION_ONLY_KEYS)]
    if not configs:
        raise FileNotFoundError(f"{run_dir}: no logs/version_*/config.yaml of a fit")
    config = configs[-1]
    for key in ("ckpt_path", "weights_only"):
        config.pop(key, None)
    path = into / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def calibrate_run(run_dir: Path, reuse: bool = False) -> dict[str, Any]:
    """Calibrate one run folder's tested weights (as ``docclass calibrate`` does); its figures,
    or why there are none. Nothing is written for weights that turn out not to be the tested
    ones. With ``reuse``, a calibration already stored for those weights is read instead."""
    ckpt, how = tested_checkpoint(run_dir)
    if ckpt is None:
        return {"run": str(run_dir), "skipped": how}
    stored = run_calibration(run_dir, lambda: checkpoint_fingerprint(ckpt)) if reuse else None
    if stored:
        return {"run": str(run_dir), "checkpoint": str(ckpt), "chosen": how, **stored}
    overrides = ["--data.tokenizer_from", str(ckpt)]
    if (run_dir / "split.json").is_file():
        overrides += ["--data.split_file", str(run_dir / "split.json")]
    with tempfile.TemporaryDirectory() as folder:
        config = saved_config(run_dir, Path(folder))
        datamodule = datamodule_from_config(config, overrides)
        validation = documents_from_datamodule(datamodule, "val")
        try:
            # As docclass calibrate: without split.json the config's settings rebuild the split,
            # and one that is not the run's fitted the temperature on training documents.
            check_same_source(run_dir, str(config), datamodule.stats["source"])
            check_same_split(str(ckpt), run_dir, str(config), datamodule, "calibrate")
        except DataError as error:
            return {"run": str(run_dir), "skipped": str(error)}
    test = documents_from_datamodule(datamodule, "test")
    facts = calibrate(load_classifier(ckpt), validation, test)
    recorded = json.loads((run_dir / "metrics.json").read_text())["test"]["accuracy"]
    # Only where metrics.json names no weights: a run tested on a GPU can differ by a document.
    if how != "named by metrics.json" and abs(facts["test"]["after"]["accuracy"] - recorded) > 1e-6:
        return {"run": str(run_dir), "skipped": f"{ckpt.name} is not the tested weights"}
    write_calibration(run_dir, facts)
    return {"run": str(run_dir), "checkpoint": str(ckpt), "chosen": how, **facts}


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(float(np.mean(values)), 4),
        "std": round(float(np.std(values, ddof=1)) if len(values) > 1 else 0.0, 4),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ``corpus/candidate``: the seeds, the temperature and every score before and after on
    both splits, as mean and sample standard deviation over the seeds."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if "skipped" not in run:
            folder = Path(run["run"])
            # Seeds of one config are grouped; a lone run folder is its own group.
            group = folder.parent if folder.name.startswith("seed") else folder
            groups.setdefault(str(group), []).append(run)
    summary = {}
    for group, members in sorted(groups.items()):
        row: dict[str, Any] = {
            "seeds": len(members),
            "temperature": _spread([m["temperature"] for m in members]),
        }
        for split in ("validation", "test"):
            floors = [m[split].get("ece_if_calibrated") for m in members]
            if None not in floors:
                row[f"{split}_ece_if_calibrated"] = _spread(floors)
            for when in ("before", "after"):
                for score in ("ece", "brier", "nll"):
                    values = [m[split][when][score] for m in members]
                    row[f"{split}_{score}_{when}"] = _spread(values)
        summary["/".join(Path(group).parts[-2:])] = row
    return summary


def calibration_markdown(summary: dict[str, Any]) -> str:
    """The table docs/calibration.md quotes."""
    lines = [
        "| corpus / config | seeds | temperature | test ECE raw | test ECE calibrated | "
        "test ECE of a perfect model | test NLL raw → calibrated | "
        "validation ECE raw → calibrated |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(value: dict[str, float]) -> str:
        return f"{value['mean']:.3f} ± {value['std']:.3f}"

    for name, row in summary.items():
        lines.append(
            f"| {name} | {row['seeds']} | {cell(row['temperature'])} | "
            f"{cell(row['test_ece_before'])} | **{cell(row['test_ece_after'])}** | "
            f"{cell(row['test_ece_if_calibrated']) if 'test_ece_if_calibrated' in row else '—'} | "
            f"{row['test_nll_before']['mean']:.3f} → {row['test_nll_after']['mean']:.3f} | "
            f"{row['validation_ece_before']['mean']:.3f} → "
            f"{row['validation_ece_after']['mean']:.3f} |"
        )
    return "\n".join(lines) + "\n"
