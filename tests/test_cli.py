"""The command line end to end, in-process, on the tiny config; every config instantiates."""

import json
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import CONFIGS, write_ag_news_like, write_jsonl
from lightning.pytorch import Callback

from docclass.artifacts.checkpoint import ARTIFACT_KEY
from docclass.artifacts.load import checkpoint_fingerprint, read_artifact
from docclass.cli import DocClassCLI, main
from docclass.data.synthetic import planted_keyword_corpus
from docclass.interpret.records import read_jsonl
from docclass.train.datamodule import DocDataModule
from docclass.train.lit_module import DocClassifierModule

TINY = str(CONFIGS / "tiny.yaml")


def run_cli(*args: str) -> None:
    main([*args])


def test_fit_writes_metrics_figures_split_and_checkpoints(fitted):
    metrics = json.loads((fitted / "metrics.json").read_text())
    # Lightning's test loop and the report's word-score path read the test split separately:
    # the same documents must get the same predictions.
    records = read_jsonl(fitted / "report" / "explanations.jsonl.gz")
    names = metrics["test"]["label_names"]
    matrix = [[0] * len(names) for _ in names]
    for record in records:
        matrix[names.index(record["label"])][names.index(record["predicted"])] += 1
    assert metrics["test"]["confusion_matrix"] == matrix
    agree = sum(matrix[i][i] for i in range(len(names)))
    assert metrics["test"]["accuracy"] == pytest.approx(agree / len(records))
    assert metrics["test"]["n_documents"] == 213
    assert metrics["test"]["label_names"] == [
        "business",
        "entertainment",
        "politics",
        "sports",
        "tech",
    ]
    assert len(metrics["test"]["confusion_matrix"]) == 5
    assert metrics["train_time_s"] > 0 and metrics["epochs_trained"] == 2
    assert metrics["data"]["duplicates_removed"] == 100
    assert metrics["config"]["model"]["d_model"] == 32
    assert "acc" in metrics["val"]
    for figure in ("confusion_matrix.png", "training_curves.png"):
        assert (fitted / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    split = json.loads((fitted / "split.json").read_text())
    assert len(split["test"]) == 213 and not set(split["test"]) & set(split["train"])
    assert (fitted / "checkpoints" / "last.ckpt").is_file()
    assert (fitted / "checkpoints" / "best.ckpt").is_file()


def test_checkpoint_loads_without_pickle_and_carries_what_predicting_needs(fitted):
    checkpoint = torch.load(fitted / "checkpoints" / "last.ckpt", weights_only=True)
    # "last" means the final weights, even when the last epoch did not improve validation.
    assert (
        checkpoint["global_step"]
        == json.loads((fitted / "metrics.json").read_text())["global_steps"]
    )
    artifact = checkpoint[ARTIFACT_KEY]
    assert artifact["label_names"][0] == "business"
    assert artifact["model_config"]["d_model"] == 32
    assert artifact["max_tokens"] == 64
    assert json.loads(artifact["tokenizer"])["model"]["type"] == "BPE"
    assert read_artifact(fitted / "checkpoints" / "last.ckpt") == artifact


def from_checkpoint(subcommand: str, fitted, run_dir, *extra: str) -> None:
    last = str(fitted / "checkpoints" / "last.ckpt")
    run_cli(
        subcommand,
        "--config",
        TINY,
        "--ckpt_path",
        last,
        "--trainer.default_root_dir",
        str(run_dir),
        *extra,
    )


def test_test_from_checkpoint_reproduces_the_fit_report(fitted, tmp_path):
    # A changed vocabulary setting would train another tokenizer: the checkpoint's must win.
    from_checkpoint("test", fitted, tmp_path, "--data.tokenizer.vocab_size", "500")
    after_fit = json.loads((fitted / "metrics.json").read_text())["test"]
    from_checkpoint_metrics = json.loads((tmp_path / "metrics.json").read_text())["test"]
    assert from_checkpoint_metrics["confusion_matrix"] == after_fit["confusion_matrix"]


def test_fit_resumes_from_last_checkpoint(fitted, tmp_path):
    from_checkpoint(
        "fit", fitted, tmp_path, "--trainer.max_epochs", "3", "--report_after_fit", "false"
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    first = json.loads((fitted / "metrics.json").read_text())
    # Two epochs restored from the checkpoint, one more trained: the step count continues.
    assert metrics["epochs_trained"] == 3
    assert metrics["global_steps"] == first["global_steps"] * 3 // 2


def test_every_checkpoint_of_a_run_has_its_hash_recorded_beside_it(fitted):
    import hashlib

    checkpoints = sorted((fitted / "checkpoints").glob("*.ckpt"))
    assert [c.name for c in checkpoints] == ["best.ckpt", "last.ckpt"]
    for checkpoint in checkpoints:
        digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
        record = checkpoint.with_name(checkpoint.name + ".sha256").read_text()
        assert record == f"{digest}  {checkpoint.name}\n"


class FailPredictAtBatch1(Callback):
    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 1:
            raise RuntimeError("predict killed")


def test_predict_writes_one_row_per_document(fitted, tmp_path):
    # An earlier run's file: a predict that fails before its merge must not leave it standing.
    (tmp_path / "predictions.jsonl").write_text('{"id": "STALE"}\n')
    with pytest.raises(RuntimeError, match="predict killed"):
        from_checkpoint(
            "predict", fitted, tmp_path, "--trainer.callbacks+=test_cli.FailPredictAtBatch1"
        )
    assert not (tmp_path / "predictions.jsonl").exists()
    from_checkpoint("predict", fitted, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 213 and len({r["id"] for r in rows}) == 213
    # In the split's order, as a run on several processes writes it (batches come by length).
    from docclass.inference.reporting import load_documents

    ckpt = str(fitted / "checkpoints" / "last.ckpt")
    assert [r["id"] for r in rows] == list(load_documents(TINY, ckpt, "test").ids)
    assert "_index" not in rows[0] and not list(tmp_path.glob("predictions.jsonl.rank*"))
    assert abs(sum(rows[0]["probs"].values()) - 1) < 1e-4
    assert rows[0]["label"] == max(rows[0]["probs"], key=rows[0]["probs"].get)


@pytest.mark.fault(
    "`docclass predict` with a checkpoint whose run fitted a temperature",
    "`score` and `probs` calibrated as classify's, with `temperature` and `raw_probs` beside "
    "them (they were the raw softmax, under the names every other path calibrates)",
)
def test_predict_writes_the_calibrated_probabilities_classify_gives(fitted, tmp_path):
    import shutil

    from docclass.inference.classifier import DocClassifier
    from docclass.inference.reporting import load_documents

    run = tmp_path / "run"
    shutil.copytree(fitted / "checkpoints", run / "checkpoints")
    ckpt = run / "checkpoints" / "last.ckpt"
    by_weights = {checkpoint_fingerprint(ckpt): {"temperature": 2.5, "fit": "likelihood"}}
    (run / "calibration.json").write_text(json.dumps({"by_weights": by_weights}))
    run_cli("predict", "--config", TINY, "--ckpt_path", str(ckpt),
            "--trainer.default_root_dir", str(tmp_path / "out"))  # fmt: skip
    lines = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
    rows = {row["id"]: row for row in map(json.loads, lines)}
    test = load_documents(TINY, str(ckpt), "test")
    given = DocClassifier.load(ckpt, "cpu").predict(test.texts[:5])
    for doc_id, result in zip(test.ids[:5], given, strict=True):
        row = rows[doc_id]
        assert row["temperature"] == 2.5 and row["label"] == result["label"]
        assert row["probs"] == pytest.approx(result["probs"], abs=2e-6)
        raw = torch.tensor(list(row["raw_probs"].values()))
        calibrated = (raw.log() / 2.5).softmax(-1).tolist()
        assert list(row["probs"].values()) == pytest.approx(calibrated, abs=1e-5)
    # Under bf16 autocast too: the temperature was fitted on float32 logits, as classify's.
    run_cli("predict", "--config", TINY, "--ckpt_path", str(ckpt), "--trainer.precision",
            "bf16-mixed", "--trainer.default_root_dir", str(tmp_path / "bf16"))  # fmt: skip
    lines = (tmp_path / "bf16" / "predictions.jsonl").read_text().splitlines()
    in_bf16 = {row["id"]: row for row in map(json.loads, lines)}
    for doc_id, result in zip(test.ids[:5], given, strict=True):
        assert in_bf16[doc_id]["probs"] == pytest.approx(result["probs"], abs=2e-6)
    # A calibration that fitted no temperature leaves them raw, as /info says (null).
    by_weights[checkpoint_fingerprint(ckpt)] = {"temperature": 1.0, "fit": "none in range"}
    (run / "calibration.json").write_text(json.dumps({"by_weights": by_weights}))
    run_cli("predict", "--config", TINY, "--ckpt_path", str(ckpt),
            "--trainer.default_root_dir", str(tmp_path / "raw"))  # fmt: skip
    row = json.loads((tmp_path / "raw" / "predictions.jsonl").read_text().splitlines()[0])
    assert row["temperature"] is None and "raw_probs" not in row


@pytest.mark.fault(
    "`docclass test` of a run's checkpoint in the run's own folder, with other data settings "
    "(`--data.split_seed 1`)",
    "its figures go to metrics.<checkpoint>.json, which export reads for those weights; the "
    "fit's metrics.json and split.json stay whole (they were replaced: calibrate then fitted on "
    "documents the weights trained on); a warning says the split is not the one it trained on",
)
def test_testing_a_runs_checkpoint_keeps_its_split_and_its_metrics(fitted, tmp_path, caplog):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    kept = ("metrics.json", "split.json", "confusion_matrix.png", "training_curves.png")
    kept = {name: (run / name).read_bytes() for name in kept}
    best = run / "checkpoints" / "best.ckpt"
    with caplog.at_level("WARNING", logger="docclass"):
        run_cli("test", "--config", TINY, "--ckpt_path", str(best),
                "--trainer.default_root_dir", str(run), "--data.split_seed", "1")  # fmt: skip
    assert {name: (run / name).read_bytes() for name in kept} == kept
    assert "not the ones the checkpoint trained on" in caplog.text
    tested = json.loads((run / "metrics.best.json").read_text())
    assert tested["test"]["weights"] == checkpoint_fingerprint(best)
    assert (run / "confusion_matrix.best.png").stat().st_size > 0  # its own figure
    main(["export", "--ckpt", str(best), "--out", str(tmp_path / "best-model")])
    config = json.loads((tmp_path / "best-model" / "config.json").read_text())
    assert config["test"]["accuracy"] == tested["test"]["accuracy"]


@pytest.mark.parametrize("named", ["~/run/checkpoints/last.ckpt", "last"])
def test_a_checkpoint_named_from_the_home_folder_is_tested_as_it_was_trained(
    fitted, tmp_path, monkeypatch, named
):
    """``~`` in --ckpt_path (or in the run folder that ``last`` is looked up in): Lightning read
    no settings from the path as written, so the network was built from the command line's
    (here banded attention) and the trained weights loaded into it scored another model."""
    import shutil

    home = tmp_path / "home"
    shutil.copytree(fitted / "checkpoints", home / "run" / "checkpoints")
    monkeypatch.setenv("HOME", str(home))
    out = "~/run" if named == "last" else str(tmp_path / "tested")
    run_cli("test", "--config", TINY, "--ckpt_path", named, "--model.attention_window", "4",
            "--trainer.default_root_dir", out)  # fmt: skip
    written = home / "run" if named == "last" else tmp_path / "tested"
    tested = json.loads((written / "metrics.json").read_text())
    trained = json.loads((fitted / "metrics.json").read_text())
    assert tested["config"]["model"]["attention_window"] == 0
    assert tested["test"]["accuracy"] == trained["test"]["accuracy"]


@pytest.mark.fault(
    "test/validate/predict without `--ckpt_path`, or with `last`/`best` the run folder lacks",
    "one line, exit 2, nothing written (Lightning scored the untrained network as built)",
)
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "docclass test needs --ckpt_path"),
        (["--ckpt_path", "last"], "checkpoints holds no last.ckpt; give the run's"),
        (["--ckpt_path", "best"], "checkpoints holds no best.ckpt; give the run's"),
    ],
)
def test_testing_without_a_checkpoint_is_refused_not_an_untrained_network(
    capsys, tmp_path, flags, message
):
    # Lightning tested the network as built: random weights, plausible labels, status 0.
    line = one_line_failure(capsys, "test", "--config", TINY, *flags,
                            "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert message in line
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_model_folder_as_ckpt_path_is_one_line(capsys, fitted, tmp_path):
    folder = tmp_path / "model"
    run_cli("export", "--ckpt", str(fitted / "checkpoints" / "last.ckpt"), "--out", str(folder))
    line = one_line_failure(capsys, "test", "--config", TINY, "--ckpt_path", str(folder),
                            "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert "--ckpt_path takes a checkpoint file (.ckpt)" in line


@pytest.mark.skipif(sys.platform == "darwin", reason="Apple's GPU (mps) is there on a Mac")
def test_lightnings_own_refusals_of_the_trainer_settings_are_one_line(capsys, tmp_path):
    line = one_line_failure(capsys, "fit", "--config", TINY, "--trainer.accelerator", "mps",
                            "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert line.startswith("docclass: error: trainer settings: `MPSAccelerator` can not run")


def one_line_failure(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(*args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_impossible_model_setting_is_one_line(capsys, tmp_path):
    line = one_line_failure(
        capsys,
        "fit",
        "--config",
        TINY,
        "--model.d_model",
        "33",
        "--trainer.default_root_dir",
        str(tmp_path),
    )
    assert line.startswith("docclass: error: model config:") and "d_model (33)" in line


@pytest.mark.fault(
    "config: learned positions shorter than `data.max_tokens`",
    "refused at start-up in one line, not minutes into training",
)
def test_learned_positions_shorter_than_documents_refused_at_start(capsys, tmp_path):
    line = one_line_failure(
        capsys, "fit", "--config", TINY, "--model.positions", "learned",
        "--model.max_positions", "32", "--trainer.default_root_dir", str(tmp_path),
    )  # fmt: skip
    assert "learned positions cover 32 tokens but data.max_tokens is 64" in line


@pytest.mark.fault(
    "config: learned positions that cover `data.max_tokens` but not its batches padded to "
    "`data.pad_to_multiple`",
    "refused at start-up in one line naming pad_to_multiple, not at the first batch",
)
def test_learned_positions_shorter_than_padded_batches_refused_at_start(capsys, tmp_path):
    line = one_line_failure(
        capsys, "fit", "--config", TINY, "--model.positions", "learned",
        "--model.max_positions", "64", "--data.pad_to_multiple", "48",
        "--trainer.default_root_dir", str(tmp_path),
    )  # fmt: skip
    assert "data.pad_to_multiple 48 pads batches of data.max_tokens 64 to 96" in line


def test_whole_documents_without_truncation(tmp_path):
    run_cli(
        "fit", "--config", TINY, "--data.max_tokens", "null", "--data.eval_batch_size", "16",
        "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path),
        "--report_after_fit", "false", "--trainer.callbacks", "[]",
    )  # fmt: skip
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["data"]["test_truncated"] == 0 and metrics["test"]["n_documents"] == 213


@pytest.mark.fault(
    "fit: data file that does not exist",
    "one line naming the file, exit 2",
)
def test_missing_data_file_is_one_line(capsys, tmp_path):
    line = one_line_failure(
        capsys,
        "fit",
        "--config",
        TINY,
        "--data.source",
        str(tmp_path / "x.csv"),
        "--trainer.default_root_dir",
        str(tmp_path),
    )
    assert "x.csv: no such file" in line


@pytest.mark.fault(
    "test/predict: `--ckpt_path` that does not exist",
    "one line naming the file, exit 2",
)
def test_missing_checkpoint_is_one_line(capsys, tmp_path):
    line = one_line_failure(
        capsys,
        "test",
        "--config",
        TINY,
        "--ckpt_path",
        str(tmp_path / "gone.ckpt"),
        "--trainer.default_root_dir",
        str(tmp_path),
    )
    assert "gone.ckpt: no such file or folder" in line


@pytest.mark.fault(
    "test: truncated checkpoint file",
    "one line, exit 2, before any work",
)
def test_truncated_checkpoint_is_one_line(capsys, fitted, tmp_path):
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes((fitted / "checkpoints" / "last.ckpt").read_bytes()[:5000])
    line = one_line_failure(
        capsys,
        "test",
        "--config",
        TINY,
        "--ckpt_path",
        str(broken),
        "--trainer.default_root_dir",
        str(tmp_path),
    )
    assert "broken.ckpt: not a loadable checkpoint" in line


class _RunsCodeWhenUnpickled:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.fault(
    "a checkpoint that carries pickled code",
    "refused in one line; the code never runs (`weights_only=True`)",
)
def test_checkpoint_with_pickled_code_is_refused_before_anything_runs(capsys, tmp_path):
    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil.ckpt"
    torch.save({"docclass": {"format_version": 1}, "payload": _RunsCodeWhenUnpickled(marker)}, evil)
    line = one_line_failure(
        capsys, "test", "--config", TINY, "--ckpt_path", str(evil),
        "--trainer.default_root_dir", str(tmp_path),
    )  # fmt: skip
    assert "evil.ckpt: not a loadable checkpoint" in line
    assert not marker.exists()


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--model.d_modle", "64"], "d_modle"),  # unknown key
        (["--model.d_model", "abc"], "model.d_model"),  # wrong type
        (["--data.batch_size", "[1]"], "data.batch_size"),
        (["--trainer.max_epochs", "many"], "trainer.max_epochs"),
        (["--model.dropout", "-0.5"], "dropout"),  # impossible value
        (["--model.d_model", "30", "--model.n_heads", "4"], "d_model (30)"),
    ],
)
@pytest.mark.fault(
    "config: unknown key, wrong type, negative dropout, `d_model` not divisible by `n_heads`",
    "one line naming the key, exit 2: unknown keys and types before anything runs, impossible "
    "values when the model is built, before training",
)
def test_config_faults_are_one_line_naming_the_key(capsys, tmp_path, args, names):
    with pytest.raises(SystemExit) as exit_info:
        run_cli("fit", "--config", TINY, "--trainer.default_root_dir", str(tmp_path), *args)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("docclass: error:") and names in error[0]


def instantiate(config: str, *overrides: str) -> DocClassCLI:
    return DocClassCLI(
        DocClassifierModule, DocDataModule, run=False, args=["--config", config, *overrides]
    )


@pytest.mark.parametrize("name", ["bbc", "tiny", "bbc-long", "minilm", "minilm-128", "demo"])
def test_cpu_configs_instantiate(name, tmp_path):
    cli = instantiate(str(CONFIGS / f"{name}.yaml"), "--trainer.default_root_dir", str(tmp_path))
    assert cli.model.hparams.num_classes == 5
    assert cli.model.hparams.vocab_size == cli.datamodule.tokenizer.get_vocab_size()
    if name == "minilm":  # whole documents in the encoder's windows, the report uncapped
        assert cli.model.config.d_model == 384 and cli.model.config.window_tokens == 512
        assert cli.datamodule.max_tokens == 2048 and cli.config["report_max_documents"] == 1000
        assert cli.config["report_faithfulness_documents"]  # measured on a sample, said so
    if name == "demo":  # the recommended model's whole documents, its lowest 5 blocks cached
        assert cli.model.config.window_tokens == 512 and cli.datamodule.max_tokens == 2048
        assert cli.model.encoder_cache is not None and cli.model.encoder_cache.blocks == 5
        assert cli.config["report_max_documents"] == 1000  # the whole test split
        assert cli.config["report_faithfulness_documents"] == 10  # a sample, said so
        assert cli.trainer.max_epochs == 2
    if name == "minilm-128":  # the first window only
        assert cli.datamodule.max_tokens == 128 and cli.model.config.window_tokens == 0
    if name == "bbc-long":  # whole documents, read through windowed attention
        assert cli.datamodule.max_tokens is None and cli.model.config.attention_window == 64


HUB_CONFIGS = ["ag_news", "imdb", "yelp_review_full", "dbpedia_14"]


@pytest.mark.parametrize("name", HUB_CONFIGS + [f"{name}-minilm" for name in HUB_CONFIGS])
def test_hub_configs_instantiate_on_hub_shaped_local_data(name, tmp_path):
    """The GPU configs, with the hub swapped for a local folder in ag_news's layout."""
    root = write_ag_news_like(tmp_path / "data")
    cli = instantiate(
        str(CONFIGS / f"{name}.yaml"),
        "--data.source",
        str(root),
        "--data.text_column",
        "text",
        "--data.tokenizer.vocab_size",
        "500",
        "--data.num_workers",
        "0",
        "--trainer.accelerator",
        "cpu",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
    )
    assert cli.trainer.precision == "bf16-mixed"
    assert cli.model.hparams.num_classes == 4 and cli.model.config.n_layers >= 2
    if name.endswith("-minilm"):  # the encoder's own tokenizer, not one trained on the data
        assert cli.datamodule.tokenizer.get_vocab_size() == cli.model.config.vocab_size == 30522
        assert cli.model.config.norm == "post" and cli.model.config.window_tokens == 512


def test_console_script_help():
    result = subprocess.run(
        [sys.executable, "-m", "docclass.cli", "--help"], capture_output=True, text=True, check=True
    )
    for subcommand in ("fit", "validate", "test", "predict", "report"):
        assert subcommand in result.stdout


def test_report_help_and_its_one_line_errors(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        run_cli("report", "--help")
    assert exit_info.value.code == 0 and "--classes" in capsys.readouterr().out
    line = one_line_failure(
        capsys, "report", "--ckpt", str(tmp_path / "none.ckpt"), "--data", TINY, "--out", "x"
    )
    assert line.startswith("docclass: error:") and "none.ckpt: no such file or folder" in line


@pytest.mark.fault(
    "two CPU runs with the same seed",
    "identical metrics",
)
def test_same_seed_same_result_on_cpu(fitted, tmp_path):
    run_cli(
        "fit", "--config", TINY, "--trainer.default_root_dir", str(tmp_path),
        "--report_after_fit", "false",
    )  # fmt: skip
    first = json.loads((fitted / "metrics.json").read_text())
    second = json.loads((tmp_path / "metrics.json").read_text())
    assert second["test"] == first["test"] and second["val"] == first["val"]


def test_bf16_mixed_precision_trains(tmp_path):
    # A corpus a tiny model learns in seconds (one planted keyword decides the label), so a
    # broken bf16 path shows: the tiny BBC run predicts almost one class whatever the precision.
    corpus = tmp_path / "planted.jsonl"
    write_jsonl(corpus, planted_keyword_corpus(100))
    common = [
        "--config", TINY, "--data.source", str(corpus), "--data.max_docs_per_class", "null",
        "--data.max_tokens", "256", "--trainer.callbacks=[]", "--model.n_layers", "0",
    ]  # fmt: skip
    bf16 = tmp_path / "bf16"
    run_cli(
        "fit", *common, "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "6",
        "--report_after_fit", "false", "--trainer.default_root_dir", str(bf16),
    )  # fmt: skip
    metrics = json.loads((bf16 / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.9
    # Lightning's own autocast, seen from inside the step (model.cpu_train_precision left 32).
    assert metrics["training_steps_precision"] == "bfloat16 autocast"
    assert metrics["evaluation_precision"] == "bf16-mixed"  # the figures are autocast's
    # The same weights evaluated in float32 classify the test documents as bf16 did (±1).
    run_cli(
        "test", *common, "--ckpt_path", str(bf16 / "checkpoints" / "last.ckpt"),
        "--trainer.precision", "32-true", "--trainer.default_root_dir", str(tmp_path / "fp32"),
    )  # fmt: skip
    exact = json.loads((tmp_path / "fp32" / "metrics.json").read_text())
    assert exact["training_steps_precision"] is None  # no step trained in that process
    assert exact["evaluation_precision"] == "32-true"
    pairs = zip(metrics["test"]["confusion_matrix"], exact["test"]["confusion_matrix"], strict=True)
    differences = sum(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True))
    assert differences <= 2  # one document moved counts twice


def test_after_fit_calibration_runs_on_the_training_device(tmp_path, monkeypatch):
    """Lightning's teardown after testing moves the module to the CPU; the after-fit
    calibration and report must run on the device training ran on. No GPU here: the strategy
    claims one once testing is done (the edge this machine cannot reach), and the device
    handed on is recorded instead of used."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    import docclass.cli
    from docclass.train.lightning_cli import TrainingCLI

    tested_then = TrainingCLI.after_fit
    module_devices, handed_on = [], []

    def test_then_claim_a_gpu(cli):
        tested_then(cli)
        module_devices.append(str(cli.model.device))
        monkeypatch.setattr(
            SingleDeviceStrategy, "root_device", property(lambda _: torch.device("cuda", 0))
        )

    monkeypatch.setattr(TrainingCLI, "after_fit", test_then_claim_a_gpu)
    monkeypatch.setattr(
        docclass.cli, "calibrate_after_fit", lambda *args: handed_on.append(args[-1])
    )
    main(
        ["fit", "--config", TINY, "--trainer.max_epochs", "1", "--trainer.callbacks=[]",
         "--report_after_fit", "false", "--trainer.default_root_dir", str(tmp_path)]
    )  # fmt: skip
    assert module_devices == ["cpu"] and handed_on == ["cuda:0"]


def test_report_settings_are_the_configs_own():
    from docclass.train.lightning_cli import report_settings

    assert report_settings(CONFIGS / "minilm.yaml") == {
        "report_max_documents": 1000,
        "report_faithfulness_documents": yaml.safe_load((CONFIGS / "minilm.yaml").read_text())[
            "report_faithfulness_documents"
        ],
    }
    assert report_settings(CONFIGS / "bbc.yaml")["report_faithfulness_documents"] is None


@pytest.mark.fault(
    "test/validate/predict at another `--data.max_tokens` than the checkpoint's, or with a "
    "`--data.tokenizer_from` whose tokenizer or labels are not the checkpoint's",
    "one line naming the setting and the checkpoint's value; never figures of documents cut "
    "elsewhere than classify cuts them (which export puts on the card), nor of another "
    "tokenizer's ids",
)
def test_evaluating_with_another_length_or_tokenizer_than_the_checkpoints_is_refused(
    capsys, fitted, tmp_path
):
    import hashlib

    import torch

    last = fitted / "checkpoints" / "last.ckpt"
    limit = torch.load(last, weights_only=True)["docclass"]["max_tokens"]
    line = one_line_failure(capsys, "test", "--config", TINY, "--ckpt_path", str(last),
                            "--data.max_tokens", str(limit // 2),
                            "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert f"reads documents up to {limit} tokens" in line and f"--data.max_tokens {limit}" in line
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["docclass"]["label_names"] = checkpoint["docclass"]["label_names"][::-1]
    other = tmp_path / "other.ckpt"
    torch.save(checkpoint, other)
    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    (tmp_path / "other.ckpt.sha256").write_text(f"{digest}  other.ckpt\n")
    line = one_line_failure(capsys, "test", "--config", TINY, "--ckpt_path", str(last),
                            "--data.tokenizer_from", str(other),
                            "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert f"--data.tokenizer_from {other}: its tokenizer or labels are not those of" in line
    assert not (tmp_path / "run" / "metrics.json").exists()
    # A checkpoint of no limit is held to it as well.
    checkpoint["docclass"].update(label_names=checkpoint["docclass"]["label_names"][::-1],
                                  max_tokens=None)  # fmt: skip
    torch.save(checkpoint, other)
    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    (tmp_path / "other.ckpt.sha256").write_text(f"{digest}  other.ckpt\n")
    line = one_line_failure(capsys, "test", "--config", TINY, "--ckpt_path", str(other),
                            "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert "reads whole documents" in line and "--data.max_tokens null" in line
    # The model's own export folder names the same tokenizer (pretty-printed): accepted.
    folder = tmp_path / "model"
    run_cli("export", "--ckpt", str(last), "--out", str(folder))
    run_cli("test", "--config", TINY, "--ckpt_path", str(last), "--data.tokenizer_from",
            str(folder), "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.fault(
    "fit: `--report_max_documents` or `--report_faithfulness_documents` of 0 or below",
    "refused in one line before training, as `docclass report` refuses them (-3 was a "
    "traceback after training, 0 an empty report)",
)
@pytest.mark.parametrize("flag", ["--report_max_documents", "--report_faithfulness_documents"])
def test_after_fit_report_sizes_below_one_are_refused_before_training(capsys, tmp_path, flag):
    for value in ("0", "-3"):
        line = one_line_failure(
            capsys, "fit", "--config", TINY, flag, value, "--trainer.default_root_dir",
            str(tmp_path),
        )  # fmt: skip
        assert flag.removeprefix("--") in line and value in line, line
    assert not (tmp_path / "checkpoints").exists()
