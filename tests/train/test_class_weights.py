"""Class-balanced training loss: rare classes weigh as much as common ones."""

import pytest
import torch
import torch.nn.functional as F
from helpers import CONFIGS, write_jsonl

from docclass.cli import DocClassCLI
from docclass.train.datamodule import DocDataModule
from docclass.train.lit_module import DocClassifierModule


def built(*overrides):
    cli = DocClassCLI(
        DocClassifierModule,
        DocDataModule,
        run=False,
        args=["--config", str(CONFIGS / "tiny.yaml"), *overrides],
    )
    cli.model.trainer = cli.trainer
    cli.trainer.datamodule = cli.datamodule
    return cli


def skewed_corpus(path):
    """Three classes, 60 / 15 / 15 documents: the weights must differ."""
    sizes = {"common": 60, "rare": 15, "scarce": 15}
    rows = [
        {"text": f"{label} document number {i} about {label} things", "label": label}
        for label, size in sizes.items()
        for i in range(size)
    ]
    write_jsonl(path, rows)
    return path


@pytest.mark.parametrize(("setting", "power"), [("balanced", 1.0), ("sqrt", 0.5)])
def test_class_weights_are_inverse_class_shares_and_reach_the_training_loss(
    tmp_path, setting, power
):
    cli = built(
        "--model.class_weights", setting, "--trainer.default_root_dir", str(tmp_path),
        "--data.source", str(skewed_corpus(tmp_path / "skewed.jsonl")),
        "--data.max_docs_per_class", "null",
    )  # fmt: skip
    module, datamodule = cli.model, cli.datamodule
    module.setup("fit")
    labels = torch.as_tensor(datamodule.splits["train"]["label"])
    counts = torch.bincount(labels, minlength=datamodule.num_classes).float()
    expected = (len(labels) / (datamodule.num_classes * counts)) ** power
    torch.testing.assert_close(module.loss_weights, expected)
    assert expected.max() / expected.min() > 3**power
    # The loss training_step returns is the weighted one (eval mode: no dropout to differ).
    module.eval()
    module.log = lambda *args, **kwargs: None  # no trainer loop is running to log into
    batch = next(iter(datamodule.train_dataloader()))
    logits = module.model(batch["input_ids"], batch["attention_mask"]).logits
    weighted = F.cross_entropy(
        logits, batch["labels"], weight=expected, label_smoothing=module.hparams.label_smoothing
    )
    torch.testing.assert_close(module.training_step(batch, 0), weighted)
    assert "loss_weights" not in module.state_dict()  # computed, never saved


def test_weights_follow_a_skewed_split():
    class Skewed:
        stream = None
        num_classes = 3
        splits = {"train": {"label": [0] * 8 + [1] * 2 + [2] * 2}}

    from docclass.train.lit_module import balanced_class_weights

    torch.testing.assert_close(balanced_class_weights(Skewed()), torch.tensor([0.5, 2.0, 2.0]))
    # Square root: a class 4 times rarer weighs 2 times more.
    root = balanced_class_weights(Skewed(), power=0.5)
    torch.testing.assert_close(root, torch.tensor([0.5, 2.0, 2.0]).sqrt())


def test_balanced_weights_refused_for_a_streamed_training_set():
    from docclass.errors import ConfigError
    from docclass.train.lit_module import balanced_class_weights

    class Streamed:
        stream = "corpus.jsonl"

    with pytest.raises(ConfigError, match="streamed training set"):
        balanced_class_weights(Streamed())


def test_auto_weighs_only_an_imbalanced_corpus(tmp_path):
    """auto: square-root weights when the largest class is 3× the smallest or more, else none
    (a balanced corpus trains exactly as unweighted)."""
    skewed = built(
        "--model.class_weights", "auto", "--trainer.default_root_dir", str(tmp_path),
        "--data.source", str(skewed_corpus(tmp_path / "skewed.jsonl")),
        "--data.max_docs_per_class", "null",
    )  # fmt: skip
    skewed.model.setup("fit")
    labels = torch.as_tensor(skewed.datamodule.splits["train"]["label"])
    counts = torch.bincount(labels).float()
    assert counts.max() >= 3 * counts.min()
    torch.testing.assert_close(skewed.model.loss_weights, (len(labels) / (3 * counts)).sqrt())
    balanced = built("--model.class_weights", "auto", "--trainer.default_root_dir", str(tmp_path))
    balanced.model.setup("fit")
    counts = torch.bincount(torch.as_tensor(balanced.datamodule.splits["train"]["label"]))
    assert counts.max() < 3 * counts.min()
    assert balanced.model.loss_weights is None
