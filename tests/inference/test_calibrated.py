"""Calibration of a trained run: fitted on validation after ``docclass fit``, named by the weights
it belongs to, and applied by the API, ``classify``, the server and an exported folder."""

import json
import math
import shutil

import pytest
import torch
from helpers import CONFIGS

from docclass import DocClassifier
from docclass.artifacts.load import checkpoint_fingerprint
from docclass.cli import main
from docclass.errors import CheckpointError, ConfigError, DataError
from docclass.inference.calibration import calibrate, labelled_logits
from docclass.inference.reporting import Documents, load_documents
from docclass.interpret.inputs import encode_documents

TEXTS = [
    "Shares in the bank rose after it reported record quarterly profits.",
    "The striker scored twice as the home side won the cup final.",
    "Ministers will publish the bill next week, the prime minister said.",
]


@pytest.fixture(scope="module")
def ckpt(fitted):
    return fitted / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def calibration(fitted, ckpt):
    """The fit's calibration of the weights it tested (``last.ckpt``)."""
    by_weights = json.loads((fitted / "calibration.json").read_text())["by_weights"]
    return by_weights[checkpoint_fingerprint(ckpt)]


def write_run(fitted, run, calibration: dict) -> None:
    """A copy of the fitted run's checkpoints with ``calibration`` as its calibration.json."""
    shutil.copytree(fitted / "checkpoints", run / "checkpoints")
    (run / "calibration.json").write_text(json.dumps({"by_weights": calibration}))


def raw_logits(classifier: DocClassifier, texts: list[str]) -> torch.Tensor:
    """The model's logits computed here, outside ``predict``."""
    trained = classifier.trained
    documents = encode_documents(trained.tokenizer, texts, trained.max_tokens)
    rows = [torch.tensor(d.token_ids) for d in documents]
    logits = []
    with torch.no_grad():
        for row in rows:
            logits.append(
                trained.model(row[None], torch.ones(1, len(row), dtype=torch.bool)).logits[0]
            )
    return torch.stack(logits).double()


def test_fit_writes_the_tested_weights_temperature_and_its_figures(fitted, ckpt, calibration):
    metrics = json.loads((fitted / "metrics.json").read_text())
    assert calibration["weights"] == checkpoint_fingerprint(ckpt) == metrics["test"]["weights"]
    assert metrics["calibration"]["temperature"] == calibration["temperature"] > 0
    assert "val split" in calibration["fitted_on"]
    assert calibration["test"]["after"]["documents"] == metrics["test"]["n_documents"]
    for split in ("validation", "test"):
        before, after = calibration[split]["before"], calibration[split]["after"]
        assert before["accuracy"] == after["accuracy"]  # no label changes
        assert metrics["calibration"][split]["after"] == after
    # Fitted on validation by likelihood: no other temperature does better there.
    assert calibration["validation"]["after"]["nll"] <= calibration["validation"]["before"]["nll"]


def test_the_temperature_is_the_validation_likelihoods_best(fitted, ckpt, calibration):
    """Validation NLL recomputed here from the model's logits: lowest at the stored T."""
    classifier = DocClassifier.load(ckpt, "cpu")
    validation = load_documents(str(CONFIGS / "tiny.yaml"), str(ckpt), "val")
    logits, labels = labelled_logits(classifier.trained, validation)
    temperature = calibration["temperature"]

    def nll(t: float) -> float:
        return torch.nn.functional.cross_entropy(logits.double() / t, labels).item()

    assert nll(temperature) == pytest.approx(calibration["validation"]["after"]["nll"], abs=1e-5)
    assert nll(temperature) < min(nll(temperature * 1.05), nll(temperature / 1.05))


