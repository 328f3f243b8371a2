"""The benchmark's parts behave (its speed figures live in reports/, never in a test)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import CONFIGS

from benchmarks.throughput import (
    PaddedTransformerEncoder,
    _pad_to,
    load_config_datamodule,
    training_throughput,
)


def test_baseline_ignores_padding():
    model = PaddedTransformerEncoder(50, 3, 16, 2, 1, 2, 0.0, 32).eval()
    ids = torch.randint(1, 50, (2, 7))
    mask = torch.ones_like(ids, dtype=torch.bool)
    padded = _pad_to({"input_ids": ids, "attention_mask": mask}, 32)
    assert padded["input_ids"].shape == (2, 32) and padded["attention_mask"][:, 7:].sum() == 0
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, mask), model(padded["input_ids"], padded["attention_mask"]), atol=1e-5,
            rtol=1e-5,
        )  # fmt: skip


def test_training_throughput_compares_like_with_like(tmp_path):
    # The tiny config cuts every BBC article at 64 tokens (no padding at all); at 400 tokens
    # the shorter articles are padded.
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["data"]["max_tokens"] = 400
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    datamodule, model_section = load_config_datamodule(tmp_path / "config.yaml")
    figures = training_throughput(datamodule, model_section, steps=2, rounds=1)
    contenders = figures["contenders"]
    docclass = contenders["docclass"]
    padded = contenders["nn.TransformerEncoder, padded to the token limit"]
    bucketed = contenders["nn.TransformerEncoder, docclass's bucketed batches"]
    # Every figure recomputed here from the data, independently of the benchmark's own code.
    train = datamodule.tokenized("train")
    real = sum(len(ids) for ids in train["input_ids"])
    assert figures["epoch_real_tokens"] == real
    computed = sum(batch["attention_mask"].numel() for batch in datamodule.train_dataloader())
    assert docclass["padding_efficiency"] == pytest.approx(real / computed, abs=1e-4)
    assert bucketed["padding_efficiency"] == pytest.approx(real / computed, abs=1e-4)
    # The tutorial pipeline pads every document to the token limit.
    assert padded["padding_efficiency"] == pytest.approx(real / (len(train) * 400), abs=1e-4)
    assert padded["padding_efficiency"] < docclass["padding_efficiency"]
    for row in contenders.values():
        expected = docclass["real_tokens_per_s"] / row["real_tokens_per_s"]
        assert row["docclass_speed_ratio"] == pytest.approx(expected, abs=0.01)
    sizes = figures["parameters"]
    assert sizes["nn.TransformerEncoder"] == pytest.approx(sizes["docclass"], rel=0.2)


def test_training_flops_counts_every_product_of_a_training_step_exactly():
    from benchmarks.training_flops import training_flops

    datamodule, model_section = load_config_datamodule(CONFIGS / "tiny.yaml")
    figures = training_flops(datamodule, model_section, steps=2, device="cpu", precision="32")
    # The step counted is the epoch's first batch, the same on every call (seeded shuffle).
    batch = next(iter(datamodule.train_dataloader()))
    docs, tokens = batch["input_ids"].shape  # B, T
    width, classes = model_section["d_model"], datamodule.num_classes  # D, C
    hidden = model_section["ffn_mult"] * width
    # Counted by hand: a product of [m,k] by [k,n] is 2mkn FLOPs forward, and its backward
    # takes two more of the same size (the gradients of both factors).
    per_token_weights = (
        model_section["n_layers"] * (3 * width * width + width * width + 2 * width * hidden)
        + 2 * width * width  # the pool's key and value projections
    )
    per_document_weights = width * width + width * classes  # the pool's output, the read-out
    linear = 6 * (docs * tokens * per_token_weights + docs * per_document_weights)
    # Each block's attention: QKᵀ and AV, 2·B·T²·D each forward; backward recomputes QKᵀ and
    # takes four more (torch's count for its fused kernels).
    attention = model_section["n_layers"] * (2 + 5) * 2 * docs * tokens**2 * width
    # The pool's H queries against T keys, and its weighted average: 2·B·T·D each, ×3.
    pool = 2 * 3 * 2 * docs * tokens * width
    expected = (linear + attention + pool) / (docs * tokens)
    assert figures["flops_per_padded_token"] == pytest.approx(expected, abs=1)
    assert figures["real_tokens_per_s"] <= figures["padded_tokens_per_s"]
    assert figures["mfu_vs_dense_bf16_peak"] is None  # no known peak for a CPU


def test_streaming_speed_reads_every_document_each_way(tmp_path):
    from benchmarks.measures import streaming_speed

    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["data"]["max_tokens"] = 400
    config["data"]["max_docs_per_class"] = 40
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    figures = streaming_speed(str(tmp_path / "config.yaml"), rounds=1, train_steps=2)
    ways = figures["ways"]
    assert len(ways) == 4
    for row in ways.values():
        assert row["documents_per_epoch"] == figures["train_documents"] == 200
    unbucketed = ways["streamed, no bucketing (buffer = one batch)"]
    for name, row in ways.items():
        if row is not unbucketed:
            assert row["padding_efficiency"] > unbucketed["padding_efficiency"], name


def test_planted_noise_flips_only_training_labels_and_scores_the_flags():
    from benchmarks.label_audit import (
        flip_labels,
        label_audit_markdown,
        recovered_share,
        score_flags,
    )

    rows = [{"id": str(i), "text": "t", "label": "abc"[i % 3], "split": "train"} for i in range(90)]
    rows += [{"id": f"t{i}", "text": "t", "label": "a", "split": "test"} for i in range(10)]
    noisy, flipped = flip_labels(rows, ["a", "b", "c"], 0.1, seed=0)
    assert len(flipped) == 9 and not any(i.startswith("t") for i in flipped)
    changed = {row["id"] for row, was in zip(noisy, rows, strict=True) if row != was}
    assert changed == flipped  # every flip moved to another class, nothing else changed
    assert flip_labels(rows, ["a", "b", "c"], 0.1, seed=0)[1] == flipped
    assert score_flags({"1", "2", "x"}, {"1", "2", "3", "4"}) == {
        "flagged": 3, "flipped": 4, "found": 2, "precision": 2 / 3, "recall": 0.5,
    }  # fmt: skip
    assert recovered_share(0.97, 0.93, 0.95) == pytest.approx(0.5)
    assert recovered_share(0.95, 0.95, 0.96) is None  # the noise cost nothing
    run = {"rate": 0.05, "flipped": 4, "flagged": 3, "precision": 0.5, "recall": 0.5,
           "noisy_accuracy": 0.9, "cleaned_accuracy": 0.95, "recovered": 0.5,
           "cost_documents": 2, "won_back_documents": 1}  # fmt: skip
    figures = {"config": "c.yaml", "folds": 5, "seeds": [0, 1], "clean": {"accuracy": 0.97},
               "results": [{**run, "seed": 0}, {**run, "seed": 1, "precision": 0.7}]}  # fmt: skip
    table = label_audit_markdown(figures)
    assert "`--filter_by` rule" not in table  # runs from before the comparison have none
    assert "| 5% | 1 | 4 | 3 | 0.700 | 0.500 |" in table
    assert "5% over 2 flip seeds: precision 0.600 ± 0.141, recall 0.500 ± 0.000" in table
    assert "flip seeds 0, 1;" in table


def test_each_cleanlab_rule_is_scored_on_the_audit_s_own_probabilities(tmp_path, monkeypatch):
    pytest.importorskip("cleanlab")
    import benchmarks.label_audit as benchmark
    from benchmarks.label_audit import by_filter, label_audit_markdown

    rules = []

    def recorded(given, probs, rule):
        rules.append(rule)
        return find_label_issues(given, probs, rule)

    find_label_issues = benchmark.find_label_issues
    monkeypatch.setattr(benchmark, "find_label_issues", recorded)

    names = ["a", "b", "c"]
    noisy = [{"id": f"d{i}", "label": names[i % 3]} for i in range(60)]
    flipped = {"d3", "d17", "d40"}
    true = {row["id"]: names[(names.index(row["label"]) + 1) % 3] if row["id"] in flipped
            else row["label"] for row in noisy}  # fmt: skip
    folds = [[row["id"] for row in noisy if int(row["id"][1:]) % 2 == k] for k in (0, 1)]
    (tmp_path / "audit_plan.json").write_text(
        json.dumps({"label_names": names, "fold_splits": [{"test": f} for f in folds]})
    )
    for k, ids in enumerate(folds):
        # Each fold's file lists its documents in its own order: confident on the true class.
        ids = ids[::-1]
        probs = [[0.9 if n == true[i] else 0.05 for n in names] for i in ids]
        (tmp_path / "folds" / f"fold-{k}").mkdir(parents=True)
        (tmp_path / "folds" / f"fold-{k}" / "out_of_sample.json").write_text(
            json.dumps({"ids": ids, "probs": probs})
        )
    figures = by_filter(tmp_path, noisy, flipped)
    # Each rule is asked for by name, and scored under its own name.
    assert rules == list(figures) == ["prune_by_noise_rate", "prune_by_class", "both",
                                      "confident_learning",
                                      "calibrated_count_by_self_confidence"]  # fmt: skip
    for rule in figures.values():
        assert (rule["flagged"], rule["found"], rule["precision"], rule["recall"]) == (3, 3, 1, 1)
    run = {"rate": 0.05, "seed": 0, "flipped": 3, "flagged": 3, "precision": 1.0, "recall": 1.0,
           "noisy_accuracy": 0.9, "cleaned_accuracy": 0.95, "recovered": 0.5,
           "cost_documents": 2, "won_back_documents": 1, "by_filter": figures}  # fmt: skip
    table = label_audit_markdown({"config": "c.yaml", "folds": 2, "seeds": [0],
                                  "clean": {"accuracy": 0.97}, "results": [run]})  # fmt: skip
    assert "| 5% | 0 | 1.000 / 1.000 (3) | 1.000 / 1.000 (3) |" in table


def _planted_audit(folder, names, probs_by_id, order_seed):
    """An audit folder as ``docclass audit`` leaves it: two folds, each file in its own order."""
    ids = sorted(probs_by_id)
    folds = [ids[k::2] for k in (0, 1)]
    folder.mkdir(parents=True)
    (folder / "audit_plan.json").write_text(
        json.dumps({"label_names": names, "fold_splits": [{"test": f} for f in folds]})
    )
    rng = np.random.default_rng(order_seed)
    for k, fold_ids in enumerate(folds):
        fold_ids = [fold_ids[i] for i in rng.permutation(len(fold_ids))]
        (folder / "folds" / f"fold-{k}").mkdir(parents=True)
        (folder / "folds" / f"fold-{k}" / "out_of_sample.json").write_text(
            json.dumps({"ids": fold_ids, "probs": [probs_by_id[i] for i in fold_ids]})
        )


def test_an_ensemble_audit_averages_each_document_s_probabilities_by_id(tmp_path):
    pytest.importorskip("cleanlab")
    from benchmarks.label_audit import by_filter, ensemble_by_filter

    names = ["a", "b", "c"]
    noisy = [{"id": f"d{i:02d}", "label": names[i % 3]} for i in range(60)]
    flipped = {"d03", "d17", "d40"}
    true = {row["id"]: names[(names.index(row["label"]) + 1) % 3] if row["id"] in flipped
            else row["label"] for row in noisy}  # fmt: skip

    def confident(on):
        return [0.9 if n == on else 0.05 for n in names]

    # Each model is sure of a wrong class on one sound label; the other is surer of the given.
    first = {i: confident(true[i]) for i in true}
    second = dict(first)
    first["d05"], second["d05"] = confident("a"), [0.01, 0.01, 0.98]
    second["d08"], first["d08"] = confident("a"), [0.01, 0.01, 0.98]
    _planted_audit(tmp_path / "one", names, first, order_seed=0)
    _planted_audit(tmp_path / "two", names, second, order_seed=1)
    alone = by_filter(tmp_path / "one", noisy, flipped)["prune_by_noise_rate"]
    assert (alone["flagged"], alone["found"]) == (4, 3)
    mean = ensemble_by_filter([tmp_path / "one", tmp_path / "two"], noisy, flipped)
    assert {rule: (f["flagged"], f["found"]) for rule, f in mean.items()} == dict.fromkeys(
        mean, (3, 3)
    )
    # Another set of documents is refused, not averaged row by row.
    del second["d59"]
    _planted_audit(tmp_path / "three", names, second, order_seed=2)
    with pytest.raises(ValueError, match="not an audit of the same documents"):
        ensemble_by_filter([tmp_path / "one", tmp_path / "three"], noisy, flipped)


def test_an_ensemble_of_runs_folders_needs_the_same_flips_and_two_different_audits(tmp_path):
    pytest.importorskip("cleanlab")
    from benchmarks.label_audit import ensemble_by_filter, ensemble_markdown, ensemble_runs

    names = ["a", "b", "c"]
    noisy = [{"id": f"d{i:02d}", "label": names[i % 3]} for i in range(60)]
    probs = {row["id"]: [0.9 if n == row["label"] else 0.05 for n in names] for row in noisy}
    for run, flipped in (("one", ["d03"]), ("two", ["d03"]), ("other", ["d04"])):
        copy = tmp_path / run / "noise-0.05"
        _planted_audit(copy / "audit", names, probs, order_seed=0)
        (copy / "noisy.jsonl").write_text("".join(json.dumps(row) + "\n" for row in noisy))
        (copy / "flipped.json").write_text(json.dumps(flipped))
    figures = ensemble_runs([tmp_path / "one", tmp_path / "two"])
    assert [r["copy"] for r in figures["results"]] == ["noise-0.05"]
    rows = [line for line in ensemble_markdown(figures).splitlines() if "| noise-0.05 |" in line]
    assert len(rows) == 3 and "mean of the 2" in rows[-1]
    with pytest.raises(ValueError, match="another noisy copy"):
        ensemble_runs([tmp_path / "one", tmp_path / "other"])
    audit = tmp_path / "one" / "noise-0.05" / "audit"
    for twice in ([audit, audit], [audit]):
        with pytest.raises(ValueError, match="two or more different audits"):
            ensemble_by_filter(twice, noisy, {"d03"})


@pytest.mark.parametrize(
    "damage, message",
    [
        ("drop", "fold 1 scored other documents"),
        ("twice", "fold 1 scored other documents"),
        ("classes", "not once per class"),
    ],
)
def test_an_audit_scored_on_other_documents_or_classes_is_refused(tmp_path, damage, message):
    from benchmarks.label_audit import out_of_sample

    names = ["a", "b", "c"]
    probs = {f"d{i:02d}": [0.8, 0.1, 0.1] for i in range(10)}
    audit = tmp_path / "audit"
    _planted_audit(audit, names, probs, order_seed=0)
    assert sorted(out_of_sample(audit)[1]) == sorted(probs)
    path = audit / "folds" / "fold-1" / "out_of_sample.json"
    scored = json.loads(path.read_text())
    if damage == "drop":  # an unfinished fold: one of its documents never scored
        scored = {"ids": scored["ids"][1:], "probs": scored["probs"][1:]}
    elif damage == "twice":  # a document of fold 0 scored again in fold 1
        scored = {"ids": ["d00", *scored["ids"][1:]], "probs": scored["probs"]}
    else:
        scored["probs"][0] = [0.5, 0.5]
    path.write_text(json.dumps(scored))
    with pytest.raises(ValueError, match=message):
        out_of_sample(audit)


def test_an_ensemble_refuses_the_options_it_would_ignore():
    import subprocess
    import sys

    from helpers import REPO

    done = subprocess.run(
        [sys.executable, "-m", "scripts.label_audit", "--ensemble", "a", "b", "--rates", "0.1",
         "--folds", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--rates --folds would be ignored" in done.stderr.strip().splitlines()[-1]


def test_a_combined_audit_starts_from_the_first_audit_s_finished_runs_without_touching_them(
    tmp_path,
):
    from benchmarks.label_audit import _link_finished_runs
    from docclass.files import write_atomically

    audit = tmp_path / "audit"
    for name in ("folds/fold-0/metrics.json", "folds/fold-0/checkpoints/last.ckpt",
                 "retrain/baseline/metrics.json", "retrain/cleaned/metrics.json",
                 "report/index.html", "audit.json", "audit.csv", "audit_plan.json"):  # fmt: skip
        (audit / name).parent.mkdir(parents=True, exist_ok=True)
        (audit / name).write_text(name)
    combined = tmp_path / "audit-combined"
    _link_finished_runs(audit, combined)
    kept = sorted(str(p.relative_to(combined)) for p in combined.rglob("*") if p.is_file())
    # Not the flags, the page, nor the run without the first audit's flags: those are its rule's.
    assert kept == ["audit_plan.json", "folds/fold-0/checkpoints/last.ckpt",
                    "folds/fold-0/metrics.json", "retrain/baseline/metrics.json"]  # fmt: skip
    weights = combined / "folds/fold-0/checkpoints/last.ckpt"
    assert weights.stat().st_ino == (audit / "folds/fold-0/checkpoints/last.ckpt").stat().st_ino
    # docclass rewrites a file by replacing it, so the first audit's copy stays as it was
    # (what makes links safe here; that function's own tests are in tests/test_files.py).
    write_atomically(combined / "folds/fold-0/metrics.json", "rewritten")
    assert (audit / "folds/fold-0/metrics.json").read_text() == "folds/fold-0/metrics.json"
    # A combined audit already started is resumed as it is, not linked again.
    (audit / "folds" / "fold-1").mkdir()
    _link_finished_runs(audit, combined)
    assert not (combined / "folds" / "fold-1").exists()
    # A copy stopped before its plan was linked is made again, whole.
    (combined / "audit_plan.json").unlink()
    _link_finished_runs(audit, combined)
    assert (combined / "folds" / "fold-1").is_dir() and (combined / "audit_plan.json").is_file()


def test_a_combined_audit_must_flag_what_the_mean_of_the_two_audits_flags(tmp_path, monkeypatch):
    """``docclass audit`` trains folds, too slow here: it is replaced by one that leaves the
    folders it would (tests/inference/test_audit.py runs the real --with_audits end to end)."""
    pytest.importorskip("cleanlab")
    import benchmarks.label_audit as benchmark

    names = ["a", "b", "c"]
    noisy = [{"id": f"d{i:02d}", "label": names[i % 3]} for i in range(60)]
    flipped = ["d03", "d17", "d40"]
    true = {row["id"]: names[(names.index(row["label"]) + 1) % 3] if row["id"] in flipped
            else row["label"] for row in noisy}  # fmt: skip

    def confident(on):
        return [0.9 if n == on else 0.05 for n in names]

    # Both models are sure d05 ("c") is "a"; alone, the first is also wrong on two other sound
    # labels, the second on one.
    first = {i: confident(true[i]) for i in true}
    first["d05"] = first["d11"] = first["d14"] = confident("a")
    sure_c = [0.01, 0.01, 0.98]
    second = {**first, "d08": confident("a"), "d11": sure_c, "d14": sure_c}
    first["d08"] = sure_c
    copy = tmp_path / "noise-0.05"
    _planted_audit(copy / "audit", names, first, order_seed=0)
    (copy / "noisy.jsonl").write_text("".join(json.dumps(row) + "\n" for row in noisy))
    (copy / "flipped.json").write_text(json.dumps(flipped))
    commands, flags = [], {"ids": ["d03", "d05", "d17", "d40"]}

    def audit(command):
        commands.append(command)
        out = Path(command[command.index("--out") + 1])
        if out.name == "audit-minilm":
            if not out.exists():  # a finished audit is reused, as docclass does
                _planted_audit(out, names, second, order_seed=1)
            return 0
        assert (out / "audit_plan.json").is_file()  # linked from the first audit
        (out / "audit.csv").write_text("id\n" + "".join(f"{i}\n" for i in flags["ids"]))
        (out / "audit.json").write_text(json.dumps({"retrain": None}))
        return flags.get("exit", 0)

    monkeypatch.setattr(benchmark, "run_child", audit)
    figures = benchmark.combined_audit("c.yaml", "configs/minilm.yaml", copy, folds=2)
    assert (figures["flagged"], figures["found"]) == (4, 3)
    rule = "calibrated_count_by_self_confidence"
    # Each alone flags its own sure mistakes too; their mean flags none of them.
    assert figures["by_filter_other"][rule]["flagged"] == 5
    assert figures["by_filter_mean"][rule]["flagged"] == 4
    other, combined = commands
    assert other[other.index("--retrain") + 1] == "false"
    assert combined[combined.index("--config") + 1] == "c.yaml"
    assert json.loads(combined[combined.index("--with_audits") + 1]) == [str(copy / "audit-minilm")]
    assert combined[combined.index("--filter_by") + 1] == rule
    assert combined[combined.index("--retrain") + 1] == "true"
    # Flags other than the mean's would be scored as if they were the rule's: refused, even
    # when they count the same (4 flagged, 3 of them flips).
    flags["ids"] = ["d03", "d08", "d17", "d40"]
    with pytest.raises(RuntimeError, match="disagrees with its flags"):
        benchmark.combined_audit("c.yaml", "configs/minilm.yaml", copy, folds=2)
    # An audit that failed is not scored from what an earlier run left.
    flags["exit"] = 1
    with pytest.raises(RuntimeError, match="exited with 1"):
        benchmark.combined_audit("c.yaml", "configs/minilm.yaml", copy, folds=2)


def test_the_planted_noise_table_shows_the_combined_audits_beside_the_first():
    from benchmarks.label_audit import label_audit_markdown

    rule = {"flagged": 3, "flipped": 3, "found": 3, "precision": 1.0, "recall": 1.0}
    run = {"rate": 0.1, "flipped": 4, "flagged": 3, "precision": 0.5, "recall": 0.5,
           "noisy_accuracy": 0.9, "cleaned_accuracy": 0.95, "recovered": 0.5,
           "cost_documents": 2, "won_back_documents": 1}  # fmt: skip
    combined = {**run, "with_config": "m.yaml", "flagged": 5, "precision": 0.8,
                "cleaned_accuracy": 0.97, "by_filter_other": {"prune_by_noise_rate": rule},
                "by_filter_mean": {"prune_by_noise_rate": {**rule, "flagged": 9}}}  # fmt: skip
    figures = {"config": "c.yaml", "folds": 5, "seeds": [0, 1], "clean": {"accuracy": 0.97},
               "results": [{**run, "seed": s, "combined": {**combined, "precision": p}}
                           for s, p in ((0, 0.8), (1, 0.9))]}  # fmt: skip
    table = label_audit_markdown(figures)
    first, second = table.split("With `m.yaml` auditing the same copies")
    assert "| 10% | 1 | 4 | 3 | 0.500 | 0.500 | 0.9000 | 0.9500 |" in first
    assert "| 10% | 1 | 4 | 5 | 0.900 | 0.500 | 0.9000 | 0.9700 |" in second
    assert "10% over 2 flip seeds: precision 0.850 ± 0.071" in second
    assert "`m.yaml`'s own out-of-sample probabilities under each" in second
    assert "| 10% | 0 | 1.000 / 1.000 (9) |" in second.split("The mean of the two")[1]


def test_planted_noise_combines_each_copy_s_audit_with_the_second_config(tmp_path, monkeypatch):
    """The glue alone: training and auditing are replaced by what they would return."""
    import benchmarks.label_audit as benchmark

    calls = []
    audited = {"flipped": 9, "flagged": 9, "found": 8, "precision": 8 / 9, "recall": 8 / 9}
    retrain = {"baseline": {"accuracy": 0.90}, "cleaned": {"accuracy": 0.95}}

    def audit_copy(config, corpus, folder, rate, seed, folds):
        folder.mkdir(parents=True, exist_ok=True)
        return {"rate": rate, **audited, "audit": {"retrain": retrain}}

    def combined(config, other, folder, folds):
        calls.append((config, other, folder.name, folds))
        own = {"baseline": {"accuracy": 0.90}, "cleaned": {"accuracy": 0.96}}
        return {**audited, "with_config": other, "audit": {"retrain": own}}

    (tmp_path / "split.json").write_text("{}")
    monkeypatch.setattr(benchmark, "write_corpus", lambda config, out: None)
    monkeypatch.setattr(
        benchmark, "fit_run", lambda *a: {"test": {"accuracy": 0.97, "n_documents": 200}}
    )
    monkeypatch.setattr(benchmark, "audit_noisy_copy", audit_copy)
    monkeypatch.setattr(benchmark, "combined_audit", combined)
    figures = benchmark.planted_noise("c.yaml", tmp_path, [0.1], [0, 1], 3, "m.yaml")
    assert calls == [
        ("c.yaml", "m.yaml", "noise-0.10", 3),
        ("c.yaml", "m.yaml", "noise-0.10-seed1", 3),
    ]
    assert figures["with_config"] == "m.yaml"
    for run in figures["results"]:
        # The combined audit's re-training is scored against the same clean run.
        assert run["recovered"] == pytest.approx((0.95 - 0.90) / (0.97 - 0.90))
        assert run["combined"]["recovered"] == pytest.approx((0.96 - 0.90) / (0.97 - 0.90))
        assert run["combined"]["cost_documents"] == 14
    assert "combined" not in benchmark.planted_noise("c.yaml", tmp_path, [0.1])["results"][0]


@pytest.mark.parametrize("other", ["configs/bbc.yaml", "elsewhere/combined.yaml"])
def test_a_second_config_must_be_another_one_and_not_named_combined(other):
    import subprocess
    import sys

    from helpers import REPO

    done = subprocess.run(
        [sys.executable, "-m", "scripts.label_audit", "--with_config", other,
         "--runs", "/nonexistent"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--with_config" in done.stderr


def test_a_planted_noise_run_that_cannot_go_on_ends_in_one_line(tmp_path):
    # A user error (here a missing config; a SIGTERM's RunStopped takes the same path) ends the
    # script with docclass's one line and exit code 2, not a traceback that buries the fix.
    import subprocess
    import sys

    from helpers import REPO

    done = subprocess.run(
        [sys.executable, "-m", "scripts.label_audit", "--config", "configs/missing.yaml",
         "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "table")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "label_audit: error: configs/missing.yaml: config not found; pass a file from configs/"
    ]
