"""``make calibration``: every run of a sweep calibrated on its tested weights, and tabulated."""

import json
import shutil

from benchmarks.calibration import calibrate_run, calibration_markdown, summarise
from docclass.artifacts.load import checkpoint_fingerprint


def copy_run(fitted, folder):
    for name in ("checkpoints", "logs"):
        shutil.copytree(fitted / name, folder / name)
    for name in ("metrics.json", "split.json"):
        shutil.copy(fitted / name, folder / name)
    (folder / "calibration.json").unlink(missing_ok=True)
    return folder


def test_runs_are_calibrated_on_their_tested_weights_and_grouped_by_config(
    fitted, tmp_path, monkeypatch
):
    seeds = [copy_run(fitted, tmp_path / "corpus" / "config" / f"seed{s}") for s in (0, 1)]
    runs = [calibrate_run(folder) for folder in seeds]
    expected = json.loads((fitted / "calibration.json").read_text())["by_weights"]
    fingerprint = checkpoint_fingerprint(fitted / "checkpoints" / "last.ckpt")
    for run in runs:
        assert run["chosen"] == "named by metrics.json"
        # The fit's own calibration of the same weights, reproduced from the saved config.
        assert run["temperature"] == expected[fingerprint]["temperature"]
        assert run["test"]["after"] == expected[fingerprint]["test"]["after"]
    import benchmarks.calibration as sweep

    def refuse(*args, **kwargs):
        raise AssertionError("reuse computed the calibration again")

    monkeypatch.setattr(sweep, "calibrate", refuse)
    assert calibrate_run(seeds[0], reuse=True)["temperature"] == runs[0]["temperature"]
    summary = summarise(runs)
    assert list(summary) == ["corpus/config"] and summary["corpus/config"]["seeds"] == 2
    row = summary["corpus/config"]
    assert row["test_ece_after"]["mean"] == round(runs[0]["test"]["after"]["ece"], 4)
    assert row["test_ece_after"]["std"] == 0.0
    assert "| corpus/config | 2 |" in calibration_markdown(summary)


def test_a_run_whose_checkpoints_hold_other_weights_is_skipped_not_calibrated(fitted, tmp_path):
    folder = copy_run(fitted, tmp_path / "run")
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["test"]["weights"] = "weights no checkpoint holds"
    (folder / "metrics.json").write_text(json.dumps(metrics))
    assert calibrate_run(folder) == {
        "run": str(folder), "skipped": "no checkpoint holds the tested weights"
    }  # fmt: skip
    assert not (folder / "calibration.json").exists()


def test_a_run_is_calibrated_with_its_fits_config_and_split_never_another(fitted, tmp_path):
    import yaml

    folder = copy_run(fitted, tmp_path / "run")
    fit_config = yaml.safe_load(next((folder / "logs").glob("version_*/config.yaml")).read_text())
    # A later `docclass test` into the run folder saves its own config (its `verbose` is no
    # data setting); the fit's is the one that says how the run split its documents.
    (folder / "logs" / "version_98").mkdir()
    tested = {**fit_config, "verbose": True}
    (folder / "logs" / "version_98" / "config.yaml").write_text(yaml.safe_dump(tested))
    expected = json.loads((fitted / "calibration.json").read_text())["by_weights"]
    run = calibrate_run(folder)
    assert run["temperature"] == next(iter(expected.values()))["temperature"]
    # Without split.json, a newer fit's config with another split seed would rebuild another
    # split: its validation documents include ones the weights trained on. Skipped, unwritten.
    (folder / "split.json").unlink()
    (folder / "calibration.json").unlink()
    (folder / "logs" / "version_99").mkdir()
    other = {**fit_config, "data": {**fit_config["data"], "split_seed": 7}}
    (folder / "logs" / "version_99" / "config.yaml").write_text(yaml.safe_dump(other))
    run = calibrate_run(folder)
    assert "skipped" in run and "split" in run["skipped"], run
    assert not (folder / "calibration.json").exists()