def test_bf16_weights_are_calibrated_on_the_float32_logits_every_reader_computes(ckpt):
    """fit calibrates its live model, bf16 under ``bf16-true``; predict, classify and serve
    run those weights in float32, so the temperature is fitted on float32 logits."""
    import copy
    import dataclasses

    trained = DocClassifier.load(ckpt, "cpu").trained
    bf16 = copy.deepcopy(trained.model).to(torch.bfloat16)
    as_read = copy.deepcopy(bf16).float()  # the same bf16-rounded weights, as a reader has them
    validation = load_documents(str(CONFIGS / "tiny.yaml"), str(ckpt), "val")
    logits, labels = labelled_logits(dataclasses.replace(trained, model=bf16), validation)
    expected, same = labelled_logits(dataclasses.replace(trained, model=as_read), validation)
    assert torch.equal(labels, same) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)


def test_predict_divides_the_logits_by_the_temperature_and_keeps_the_raw_ones(ckpt, calibration):
    classifier = DocClassifier.load(ckpt, "cpu")
    assert classifier.calibrated and classifier.temperature == calibration["temperature"] != 1
    logits = raw_logits(classifier, TEXTS)
    calibrated = classifier.predict(TEXTS)
    raw = classifier.predict(TEXTS, calibrated=False)
    for row, (scaled, plain) in enumerate(zip(calibrated, raw, strict=True)):
        expected = torch.softmax(logits[row] / classifier.temperature, -1)
        unscaled = torch.softmax(logits[row], -1)
        assert [scaled["probs"][n] for n in classifier.labels] == pytest.approx(
            expected.tolist(), abs=2e-6
        )
        assert [plain["probs"][n] for n in classifier.labels] == pytest.approx(
            unscaled.tolist(), abs=2e-6
        )
        assert scaled["label"] == plain["label"]


def test_a_checkpoint_named_from_the_home_folder_keeps_its_run_s_facts(
    fitted, ckpt, calibration, tmp_path, monkeypatch
):
    """``~`` as the shell leaves it in ``--ckpt=~/…`` or a config: the same model as the
    expanded path, calibrated, with the same default method, and the same exported facts."""
    monkeypatch.setenv("HOME", str(fitted.parent))
    tilde = f"~/{fitted.name}/checkpoints/last.ckpt"
    named, plain = DocClassifier.load(tilde, "cpu"), DocClassifier.load(ckpt, "cpu")
    assert named.temperature == plain.temperature == calibration["temperature"] != 1
    assert named.default_method == plain.default_method
    assert named.predict(TEXTS) == plain.predict(TEXTS)
    main(["export", "--ckpt", tilde, "--out", str(tmp_path / "model")])
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["calibration"]["temperature"] == calibration["temperature"]


def test_other_weights_of_the_run_are_not_given_its_temperature(fitted, tmp_path, calibration):
    run = tmp_path / "run"
    write_run(fitted, run, {"someone else's": calibration})
    classifier = DocClassifier.load(run / "checkpoints" / "last.ckpt", "cpu")
    assert not classifier.calibrated and classifier.temperature == 1.0
    with pytest.raises(ConfigError, match="these weights have no calibration"):
        classifier.predict(TEXTS, min_probability=0.5)


@pytest.mark.parametrize("temperature", [True, -1.0, 0, 0.01, 50, "2", None])
def test_a_broken_temperature_is_one_line_naming_the_file(fitted, ckpt, tmp_path, temperature):
    run = tmp_path / "run"
    facts = json.loads((fitted / "calibration.json").read_text())["by_weights"]
    fingerprint = checkpoint_fingerprint(ckpt)
    write_run(fitted, run, {fingerprint: {**facts[fingerprint], "temperature": temperature}})
    with pytest.raises(CheckpointError, match=r"calibration.json: calibration temperature"):
        DocClassifier.load(run / "checkpoints" / "last.ckpt", "cpu")


