"""What is known about a trained model beyond its weights: the run folder it came from, the
faithfulness its report measured, and so the word-score method it should explain with.

A checkpoint saved as ``<run>/checkpoints/<name>.ckpt`` has its run folder two levels up, with
``report/report.json`` (the report's own masking table) and perhaps ``report/faithfulness.json``
(every removal ``docclass faithfulness`` measured). A model folder carries the same table and
the chosen method in its ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from docclass.errors import CheckpointError, one_line
from docclass.interpret.default_method import DefaultMethod, default_method
from docclass.interpret.records import RECORD_METHODS


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content, None when there is no such file."""
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except ValueError as error:
        raise CheckpointError(f"{path}: not valid JSON ({one_line(error)})") from error


def run_dir_of(ckpt: str | Path) -> Path | None:
    """The training run's folder for a checkpoint saved as ``<run>/checkpoints/<name>.ckpt``."""
    path = Path(ckpt).resolve()
    if not path.is_file():
        return None
    return path.parent.parent if path.parent.name == "checkpoints" else None


def faithfulness_tables(report_dir: Path) -> dict[str, dict[str, Any]]:
    """``removal → {documents, methods}`` from a report folder: every removal that ``docclass
    faithfulness`` measured there, else the report's own masking table."""
    measured = read_json(report_dir / "faithfulness.json")
    if measured and measured.get("removal"):
        return {
            removal: {"documents": measured.get("documents"), "methods": result["aopc"]}
            for removal, result in measured["removal"].items()
        }
    meta = read_json(report_dir / "report.json") or {}
    table = meta.get("faithfulness")
    return {table.get("removal", "mask"): table} if table else {}


def choose_default(tables: dict[str, dict[str, Any]]) -> DefaultMethod:
    """The default word-score method by the masking table (the one every report measures)."""
    table = tables.get("mask") or next(iter(tables.values()), None)
    return default_method(table["methods"] if table else None, (table or {}).get("documents") or 0)


def model_default_method(path: str | Path, folder_config: dict[str, Any]) -> DefaultMethod:
    """The method a model explains with: its folder's recorded choice (``folder_config``, its
    config.json), else the one its run's report measured most faithful, else docclass's
    unmeasured default."""
    recorded = folder_config.get("default_method")
    if isinstance(recorded, dict) and recorded.get("method"):
        if recorded["method"] not in RECORD_METHODS:
            raise CheckpointError(
                f"{Path(path) / 'config.json'}: default_method {recorded['method']!r} is not "
                f"one of {', '.join(RECORD_METHODS)}; export the model again"
            )
        return DefaultMethod(recorded["method"], recorded.get("reason", ""))
    run_dir = run_dir_of(path)
    return choose_default(faithfulness_tables(run_dir / "report") if run_dir else {})
