"""What is known about a trained model beyond its weights: the run folder it came from, the
scores and faithfulness measured on it, and so the word-score method it should explain with.

A checkpoint saved as ``<run>/checkpoints/<name>.ckpt`` has its run folder two levels up, with
``metrics.json`` (the test scores), ``report/report.json`` (the report's own faithfulness table,
from which its pages choose the method they show first) and perhaps ``report/faithfulness.json``
(every removal ``docclass faithfulness`` measured). A run holds several checkpoints (``last``,
``best``, …) but each of those files was measured on one set of weights, and says which by its
weights' fingerprint: a figure is only taken for the weights it names. A model folder carries
its own table and chosen method in ``config.json``, written for the weights beside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docclass.calibration import TEMPERATURE_RANGE
from docclass.errors import CheckpointError, one_line
from docclass.interpret.default_method import REPORT_TABLE, DefaultMethod, default_method
from docclass.interpret.methods import score_rules
from docclass.interpret.records import RECORD_METHODS


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content, None when there is no such file."""
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except ValueError as error:
        raise CheckpointError(f"{path}: not valid JSON ({one_line(error)})") from error


def run_dir_of(ckpt: str | Path) -> Path | None:
    """The training run's folder for a checkpoint saved as ``<run>/checkpoints/<name>.ckpt``."""
    # Expanded as the loader expands it (``resolve_model``): a ``~`` the shell left alone
    # (``--ckpt=~/…``, a YAML config, the Python API) loaded the weights but found no run, so
    # they were used uncalibrated and with the unmeasured default method, without a word.
    path = Path(ckpt).expanduser().resolve()
    if not path.is_file():
        return None
    return path.parent.parent if path.parent.name == "checkpoints" else None


def measured_on(content: dict[str, Any] | None, fingerprint: str) -> dict[str, Any] | None:
    """``content`` when it names these weights; None when it names others or none (written
    before docclass recorded whose weights a figure belongs to)."""
    return content if content and content.get("weights") == fingerprint else None


CALIBRATION_FILE = "calibration.json"


def model_calibration(
    path: str | Path, folder_config: dict[str, Any], fingerprint: Callable[[], str]
) -> dict[str, Any] | None:
    """The calibration measured on these weights (``temperature`` and its figures): a model
    folder's recorded one, else its run's ``calibration.json`` when that names these weights
    (``fingerprint()``, only computed when there is a run to ask); None when uncalibrated."""
    recorded = folder_config.get("calibration")
    if recorded is not None:
        return _checked_calibration(recorded, Path(path) / "config.json")
    return run_calibration(run_dir_of(path), fingerprint)


def run_calibration(run_dir: Path | None, fingerprint: Callable[[], str]) -> dict[str, Any] | None:
    """These weights' entry in a run folder's ``calibration.json`` (one per set of weights the
    run calibrated), else None."""
    if run_dir is None:
        return None
    stored = read_json(run_dir / CALIBRATION_FILE) or {}
    if stored and "by_weights" not in stored:
        raise CheckpointError(
            f"{run_dir / CALIBRATION_FILE}: written by an earlier docclass; calibrate again "
            "with 'docclass calibrate'"
        )
    by_weights = stored.get("by_weights") or {}
    measured = by_weights.get(fingerprint())
    return _checked_calibration(measured, run_dir / CALIBRATION_FILE) if measured else None


def fitted_temperature(calibration: dict[str, Any] | None) -> float | None:
    """What the probabilities are divided by: the calibration's temperature where one was
    fitted; None where the weights are uncalibrated or no temperature fitted (raw)."""
    if calibration and calibration.get("fit", "likelihood") == "likelihood":
        return calibration["temperature"]
    return None


def _checked_calibration(facts: Any, where: Path) -> dict[str, Any]:
    temperature = facts.get("temperature") if isinstance(facts, dict) else None
    low, high = TEMPERATURE_RANGE
    # A bool is an int to Python; a temperature of true is a broken file, not 1. Outside the
    # range a fit can give, a temperature would make every probability 0, 1 or NaN.
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not (low <= temperature <= high)
    ):
        raise CheckpointError(
            f"{where}: calibration temperature {temperature!r} is not a number in "
            f"[{low}, {high}]; calibrate again with 'docclass calibrate'"
        )
    if facts.get("fit", "likelihood") != "likelihood" and temperature != 1:
        # The record says the probabilities stay raw (as /info and the card report), yet holds
        # a temperature that predict would divide by: one of the two is wrong.
        raise CheckpointError(
            f"{where}: calibration fitted no temperature ({facts['fit']!r}) but stores "
            f"{temperature}; calibrate again with 'docclass calibrate'"
        )
    return facts