def test_classify_writes_calibrated_probabilities_unless_told_not_to(ckpt, tmp_path):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    for flag, name in (("true", "calibrated"), ("false", "raw")):
        out = str(tmp_path / f"{name}.jsonl")
        main(["classify", str(inputs), "--ckpt", str(ckpt), "--out", out,
              "--calibrated", flag, "--device", "cpu"])  # fmt: skip
    classifier = DocClassifier.load(ckpt, "cpu")
    read = {
        name: [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        for name in ("calibrated", "raw")
    }
    assert [r["probs"] for r in read["calibrated"]] == [
        r["probs"] for r in classifier.predict(TEXTS)
    ]
    assert [r["probs"] for r in read["raw"]] == [
        r["probs"] for r in classifier.predict(TEXTS, calibrated=False)
    ]
    assert read["calibrated"][0]["probs"] != read["raw"][0]["probs"]


def test_an_exported_folder_carries_the_temperature(ckpt, calibration, tmp_path):
    out = tmp_path / "model"
    main(["export", "--ckpt", str(ckpt), "--out", str(out)])
    config = json.loads((out / "config.json").read_text())
    assert config["calibration"]["temperature"] == calibration["temperature"]
    assert "weights" not in config["calibration"]
    folder = DocClassifier.load(out, "cpu")
    assert folder.temperature == calibration["temperature"]
    assert folder.predict(TEXTS) == DocClassifier.load(ckpt, "cpu").predict(TEXTS)
    card = (out / "README.md").read_text()
    assert f"temperature of {calibration['temperature']:.3f}" in card
    before, after = calibration["test"]["before"]["ece"], calibration["test"]["after"]["ece"]
    assert f"| test | {before:.3f} → {after:.3f} |" in card


def test_labels_the_model_does_not_know_are_refused_not_mapped(ckpt):
    classifier = DocClassifier.load(ckpt, "cpu").trained
    documents = Documents(TEXTS, ["a", "b", "c"], ["business", "weather", "sport"], "mine")
    with pytest.raises(DataError, match=r"mine: labels \['sport', 'weather'\] are not among"):
        calibrate(classifier, documents)


@pytest.mark.fault(
    "calibrating weights whose logits are not finite (a diverged run)",
    "one line naming the documents; never the largest temperature stored as a fit",
)
def test_a_model_whose_logits_are_not_finite_is_refused_not_given_the_largest_temperature(ckpt):
    """One NaN logit made every slope NaN: the bisection ran to its bound and T = 20 was
    stored as the likelihood's choice, every later probability nearly uniform."""
    classifier = DocClassifier.load(ckpt, "cpu").trained

    def one_nan(model, tokens, mask):
        logits = model(tokens, mask).logits.clone()
        logits[0, 0] = float("nan")  # the first document of the first batch
        return logits

    documents = Documents(TEXTS, ["a", "b", "c"], ["business", "sports", "politics"], "mine")
    with pytest.raises(CheckpointError, match="mine: the model's logits are not finite on 1 of 3"):
        calibrate(classifier, documents, logits_of=one_nan)


def test_the_command_calibrates_a_checkpoint_as_the_fit_did(fitted, ckpt, calibration, tmp_path):
    """``docclass calibrate`` on a copy of the run: the same temperature and figures, kept
    beside another checkpoint's entry."""
    run = tmp_path / "run"
    write_run(fitted, run, {"another checkpoint's weights": {"temperature": 2.0}})
    shutil.copy(fitted / "split.json", run / "split.json")
    shutil.copy(fitted / "metrics.json", run / "metrics.json")  # its source: the config's
    facts = main_error(
        ["calibrate", "--ckpt", str(run / "checkpoints" / "last.ckpt"),
         "--data", str(CONFIGS / "tiny.yaml")]
    )  # fmt: skip
    assert facts["temperature"] == calibration["temperature"]
    assert facts["test"]["after"] == calibration["test"]["after"]
    assert facts["abstention"] == calibration["abstention"]
    stored = json.loads((run / "calibration.json").read_text())["by_weights"]
    assert set(stored) == {"another checkpoint's weights", calibration["weights"]}


def test_the_command_fits_on_validation_only_and_into_a_run_folder(ckpt, tmp_path):
    config = str(CONFIGS / "tiny.yaml")
    with pytest.raises(Exception, match="test_split"):
        main_error(["calibrate", "--ckpt", str(ckpt), "--data", config, "--test_split", "val"])
    with pytest.raises(DataError, match="give the run's YAML config"):
        main_error(["calibrate", "--ckpt", str(ckpt), "--data", "bbc"])
    loose = tmp_path / "last.ckpt"
    shutil.copy(ckpt, loose)
    with pytest.raises(CheckpointError, match="not a checkpoint in a training run"):
        main_error(["calibrate", "--ckpt", str(loose), "--data", config])
    missing = ckpt.parent / "missing.ckpt"  # in a run's checkpoints/ folder, but no file
    with pytest.raises(CheckpointError, match=r"missing.ckpt: no such file"):
        main_error(["calibrate", "--ckpt", str(missing), "--data", config])


def test_the_command_refuses_a_config_that_reads_another_source(fitted, tmp_path):
    """A run trained on one table, calibrated with a config naming another: the split's ids
    would pick other documents, so the command stops before fitting anything."""
    run = tmp_path / "run"
    write_run(fitted, run, {})
    shutil.copy(fitted / "split.json", run / "split.json")
    metrics = json.loads((fitted / "metrics.json").read_text())
    metrics["data"]["source"] = "my_docs.csv"
    (run / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(DataError, match="was trained on my_docs.csv"):
        main_error(["calibrate", "--ckpt", str(run / "checkpoints" / "last.ckpt"),
                    "--data", str(CONFIGS / "tiny.yaml")])  # fmt: skip
    assert json.loads((run / "calibration.json").read_text()) == {"by_weights": {}}


def test_the_command_refuses_a_split_file_the_checkpoint_did_not_train_on(fitted, tmp_path):
    """A split.json another fit left in the run folder: one training document swapped with a
    validation one. The temperature would be fitted partly on a document the weights learnt."""
    run = tmp_path / "run"
    write_run(fitted, run, {})
    split = json.loads((fitted / "split.json").read_text())
    split["train"][0], split["val"][0] = split["val"][0], split["train"][0]
    (run / "split.json").write_text(json.dumps(split))
    shutil.copy(fitted / "metrics.json", run / "metrics.json")
    with pytest.raises(DataError, match="trained on another split than --data .* with .*split"):
        main_error(["calibrate", "--ckpt", str(run / "checkpoints" / "last.ckpt"),
                    "--data", str(CONFIGS / "tiny.yaml")])  # fmt: skip
    assert json.loads((run / "calibration.json").read_text()) == {"by_weights": {}}


def test_report_and_faithfulness_refuse_a_split_the_checkpoint_did_not_train_on(fitted, tmp_path):
    """As calibrate does: their accuracy and faithfulness table (which picks the default
    method) were measured partly on documents the weights had learnt, in silence."""
    run = tmp_path / "run"
    write_run(fitted, run, {})
    split = json.loads((fitted / "split.json").read_text())
    split["train"][0], split["test"][0] = split["test"][0], split["train"][0]
    (run / "split.json").write_text(json.dumps(split))
    ckpt = str(run / "checkpoints" / "last.ckpt")
    for command in ("report", "faithfulness"):
        with pytest.raises(DataError, match=f"trained on another split .*; {command} with"):
            main_error([command, "--ckpt", ckpt, "--data", str(CONFIGS / "tiny.yaml"),
                        "--out", str(tmp_path / command)])  # fmt: skip
        assert not (tmp_path / command).exists()


def test_a_report_from_a_config_explains_the_runs_own_test_split(fitted, tmp_path):
    """The run's split.json decides, whatever the config's split seed says now."""
    config = tmp_path / "other-seed.yaml"
    config.write_text((CONFIGS / "tiny.yaml").read_text() + "  split_seed: 7\n")
    documents = load_documents(str(config), str(fitted / "checkpoints" / "last.ckpt"))
    test_ids = json.loads((fitted / "split.json").read_text())["test"]
    assert sorted(documents.ids) == sorted(map(str, test_ids))


@pytest.mark.fault(
    "report/faithfulness of an exported model folder (or hub model) with a config of another "
    "split seed",
    "refused in one line naming the folder (its config.json records the split it trained on); "
    "another corpus, or a source written otherwise, gets a warning",
)
def test_a_model_folder_reported_from_a_config_is_held_to_its_checkpoints_split(
    ckpt, tmp_path, monkeypatch
):
    """An exported folder has no run folder and no split.json: a config of another split seed
    made a "test" split partly of documents the weights trained on, in silence. The folder
    carries the split it trained on, and holds the config to it."""
    folder = tmp_path / "model"
    main(["export", "--ckpt", str(ckpt), "--out", str(folder)])
    assert json.loads((folder / "config.json").read_text())["split"]["sha256"]
    same = load_documents(str(CONFIGS / "tiny.yaml"), str(folder))
    assert same.ids == load_documents(str(CONFIGS / "tiny.yaml"), str(ckpt)).ids
    other_seed = tmp_path / "other-seed.yaml"
    other_seed.write_text((CONFIGS / "tiny.yaml").read_text() + "  split_seed: 7\n")
    with pytest.raises(DataError, match="model: trained on another split .*; report with"):
        load_documents(str(other_seed), str(folder))
    # The same folder as a hub model (its download), which is neither file nor folder as named.
    monkeypatch.setattr("docclass.artifacts.locate.download_hub_model", lambda hub_id: folder)
    with pytest.raises(DataError, match=r"hub:me/tiny@0+: trained on another split"):
        load_documents(str(other_seed), f"hub:me/tiny@{'0' * 40}")


def test_a_model_folder_of_a_source_named_otherwise_says_its_split_differs(ckpt, tmp_path, caplog):
    """A folder keeps its source as typed at training: the same corpus written another way
    cannot be told from another corpus, so a split other than the trained one is said."""
    from docclass.artifacts.folder import CARD, MODEL_FOLDER_FILES
    from docclass.artifacts.hashing import write_manifest

    folder = tmp_path / "model"
    main(["export", "--ckpt", str(ckpt), "--out", str(folder)])
    config = json.loads((folder / "config.json").read_text())
    config["data"]["source"] = "/training/machine/bbc"
    (folder / "config.json").write_text(json.dumps(config))
    write_manifest(folder, [*MODEL_FOLDER_FILES, CARD])
    other_seed = tmp_path / "other-seed.yaml"
    other_seed.write_text((CONFIGS / "tiny.yaml").read_text() + "  split_seed: 7\n")
    with caplog.at_level("WARNING", logger="docclass"):
        load_documents(str(other_seed), str(folder))
    assert "trained on /training/machine/bbc, a split other than the one" in caplog.text


def test_a_local_source_a_folder_names_by_its_path_digest_is_held_to_its_split(tmp_path):
    """An export keeps a local source's last part and its resolved path's digest: only that
    path is the same corpus (held to the folder's split); another corpus's file of the same
    name is not."""
    from docclass.artifacts.folder import path_digest
    from docclass.inference.reporting import names_the_folders_source

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.csv").write_text("text,label\n")
    recorded = {
        "source": "train.csv",
        "source_path_sha256": path_digest(tmp_path / "a" / "train.csv"),
    }
    local = {"data": recorded}
    assert names_the_folders_source(local, str(tmp_path / "a" / "train.csv"))
    assert not names_the_folders_source(local, str(tmp_path / "b" / "train.csv"))
    assert not names_the_folders_source(local, "train.csv")  # not a file here
    assert names_the_folders_source({"data": {"source": "bbc"}}, "bbc")
    assert not names_the_folders_source({}, "bbc")


def test_a_report_from_another_corpus_config_explains_that_corpus(fitted, tmp_path):
    """The run's split.json is the run's corpus's: another corpus's config splits its own."""
    table = tmp_path / "other.csv"
    names = ["business", "entertainment", "politics", "sports", "tech"]
    rows = [f"{name} story number {i} about {name},{name}" for i in range(20) for name in names]
    table.write_text("text,label\n" + "\n".join(rows) + "\n")
    config = tmp_path / "other.yaml"
    config.write_text(
        (CONFIGS / "tiny.yaml").read_text().replace("source: bbc", f"source: {table}")
    )
    documents = load_documents(str(config), str(fitted / "checkpoints" / "last.ckpt"))
    assert documents.ids and all("story number" in text for text in documents.texts)


def main_error(argv: list[str]):
    """A command run in this process, its errors raised rather than printed."""
    from docclass.cli import run_command

    return run_command(argv[0], argv[1:])


def test_the_report_shows_the_calibrated_probabilities_and_the_reliability_diagram(
    fitted, calibration
):
    from docclass.interpret.records import read_jsonl

    temperature = calibration["temperature"]
    index = (fitted / "report" / "index.html").read_text()
    assert 'id="calibration-table"' in index
    assert f"temperature of <b>{temperature:.3f}</b>" in index
    test = calibration["test"]
    assert f"{test['before']['ece']:.3f} → {test['after']['ece']:.3f}" in index
    assert 'alt="reliability diagram of the test split' in index
    assert 'src="data:image/png;base64,' in index.split('id="calibration-table"')[1]
    checked = 0
    for record in read_jsonl(fitted / "report" / "explanations.jsonl.gz"):
        assert record["temperature"] == temperature
        names = [name for name in record["logits"] if record["probs"][name] > 1e-3]
        for a, b in zip(names, names[1:], strict=False):
            # Between two classes the page's probabilities are the logits' gap divided by T.
            ratio = math.log(record["probs"][a] / record["probs"][b])
            gap = (record["logits"][a] - record["logits"][b]) / temperature
            assert ratio == pytest.approx(gap, abs=1e-3)
            checked += 1
    assert checked > 100


def test_thresholds_are_chosen_on_validation_and_scored_on_test(
    fitted, ckpt, calibration, monkeypatch
):
    """The acceptance figures, recomputed here through ``predict`` on each split: the fit's
    stored ones (the tiny model reaches neither 95 % nor 99 %: a brute-force search over every
    threshold the validation split offers confirms that none reaches it), and those of targets
    it reaches, whose thresholds must be scored on the test split's own documents."""
    import docclass.inference.calibration as calibration_module
    from docclass.calibration import accepted_at, least_documents

    classifier = DocClassifier.load(ckpt, "cpu")
    assert set(calibration["abstention"]) == {"0.95", "0.99"}
    splits = {
        name: load_documents(str(CONFIGS / "tiny.yaml"), str(ckpt), split)
        for split, name in (("val", "validation"), ("test", "test"))
    }
    monkeypatch.setattr(calibration_module, "PRECISION_TARGETS", (0.2, 0.4))
    reachable = calibrate(classifier.trained, splits["validation"], splits["test"])
    assert reachable["temperature"] == classifier.temperature
    assert all(chosen["threshold"] is not None for chosen in reachable["abstention"].values())
    for name, documents in splits.items():
        results = classifier.predict(documents.texts)
        probs = torch.tensor([[r["probs"][n] for n in classifier.labels] for r in results])
        labels = torch.tensor([classifier.labels.index(label) for label in documents.labels])
        scores = [r["score"] for r in results]
        right = [r["label"] == label for r, label in zip(results, documents.labels, strict=True)]
        for facts in (calibration, reachable):
            for target, chosen in facts["abstention"].items():
                threshold, target = chosen["threshold"], float(target)
                assert chosen[name] == accepted_at(probs, labels, threshold)
                if threshold is not None:
                    accepted = [i for i, s in enumerate(scores) if s >= threshold]
                    assert chosen[name]["documents"] == len(accepted) > 0
                    precision = sum(right[i] for i in accepted) / len(accepted)
                    assert chosen[name]["precision"] == pytest.approx(precision, abs=1e-6)
                    if name == "validation":
                        assert precision >= target and len(accepted) >= least_documents(target)
                elif name == "validation":
                    for cut in set(scores):
                        accepted = [i for i, s in enumerate(scores) if s >= cut]
                        if len(accepted) >= least_documents(target):
                            assert sum(right[i] for i in accepted) < target * len(accepted)
    curve = calibration["test"]["risk_coverage"]
    assert curve[-1]["coverage"] == 1.0
    assert curve[-1]["risk"] == pytest.approx(1 - calibration["test"]["after"]["accuracy"])


def test_below_the_minimum_probability_a_label_is_withheld_not_guessed(ckpt):
    classifier = DocClassifier.load(ckpt, "cpu")
    texts = TEXTS * 2 + ["Shares fell.", "The match ended in a draw.", "A new phone."]
    plain = classifier.predict(texts)
    cut = sorted(r["score"] for r in plain)[len(plain) // 2]
    marked = classifier.predict(texts, min_probability=cut)
    assert {r["uncertain"] for r in marked} == {True, False}
    for before, after in zip(plain, marked, strict=True):
        assert after["predicted"] == before["label"] and after["probs"] == before["probs"]
        assert after["uncertain"] == (before["score"] < cut)
        assert after["label"] == (None if after["uncertain"] else before["label"])
    with pytest.raises(ConfigError, match=r"min_probability 1.5: give a probability in \(0, 1\]"):
        classifier.predict(texts, min_probability=1.5)
    with pytest.raises(ConfigError, match="thresholds apply to the calibrated probabilities"):
        classifier.predict(texts, min_probability=cut, calibrated=False)


def test_classify_marks_uncertain_rows_in_their_own_columns(ckpt, tmp_path, capsys):
    import csv

    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    scores = [r["score"] for r in DocClassifier.load(ckpt, "cpu").predict(TEXTS)]
    cut = sorted(scores)[1]
    out = tmp_path / "rows.csv"
    main(["classify", str(inputs), "--ckpt", str(ckpt), "--out", str(out),
          "--min_probability", str(cut), "--device", "cpu"])  # fmt: skip
    rows = list(csv.DictReader(out.open()))
    assert [row["uncertain"] == "True" for row in rows] == [s < cut for s in scores]
    assert all(row["predicted"] for row in rows)
    assert all((row["label"] == "") == (row["uncertain"] == "True") for row in rows)
    assert "1 uncertain" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["classify", str(inputs), "--ckpt", str(ckpt), "--min_probability", "0"])
    assert "--min_probability 0.0: give a probability in (0, 1]" in capsys.readouterr().err


def test_the_report_lists_the_thresholds_and_draws_risk_against_coverage(fitted, calibration):
    index = (fitted / "report" / "index.html").read_text()
    table = index.split('id="abstention-table"')[1].split("</table>")[0]
    for target, chosen in calibration["abstention"].items():
        threshold = chosen["threshold"]
        expected = "none reaches it" if threshold is None else f"{threshold:.4f}"
        assert f'<td>{100 * float(target):g} %</td><td class="num">{expected}</td>' in table
    assert 'alt="risk against coverage on the test split"' in index


def test_thresholds_come_from_validation_and_are_only_scored_on_test():
    """With a model good enough for both targets: each threshold is validation's own, rests
    on enough documents, and what it accepts on test is recomputed here."""
    from docclass.calibration import accepted_at, least_documents, precision_threshold
    from docclass.inference.calibration import abstention

    def split(seed: int):
        generator = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, 4, (3_000,), generator=generator)
        logits = torch.randn(3_000, 4, generator=generator)
        logits[torch.arange(3_000), labels] += 4 * torch.rand(3_000, generator=generator) + 1
        return logits, labels

    validation, test = split(0), split(1)
    targets = abstention(validation, test, temperature=0.8)
    for name, chosen in targets.items():
        target = float(name)
        val_probs = torch.softmax(validation[0] / 0.8, -1)
        test_probs = torch.softmax(test[0] / 0.8, -1)
        assert chosen["threshold"] == precision_threshold(val_probs, validation[1], target)
        assert chosen["threshold"] != precision_threshold(test_probs, test[1], target)
        assert chosen["validation"]["precision"] >= target
        assert chosen["validation"]["documents"] >= least_documents(target)
        assert chosen["test"] == accepted_at(test_probs, test[1], chosen["threshold"])
        assert 0.05 < chosen["test"]["coverage"] < 1


def test_where_no_temperature_fits_the_card_and_report_say_the_probabilities_are_raw(
    calibration,
):
    from docclass.report.html import _calibration_rows
    from docclass.report.model_card import _calibration_section

    why = "no temperature in the range fits (a validation split the model gets entirely right)"
    unfitted = {**calibration, "temperature": 1.0, "fit": why}
    assert f"The probabilities are the raw softmax: {why}." in _calibration_section(
        {"calibration": unfitted}
    )
    assert _calibration_rows(unfitted)["unfitted"] == why
    assert _calibration_rows(calibration)["unfitted"] is None


def test_a_stored_threshold_accepts_on_predict_what_it_accepted_when_chosen(
    fitted, ckpt, monkeypatch
):
    """With a target the tiny model reaches: ``predict(min_probability=threshold)`` accepts
    exactly the validation documents the stored figures count, at their precision."""
    import docclass.inference.calibration as calibration_module
    from docclass.inference.calibration import calibrate

    monkeypatch.setattr(calibration_module, "PRECISION_TARGETS", (0.2,))
    classifier = DocClassifier.load(ckpt, "cpu")
    validation = load_documents(str(CONFIGS / "tiny.yaml"), str(ckpt), "val")
    facts = calibrate(classifier.trained, validation)
    assert facts["temperature"] == classifier.temperature
    chosen = facts["abstention"]["0.2"]
    assert chosen["threshold"] is not None and chosen["validation"]["documents"] >= 2
    results = classifier.predict(validation.texts, min_probability=chosen["threshold"])
    accepted = [
        (r["label"], label)
        for r, label in zip(results, validation.labels, strict=True)
        if not r["uncertain"]
    ]
    assert len(accepted) == chosen["validation"]["documents"]
    precision = sum(a == b for a, b in accepted) / len(accepted)
    assert precision == pytest.approx(chosen["validation"]["precision"], abs=1e-6)
    assert precision >= 0.2


def test_a_calibration_file_of_an_earlier_format_is_refused_not_ignored(fitted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fitted / "checkpoints", run / "checkpoints")
    (run / "calibration.json").write_text(json.dumps({"weights": "w", "temperature": 0.7}))
    with pytest.raises(CheckpointError, match="written by an earlier docclass"):
        DocClassifier.load(run / "checkpoints" / "last.ckpt", "cpu")


def test_the_source_check_follows_a_path_from_any_folder(tmp_path, monkeypatch):
    """The run recorded where its relative source pointed: another spelling of that file from
    another folder is the same source; another file with the same name pattern is not."""
    from docclass.inference.calibration import check_same_source

    (tmp_path / "data").mkdir()
    (tmp_path / "sub").mkdir()
    for name in ("a.csv", "b.csv"):
        (tmp_path / "data" / name).write_text("text,label\nx,y\n")
    run = tmp_path / "run"
    run.mkdir()
    data = {"source": "data/a.csv", "source_path": str(tmp_path / "data" / "a.csv")}
    (run / "metrics.json").write_text(json.dumps({"data": data}))
    monkeypatch.chdir(tmp_path / "sub")
    check_same_source(run, "config.yaml", "../data/a.csv")
    check_same_source(run, "config.yaml", str(tmp_path / "data" / "a.csv"))
    (tmp_path / "sub" / "bbc").mkdir()  # a folder by the embedded corpus's name: not it
    for other in ("../data/b.csv", "bbc", "data/a.csv"):  # the last: not here, not fetched
        with pytest.raises(DataError, match="was trained on .*data/a.csv"):
            check_same_source(run, "config.yaml", other)
