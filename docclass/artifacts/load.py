"""A trained classifier rebuilt from a checkpoint, a model folder or a pinned hub id: the one
way a trained model is loaded, with no training code run, no pickle executed and no Lightning
imported."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from docclass.artifacts.building import build_classifier, check_sizes, model_config_from
from docclass.artifacts.checkpoint import load_checkpoint, network_weights, read_artifact_from
from docclass.artifacts.folder import folder_artifact, load_model_folder, refuse_larger_tokenizer
from docclass.artifacts.hashing import weights_fingerprint
from docclass.artifacts.locate import resolve_model
from docclass.data.tokenizer import load_tokenizer
from docclass.errors import CheckpointError
from docclass.nn.model import DocumentClassifier


@dataclass
class TrainedClassifier:
    """A trained network (in eval mode), its tokenizer, label names and token limit."""

    model: DocumentClassifier
    tokenizer: Tokenizer
    label_names: list[str]
    max_tokens: int | None
    # A model folder's config.json (its facts: default word-score method, scores, origin);
    # empty for a checkpoint.
    folder_config: dict[str, Any] = field(default_factory=dict)
    # What explanation records divide the logits by for their probabilities: the temperature
    # fitted for these weights, set by whoever reads the model's facts (1: the raw softmax).
    temperature: float = 1.0

    @cached_property
    def fingerprint(self) -> str:
        """The weights' fingerprint: what a measured figure must name to belong to them."""
        return weights_fingerprint(self.model.state_dict())

    def __post_init__(self) -> None:
        checked_max_tokens(self.max_tokens, "the classifier")

    def with_temperature(self, temperature: float) -> TrainedClassifier:
        """The same classifier (the same network object) whose records divide the logits by
        ``temperature``; this one is left as it is."""
        copy = dataclasses.replace(self, temperature=temperature)
        if "fingerprint" in self.__dict__:  # the same weights: no need to hash them again
            copy.__dict__["fingerprint"] = self.__dict__["fingerprint"]
        return copy


def read_artifact(spec: str | Path) -> dict[str, Any]:
    """Tokenizer JSON, label names, model config and max_tokens of a checkpoint or a model
    folder."""
    local = resolve_model(spec)
    if local.is_dir():
        return folder_artifact(local)
    return read_artifact_from(load_checkpoint(local), spec)


# The hyper-parameters Lightning builds a checkpoint's network from (``docclass test
# --ckpt_path``) that fix its sizes; they must be the sizes its own model config records.
SIZE_SETTINGS = (
    "vocab_size", "num_classes", "d_model", "n_heads", "n_layers", "pool_heads", "ffn_mult",
    "positions", "max_positions", "attention_window", "window_tokens",
)  # fmt: skip


def verify_checkpoint(spec: str | Path) -> dict[str, Any]:
    """A checkpoint's (or folder's) artifact, once its sizes are known to be its weights'.

    Lightning rebuilds a checkpoint's network from the hyper-parameters stored in it, not from
    docclass's model config: a file of a megabyte claiming a width of 4,096 would allocate
    gigabytes before its weights were found not to fit. So both are held to the weights first.
    """
    local = resolve_model(spec)
    if local.is_dir():
        return folder_artifact(local)
    checkpoint = load_checkpoint(local)
    artifact = read_artifact_from(checkpoint, spec)
    config = model_config_from(artifact.get("model_config"), local)
    check_sizes(config, {k: tuple(v.shape) for k, v in network_weights(checkpoint).items()}, local)
    settings = checkpoint.get("hyper_parameters") or {}
    # With an encoder the module takes its sizes from the pinned encoder, not from these.
    if not settings.get("encoder"):
        differ = [
            f"{name}={settings[name]!r}"
            for name in SIZE_SETTINGS
            if name in settings and settings[name] != getattr(config, name)
        ]
        if differ:
            raise CheckpointError(
                f"{spec}: its hyper-parameters ({', '.join(differ)}) are not its model's; it was "
                "not saved by 'docclass fit' as it is"
            )
    return artifact


def checked_max_tokens(limit: Any, origin: str | Path) -> int | None:
    """``limit`` as read from ``origin``, refused unless a positive whole number or None:
    `true` would cut every text to one token, -1 drop its last."""
    if limit is not None and (type(limit) is not int or limit < 1):
        raise CheckpointError(
            f"{origin}: max_tokens {limit!r} must be a positive whole number or null; export "
            "or train the model again"
        )
    return limit


def load_classifier(spec: str | Path) -> TrainedClassifier:
    """Rebuild a trained classifier from a checkpoint, a model folder or a pinned hub id."""
    local = resolve_model(spec)
    if local.is_dir():
        model, tokenizer, labels, config = load_model_folder(local)
        limit = checked_max_tokens(config.get("max_tokens"), local / "config.json")
        return TrainedClassifier(model, tokenizer, labels, limit, config)
    checkpoint = load_checkpoint(local)
    artifact = read_artifact_from(checkpoint, spec)
    if not artifact.get("tokenizer"):
        raise CheckpointError(f"{spec}: carries no tokenizer; it was saved before training began")
    weights = network_weights(checkpoint)
    config = model_config_from(artifact.get("model_config"), local)
    model = build_classifier(config, {k: tuple(v.shape) for k, v in weights.items()}, local)
    model.load_state_dict(weights)
    labels = list(artifact["label_names"])
    if len(labels) != config.num_classes:
        raise CheckpointError(
            f"{spec}: {len(labels)} label names for a model of {config.num_classes} classes; "
            "it was not written by this docclass"
        )
    tokenizer = load_tokenizer(artifact["tokenizer"])
    refuse_larger_tokenizer(tokenizer, config.vocab_size, f"{spec}'s tokenizer")
    return TrainedClassifier(
        model=model.eval(),
        tokenizer=tokenizer,
        label_names=labels,
        max_tokens=checked_max_tokens(artifact.get("max_tokens"), spec),
    )


def checkpoint_fingerprint(path: str | Path) -> str:
    """The fingerprint of a checkpoint's network weights, without building the network."""
    return weights_fingerprint(network_weights(load_checkpoint(path)))
