"""A stored model config is held against its weights before the network is allocated."""

from pathlib import Path

import pytest

from docclass.artifacts.building import build_classifier, least_parameters, model_config_from
from docclass.errors import CheckpointError
from docclass.nn.model import DocumentClassifier, ModelConfig

CONFIGS = [
    dict(vocab_size=50, num_classes=3, d_model=16, n_heads=2, n_layers=0, pool_heads=2),
    dict(vocab_size=50, num_classes=3, d_model=16, n_heads=2, n_layers=2, ffn_mult=1),
    dict(
        vocab_size=80, num_classes=7, d_model=24, n_heads=3, n_layers=1, ffn_mult=4,
        positions="learned", max_positions=64, norm="post", embedding_norm=True,
        scale_embeddings=False, window_tokens=16,
    ),  # fmt: skip
]


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
