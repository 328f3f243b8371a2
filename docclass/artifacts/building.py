"""A network built from a stored model config, checked against the stored tensors first.

A model config comes from a file the user was handed (``config.json`` or a checkpoint's
artifact). Built as written, a config with a width of 10⁹ would try to allocate terabytes
before any check could run. So the parameters the config implies are first counted from its
sizes and held against the tensors in the file (whose header gives their shapes without
reading them): a config larger than its weights is refused before anything is allocated, and
memory stays bounded by the size of the weights file. (Laying the network out on the ``meta``
device would check the same without arithmetic, but costs seconds of start-up: it imports
``torch._dynamo``.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from docclass.errors import CheckpointError, one_line
from docclass.nn.model import DocumentClassifier, ModelConfig

# The longest document a stored config may claim positions for: far above any real encoder's
# window, far below what would exhaust memory in the one table that is not a stored tensor.
MAX_POSITIONS = 1 << 20
# The widest attention band or encoder window a stored config may ask for: each sizes a buffer
# of window × 3·window scores per head at run time (a 4,096 band is 200 MB a head already;
# the configs here use 64 and 512).
MAX_WINDOW = 4096


def model_config_from(stored: Any, source: Path) -> ModelConfig:
    """A :class:`ModelConfig` from a file's stored dict, every field checked."""
    if not isinstance(stored, dict):
        raise CheckpointError(f"{source}: model_config missing or not a mapping; export again")
    try:
        config = ModelConfig(**stored)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{source}: model_config unusable ({one_line(error)})") from error
    sizes = {
        name: getattr(config, name)
        for name in (
            "vocab_size", "num_classes", "d_model", "n_heads", "n_layers", "ffn_mult",
            "pool_heads", "max_positions", "attention_window", "window_tokens",
            "window_overlap", "pad_id",
        )
    }  # fmt: skip
    bad = [f"{n}={v!r}" for n, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool)]
    windows = (config.attention_window, config.window_tokens)
    if (
        bad
        or not 0 < config.max_positions <= MAX_POSITIONS
        or any(not 0 <= n <= MAX_WINDOW for n in windows)
        or config.ffn_mult < 1
        or not 0 <= config.pad_id < config.vocab_size
    ):
        raise CheckpointError(
            f"{source}: model_config sizes out of range ({', '.join(bad) or sizes}); export again"
        )
    return config


def least_parameters(config: ModelConfig) -> int:
    """A lower bound of the parameters ``config`` builds, from its large tensors only: the
    token table, every block's attention and feed-forward matrices, the pool's projections, a
    learned position table and the read-out. Each term is a tensor the network really has, so a
    config that agrees with its weights never exceeds the weights' own count; and every term
    that grows with the square of a size is counted, so the network allocated is never more than
    about twice the bound (a test holds it to that)."""
    d = config.d_model
    per_block = (4 + 2 * config.ffn_mult) * d * d  # query, key, value, out; feed-forward
    pool = 3 * d * d  # the pool's key, value and out projections, there with no block at all
    positions = config.max_positions * d if config.positions == "learned" else 0
    table_and_head = (config.vocab_size + config.num_classes) * d
    return table_and_head + config.n_layers * per_block + pool + positions


def check_sizes(config: ModelConfig, shapes: Mapping[str, tuple[int, ...]], source: Path) -> None:
    """Refuse a config that implies more parameters than ``shapes`` (the file's tensors) hold."""
    stored = sum(math.prod(shape) for shape in shapes.values())
    implied = least_parameters(config)
    if implied > stored:
        raise CheckpointError(
            f"{source}: the weights do not fit the stored model config (it implies at least "
            f"{implied:,} parameters, the file holds {stored:,}); export or save the model again"
        )


def build_classifier(
    config: ModelConfig, shapes: Mapping[str, tuple[int, ...]], source: Path
) -> DocumentClassifier:
    """An allocated network for ``config``, once ``shapes`` (the file's tensor name → shape)
    hold exactly the tensors it needs.

    The config is first held against the file's size (:func:`least_parameters`), so a config
    larger than its weights is refused before anything is allocated; then the network is built
    and every tensor's shape compared."""
    check_sizes(config, shapes, source)
    model = DocumentClassifier(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    wrong = sorted(n for n in set(expected) & set(shapes) if tuple(shapes[n]) != expected[n])
    if missing or unexpected or wrong:
        detail = "; ".join(
            f"{label}: {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
            for label, names in (("missing", missing), ("unexpected", unexpected), ("shape", wrong))
            if names
        )
        raise CheckpointError(
            f"{source}: the weights do not fit the stored model config ({detail}); export or "
            "save the model again"
        )
    return model
