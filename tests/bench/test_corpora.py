"""`make corpora`'s bookkeeping: which folders are corpora, and that validation alone chooses."""

from pathlib import Path

from benchmarks.corpora import choose_on_validation, development_corpora, recommended_beats_svm


def sweep(val, test, f1):
    return {"val_acc": {"mean": val}, "test_acc": {"mean": test}, "test_macro_f1": {"mean": f1}}


def test_one_config_is_recommended_for_all_corpora_on_validation_never_on_test():
    corpora = {
        # b's better test figures play no part; a's small validation lead on one corpus is
        # outweighed by b's large one on the other.
        "x": {"candidates": {"a": sweep(0.97, 0.975, 0.975), "b": sweep(0.96, 0.99, 0.99)}},
        "y": {"candidates": {"a": sweep(0.80, 0.95, 0.95), "b": sweep(0.90, 0.85, 0.85)}},
    }
    assert choose_on_validation(corpora) == "b"
    assert choose_on_validation({"x": corpora["x"]}) == "a"
    result = {
        **corpora["x"],
        "recommended": "a",
        "svm": {"test_acc": 0.977, "test_macro_f1": 0.97},
    }
    assert recommended_beats_svm(result) == {"accuracy": False, "macro_f1": True}


def test_only_folders_with_all_three_splits_are_corpora(tmp_path):
    for name, files in {"whole": ("train", "val", "test"), "partial": ("train", "test")}.items():
        (tmp_path / name).mkdir()
        for split in files:
            (tmp_path / name / f"{split}.jsonl").write_text("")
    assert development_corpora(tmp_path) == {"whole": str(tmp_path / "whole")}
    assert development_corpora(tmp_path / "absent") == {}


def test_candidates_not_run_now_are_carried_over_and_marked():
    from benchmarks.corpora import carry_over

    candidates = {
        "a": ("a.yaml", []),
        "b": ("b.yaml", []),
        "c": ("c.yaml", []),
        "d": ("d2.yaml", []),
    }
    earlier = {
        "candidates": {
            "a": {**sweep(0.9, 0.9, 0.9), "config": "a.yaml"},
            "b": {**sweep(0.8, 0.8, 0.8), "config": "b.yaml"},
            "d": {**sweep(0.6, 0.6, 0.6), "config": "d.yaml"},  # d now means another config
            "gone": {**sweep(0.5, 0.5, 0.5), "config": "gone.yaml"},  # no longer a candidate
        }
    }
    now = {"candidates": {"b": sweep(0.85, 0.85, 0.85), "c": sweep(0.7, 0.7, 0.7)}}
    result = carry_over(now, earlier, candidates)
    assert sorted(result["candidates"]) == ["a", "b", "c"]
    assert result["candidates"]["a"]["carried_over"] is True
    assert result["candidates"]["b"]["val_acc"]["mean"] == 0.85  # run now: not replaced
    assert "carried_over" not in result["candidates"]["c"]
    # Only candidates measured on every corpus can be recommended.
    corpora = {"x": result, "y": {"candidates": {"b": sweep(0.5, 0.5, 0.5)}}}
    assert choose_on_validation(corpora) == "b"


def test_a_reused_sweep_resumes_a_stopped_run_from_its_last_checkpoint(tmp_path, monkeypatch):
    """A run folder with ``last.ckpt`` and no ``metrics.json`` (stopped after an epoch) goes on
    from that checkpoint under ``reuse``; without ``reuse``, or with no checkpoint, it starts
    over; a finished run is read, not run. (The resume itself: tests/train/test_resume.py.)"""
    import json

    from benchmarks import seeds

    commands = []
    real = seeds.subprocess.run

    def fit(command, **kwargs):
        if "fit" not in command:  # the machine summary's own calls
            return real(command, **kwargs)
        commands.append(command)
        run_dir = command[command.index("--trainer.default_root_dir") + 1]
        metrics = {"val": {"acc": 0.9}, "test": {"accuracy": 0.9, "macro_f1": 0.9},
                   "train_time_s": 1.0}  # fmt: skip
        (tmp_path / run_dir / "metrics.json").write_text(json.dumps(metrics))

    monkeypatch.setattr(seeds.subprocess, "run", fit)
    monkeypatch.chdir(tmp_path)
    for seed in (0, 1):
        (tmp_path / "out" / f"seed{seed}" / "checkpoints").mkdir(parents=True)
    (tmp_path / "out" / "seed0" / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    (tmp_path / "out" / "seed2").mkdir()
    (tmp_path / "out" / "seed2" / "metrics.json").write_text(
        json.dumps(
            {"val": {"acc": 0.8}, "test": {"accuracy": 0.8, "macro_f1": 0.8}, "train_time_s": 2.0}
        )  # fmt: skip
    )
    summary = seeds.run_seeds("c.yaml", [0, 1, 2], Path("out"), [], reuse=True)
    assert len(commands) == 2
    assert commands[0][-2:] == ["--ckpt_path", str(Path("out/seed0/checkpoints/last.ckpt"))]
    assert "--ckpt_path" not in commands[1]
    assert [run["resumed"] for run in summary["runs"][:2]] == [True, False]
    assert summary["runs"][2]["test_acc"] == 0.8  # read, not trained
    commands.clear()
    for seed in (0, 1):
        (tmp_path / "out" / f"seed{seed}" / "metrics.json").unlink()
    seeds.run_seeds("c.yaml", [0], Path("out"), [], reuse=False)
    assert "--ckpt_path" not in commands[0]
