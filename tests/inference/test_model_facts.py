"""The default word-score method a model explains with comes only from figures measured on its
weights under this docclass's score rules."""

import json

from docclass.inference.model_facts import REPORT_TABLE, faithfulness_tables, model_default_method
from docclass.interpret.methods import score_rules

WEIGHTS = "a" * 64


def _row(comprehensiveness, sufficiency):
    return {"comprehensiveness": comprehensiveness, "sufficiency": sufficiency}


# A table that picks pool attention, not the unmeasured default.
TABLE = {
    "documents": 5,
    "methods": {
        "random": _row(0.02, 0.4),
        "attention": _row(0.3, 0.1),
        "conservative": _row(0.1, 0.3),
    },
}


def _run(tmp_path, scores):
    """A run folder with a checkpoint whose report measured it under ``scores``."""
    (tmp_path / "checkpoints").mkdir(parents=True)
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    report = tmp_path / "report"
    report.mkdir()
    meta = {"weights": WEIGHTS, "faithfulness": TABLE}
    if scores is not None:
        meta["scores"] = scores
    (report / "report.json").write_text(json.dumps(meta))
    measured = {"weights": WEIGHTS, "scores": scores, "documents": 5, "removal": {}}
    measured["removal"]["delete"] = {"aopc": TABLE["methods"]}
    (report / "faithfulness.json").write_text(json.dumps(measured))
    return tmp_path / "checkpoints" / "last.ckpt"


def test_a_report_measured_under_the_current_rules_chooses_the_default(tmp_path):
    ckpt = _run(tmp_path, score_rules())
    assert set(faithfulness_tables(tmp_path / "report", WEIGHTS)) == {REPORT_TABLE, "delete"}
    chosen = model_default_method(ckpt, {}, lambda: WEIGHTS)
    assert chosen.method == "attention" and "5 documents" in chosen.reason


def test_a_report_measured_under_other_score_rules_is_not_used(tmp_path):
    """Its table measured other scores than the methods make now ('docclass faithfulness'
    refuses to re-render it): the default falls back to the unmeasured one, and says why."""
    for scores in ("older rules", None):  # None: written before the rules were recorded
        run = tmp_path / str(scores)
        ckpt = _run(run, scores)
        assert faithfulness_tables(run / "report", WEIGHTS) == {}
        chosen = model_default_method(ckpt, {}, lambda: WEIGHTS)
        assert chosen.method == "conservative", scores
        assert "other rules" in chosen.reason and "docclass report" in chosen.reason


def test_a_folder_keeps_its_choice_only_under_the_rules_it_was_measured_by():
    """A model folder records the score rules its tables (and so its default) were measured
    under; a docclass whose methods score otherwise falls back to the unmeasured default."""
    recorded = {
        "default_method": {"method": "attention", "reason": "measured"},
        "faithfulness": {REPORT_TABLE: TABLE},
    }
    current = {**recorded, "score_rules": score_rules()}
    assert model_default_method("folder", current, lambda: WEIGHTS).method == "attention"
    # Older rules, or none recorded (exported before docclass kept them): not this one's.
    for folder in ({**recorded, "score_rules": "older rules"}, recorded):
        chosen = model_default_method("folder", folder, lambda: WEIGHTS)
        assert chosen.method == "conservative" and "other rules" in chosen.reason
    # Nothing measured: the recorded choice stands whatever the rules.
    unmeasured = {"default_method": {"method": "rollout", "reason": "chosen"}, "faithfulness": {}}
    assert model_default_method("folder", unmeasured, lambda: WEIGHTS).method == "rollout"