def faithfulness_tables(report_dir: Path, fingerprint: str) -> dict[str, dict[str, Any]]:
    """Every table measured on these weights under this docclass's score rules, by name: the
    report's own (the one the pages and the API choose the default method from) and each
    removal ``docclass faithfulness`` measured there."""
    tables: dict[str, dict[str, Any]] = {}
    report = measured_on(read_json(report_dir / "report.json"), fingerprint) or {}
    # Scores made by other rules (an older docclass's, or rules not recorded) are other
    # methods' figures under the same names: 'docclass faithfulness' refuses to re-render such
    # a report, and the default must not be chosen from its table either.
    report_current = not report or report.get("scores") == score_rules()
    if report.get("faithfulness") and report_current:
        tables[REPORT_TABLE] = report["faithfulness"]
    measured = measured_on(read_json(report_dir / "faithfulness.json"), fingerprint) or {}
    if measured.get("scores") != score_rules() or not report_current:
        measured = {}  # likewise; nor beside a report of other rules: not one model's figures
    for removal, result in (measured.get("removal") or {}).items():
        tables[removal] = {"documents": measured.get("documents"), "methods": result["aopc"]}
    return tables


def choose_default(
    tables: dict[str, dict[str, Any]], other_weights: bool = False, other_rules: bool = False
) -> DefaultMethod:
    """The default word-score method by the report's own table, the one its pages show first
    by, so a page and the API that serves the same model never disagree. ``other_weights``
    and ``other_rules`` say why a run with a report has no table here: it measured another
    checkpoint, or these weights' scores as other score rules made them."""
    table = tables.get(REPORT_TABLE)
    documents = (table or {}).get("documents") or 0
    chosen = default_method(table["methods"] if table else None, documents)
    if table is None and other_weights:
        return DefaultMethod(
            chosen.method,
            f"{chosen.reason.split(':')[0]}: this run's report measured other weights than "
            "these (another checkpoint of the run), so nothing was measured on these.",
        )
    if table is None and other_rules:
        return DefaultMethod(
            chosen.method,
            f"{chosen.reason.split(':')[0]}: this run's report measured scores made by other "
            "rules than this docclass's (another version's), so its faithfulness table does "
            "not describe these scores; make the report again with 'docclass report'.",
        )
    return chosen


def folder_tables_current(folder_config: dict[str, Any]) -> bool:
    """Whether a model folder's faithfulness tables (and the default chosen from them) measured
    the scores this docclass's methods make: a folder records the score rules they were
    measured under; one without the record (exported before docclass kept it) cannot say."""
    if not folder_config.get("faithfulness"):
        return True  # nothing measured, so nothing to disagree with
    return folder_config.get("score_rules") == score_rules()


def folder_default_of_other_rules() -> DefaultMethod:
    """The unmeasured default, for a folder whose tables measured other scores."""
    unmeasured = choose_default({})
    return DefaultMethod(
        unmeasured.method,
        f"{unmeasured.reason.split(':')[0]}: this folder's faithfulness tables measured scores "
        "made by other rules than this docclass's (or do not say by which), so they do not "
        "describe these scores; export it again from its run after 'docclass report'.",
    )


def model_default_method(
    path: str | Path, folder_config: dict[str, Any], fingerprint: Callable[[], str]
) -> DefaultMethod:
    """The method a model explains with: its folder's recorded choice (``folder_config``, its
    config.json), else the one its run's report measured most faithful on these weights
    (``fingerprint()``, only computed when there is a run to ask), else docclass's unmeasured
    default."""
    recorded = folder_config.get("default_method")
    if isinstance(recorded, dict) and recorded.get("method"):
        if recorded["method"] not in RECORD_METHODS:
            raise CheckpointError(
                f"{Path(path) / 'config.json'}: default_method {recorded['method']!r} is not "
                f"one of {', '.join(RECORD_METHODS)}; export the model again"
            )
        if not folder_tables_current(folder_config):
            return folder_default_of_other_rules()
        return DefaultMethod(recorded["method"], recorded.get("reason", ""))
    run_dir = run_dir_of(path)
    if run_dir is None:
        return choose_default({})
    weights = fingerprint()
    tables = faithfulness_tables(run_dir / "report", weights)
    report = read_json(run_dir / "report" / "report.json") or {}
    other_weights = bool(report) and report.get("weights") != weights
    return choose_default(
        tables, other_weights, other_rules=report_of_other_rules(run_dir / "report", weights)
    )


def report_of_other_rules(report_dir: Path, fingerprint: str) -> bool:
    """Whether the report measured these weights' faithfulness, but of scores other rules
    made: the default's reason must say so rather than "not measured"."""
    report = measured_on(read_json(report_dir / "report.json"), fingerprint) or {}
    return bool(report.get("faithfulness")) and report.get("scores") != score_rules()
