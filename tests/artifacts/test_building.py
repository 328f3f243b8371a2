"""A stored model config is held against its weights before the network is allocated."""

from pathlib import Path

import pytest

from docclass.artifacts.building import build_classifier, least_parameters, model_config_from
from docclass.errors import CheckpointError
from docclass.nn.model import DocumentClassifier, ModelConfig

# fmt: off
CONFIGS = [
    dict(vocab_size=50, num_classes=3, d_model=16, n_heads=2, n_layers=0, pool_heads=2),
    dict(vocab_size=50, num_classes=3, d_model=16, n_heads=2, n_layers=2, ffn_mult=1),
    dict(
        vocab_size=80, num_classes=7, d_model=24, n_heads=3, n_layers=1, ffn_mult=4,
        positions="learned", max_positions=64, norm="post", embedding_norm=True,
        scale_embeddings=False, window_tokens=16,
    ),
]
# fmt: on


@pytest.mark.parametrize("settings", CONFIGS)
def test_the_lower_bound_never_exceeds_a_real_network(settings):
    config = ModelConfig(**settings)
    model = DocumentClassifier(config)
    assert 0 < least_parameters(config) <= sum(t.numel() for t in model.state_dict().values())
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    built = build_classifier(config, shapes, Path("x"))  # an honest file is taken
    assert set(built.state_dict()) == set(shapes)


@pytest.mark.fault(
    "a stored config far larger than the weights stored with it (a hostile config.json)",
    "refused from the sizes alone, before any tensor is allocated",
)
def test_a_config_larger_than_its_weights_is_refused_before_allocation(monkeypatch):
    small = DocumentClassifier(ModelConfig(**CONFIGS[0]))
    shapes = {name: tuple(t.shape) for name, t in small.state_dict().items()}
    giant = ModelConfig(**{**CONFIGS[0], "d_model": 1 << 16, "vocab_size": 1 << 24})

    def must_not_build(*args, **kwargs):
        raise AssertionError("allocated a network for a config its weights cannot fill")

    monkeypatch.setattr("docclass.artifacts.building.DocumentClassifier", must_not_build)
    with pytest.raises(CheckpointError, match="implies at least"):
        build_classifier(giant, shapes, Path("config.json"))


@pytest.mark.parametrize(
    "stored",
    [None, [1, 2], {"vocab_size": "many", "num_classes": 3}, {**CONFIGS[0], "d_model": 16.0}],
)
def test_a_stored_config_that_is_not_one_is_one_line(stored):
    with pytest.raises(CheckpointError, match="config.json: model_config"):
        model_config_from(stored, Path("config.json"))


def test_the_fingerprint_names_the_weights_not_the_dtype_they_are_held_in():
    """Trained in bf16-true, a model is tested in bfloat16 and rebuilt in float32: one set of
    weights, so one fingerprint; another set of weights, another."""
    import torch

    from docclass.artifacts.hashing import weights_fingerprint

    model = DocumentClassifier(ModelConfig(**CONFIGS[1]))
    half = {name: t.to(torch.bfloat16) for name, t in model.state_dict().items()}
    widened = {name: t.float() for name, t in half.items()}
    assert weights_fingerprint(half) == weights_fingerprint(widened)
    changed = dict(widened, **{"head.bias": widened["head.bias"] + 1e-3})
    assert weights_fingerprint(changed) != weights_fingerprint(widened)


@pytest.mark.parametrize("settings", [*CONFIGS, {**CONFIGS[0], "pool_score": "additive"}])
def test_the_lower_bound_counts_every_term_that_grows_with_the_square(settings):
    """A network at most twice the bound: a size left out of it (the pool's projections with
    no block, say) would let a few-kilobyte file ask for gigabytes."""
    for d_model in (16, 256):
        config = ModelConfig(**{**settings, "d_model": d_model, "n_heads": 2, "pool_heads": 2})
        built = sum(t.numel() for t in DocumentClassifier(config).state_dict().values())
        assert built <= 2 * least_parameters(config)


@pytest.mark.fault(
    "a stored config whose run-time sizes are out of range: an attention band or encoder "
    "window of tens of thousands, a padding id outside the vocabulary",
    "refused in one line before a network is built or a document read",
)
@pytest.mark.parametrize(
    "change", [{"attention_window": 12000}, {"window_tokens": 1 << 15}, {"pad_id": 10**6}]
)
def test_run_time_sizes_are_bounded(change):
    with pytest.raises(CheckpointError, match="sizes out of range"):
        model_config_from({**CONFIGS[0], **change}, Path("config.json"))


@pytest.mark.fault(
    "validate / test / predict --ckpt_path: a checkpoint whose stored hyper-parameters or model "
    "config claim a network larger than its weights",
    "one line naming the file, before Lightning builds the network from them",
)
@pytest.mark.parametrize(
    ("where", "message"),
    [("hyper_parameters", "its hyper-parameters .*d_model=4096"), ("docclass", "do not fit")],
)
def test_a_checkpoint_claiming_more_than_its_weights_is_refused(fitted, tmp_path, where, message):
    import torch

    from docclass.artifacts.load import verify_checkpoint

    checkpoint = torch.load(fitted / "checkpoints" / "last.ckpt", weights_only=True)
    target = checkpoint[where] if where == "hyper_parameters" else checkpoint[where]["model_config"]
    target.update(d_model=4096, n_layers=4)
    bomb = tmp_path / "bomb.ckpt"
    torch.save(checkpoint, bomb)
    verify_checkpoint(fitted / "checkpoints" / "last.ckpt")  # the honest one passes
    with pytest.raises(CheckpointError, match=message):
        verify_checkpoint(bomb)
