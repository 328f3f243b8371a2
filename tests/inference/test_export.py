"""``docclass export`` / ``push``: model folders the hub understands, loaded back exactly.

The hub itself is the one edge replaced: :class:`LocalHub` stands in for ``HfApi`` (uploads
land in a local folder) and for ``snapshot_download`` (downloads read from it), keeping the
arguments docclass passes, so the round trip export → push → load by id runs offline.
"""

import json
import shutil
import struct
from pathlib import Path

import pytest
import yaml

import docclass.data.artifact as artifact_module
import docclass.inference.export as export_module
from docclass import DocClassifier
from docclass.cli import main
from docclass.data.artifact import MODEL_FOLDER_FILES
from docclass.inference.export import export_model
from docclass.report.model_card import _faithfulness_section
from docclass.train.checkpoint import load_classifier

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
    assert sorted(p.name for p in exported.iterdir()) == sorted([*MODEL_FOLDER_FILES, "README.md"])
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
    report = json.loads((fitted / "report" / "report.json").read_text())
    table = report["faithfulness"]["methods"]
    config = json.loads((exported / "config.json").read_text())
    assert config["default_method"]["reason"][1:] in card  # its first letter capitalised
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


def _copy(exported: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(exported, folder)
    return folder


def _edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def _swap_label_ids(config):
    config["label2id"] = {**config["label2id"], "business": 1, "entertainment": 0}


def _widen_model(config):
    config["model_config"]["d_model"] = 64
    config.pop("weights_sha256")


def _damage_weights(folder: Path) -> None:
    raw = bytearray((folder / "model.safetensors").read_bytes())
    raw[-100] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(raw))


def _damage_header(folder: Path) -> None:
    _edit_config(folder, lambda config: config.pop("weights_sha256"))
    (folder / "model.safetensors").write_bytes(b"\xff" * 8 + b"{not json")


BROKEN = [
    ("weights changed", _damage_weights, "model.safetensors: its SHA-256 is not"),
    ("header damaged", _damage_header, "model.safetensors: not a readable safetensors file"),
    ("labels disagree", lambda f: _edit_config(f, _swap_label_ids), "config.json: id2label and"),
    ("config mismatch", lambda f: _edit_config(f, _widen_model), "tensors do not fit config"),
    ("not docclass", lambda f: _edit_config(f, lambda c: c.update(model_type="bert")), "is not"),
    ("no tokenizer", lambda f: (f / "tokenizer.json").unlink(), "lacks tokenizer.json"),
    (
        "unknown method",
        lambda f: _edit_config(f, lambda c: c.update(default_method={"method": "lime"})),
        "config.json: default_method 'lime' is not one of",
    ),
]


@pytest.mark.fault(
    "model folder: weights replaced or damaged, unreadable safetensors header, label maps that "
    "disagree, config that does not fit the tensors, not a docclass folder, missing file, "
    "unknown default word-score method",
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
        self.root, self.calls = root, []

    def create_repo(self, repo_id, private, exist_ok):
        self.calls.append(("create_repo", repo_id, private, exist_ok))
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)

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


def test_push_then_load_by_hub_id(exported, tmp_path, monkeypatch, ckpt):
    hub = LocalHub(tmp_path / "hub")
    monkeypatch.setattr(export_module, "hub_api", lambda: hub)
    monkeypatch.setattr("huggingface_hub.snapshot_download", hub.snapshot_download)
    main(["push", "--folder", str(exported), "--repo_id", "someone/bbc-docclass"])
    assert hub.calls[0] == ("create_repo", "someone/bbc-docclass", True, True)
    assert sorted(p.name for p in (hub.root / "someone/bbc-docclass").iterdir()) == sorted(
        [*MODEL_FOLDER_FILES, "README.md"]
    )
    loaded = DocClassifier.load("someone/bbc-docclass@abc123", device="cpu")
    assert hub.calls[-1][:3] == ("snapshot_download", "someone/bbc-docclass", "abc123")
    expected = DocClassifier.load(ckpt, device="cpu").predict(TEXTS)
    assert [r["probs"] for r in loaded.predict(TEXTS)] == [r["probs"] for r in expected]
    with pytest.raises(artifact_module.CheckpointError, match="hub download failed"):
        DocClassifier.load("someone/missing", device="cpu")


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
    assert "has no README.md model card" in capsys.readouterr().err
    assert hub.calls == []
