"""docclass's encoder against `transformers`' BertForSequenceClassification on the same MiniLM
weights and the same batches: training and inference tokens/s, side by side in one run.

What a user would otherwise run is the `transformers` model with its own [CLS] pooler and
classifier. Both get identical padded batches (docclass's length buckets), the same AdamW
settings and the same number of steps; rounds alternate so drift in the machine's speed hits
both alike, and the figure kept is each side's median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.throughput import _train_steps, load_config_datamodule
from docclass.artifacts.encoders import locate_encoder
from docclass.train.lit_module import DocClassifierModule


def _inference_tokens_per_s(forward, batches: list[dict[str, torch.Tensor]]) -> float:
    real = 0
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            forward(batch)
            real += int(batch["attention_mask"].sum())
    return real / (time.perf_counter() - started)


def bert_like(ours: DocClassifierModule, encoder: str, num_labels: int) -> torch.nn.Module:
    """BertForSequenceClassification on the same pre-trained weights as ``ours``, with ours'
    dropout: BERT's own config drops 10 % of its attention probabilities, which docclass's
    blocks do not, and BERT would pay for work docclass skips."""
    from transformers import BertForSequenceClassification

    config = ours.model.config
    if config.embed_dropout != config.dropout or config.word_dropout:
        # BERT has one rate for its embeddings and blocks, and no word dropout.
        raise ValueError(
            f"BERT cannot copy embed_dropout {config.embed_dropout} beside dropout "
            f"{config.dropout}, or word_dropout {config.word_dropout}: compare a config "
            "whose embed_dropout equals its dropout and whose word_dropout is 0"
        )

    return BertForSequenceClassification.from_pretrained(
        locate_encoder(encoder), num_labels=num_labels, attn_implementation="sdpa",
        attention_probs_dropout_prob=config.attn_dropout, hidden_dropout_prob=config.dropout,
    )  # fmt: skip


def bert_training_step(theirs, smoothing: float) -> Callable[[dict], torch.Tensor]:
    """The loss of a BertForSequenceClassification on a batch, smoothed as docclass trains."""

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = theirs(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()
        ).logits
        return F.cross_entropy(logits.float(), batch["labels"], label_smoothing=smoothing)

    return step


def encoder_speed(
    config_path: str | Path = "configs/minilm.yaml", steps: int = 6, rounds: int = 3
) -> dict[str, Any]:
    """Median training and inference real tokens/s of both implementations, and their ratio."""
    datamodule, model_section = load_config_datamodule(config_path)
    torch.manual_seed(0)
    ours = DocClassifierModule(
        **model_section, num_classes=datamodule.num_classes, vocab_size=datamodule.vocab_size
    )
    theirs = bert_like(ours, model_section["encoder"], datamodule.num_classes)
    batches = list(datamodule.train_dataloader())[:steps]
    smoothing = ours.hparams.label_smoothing

    def our_step(batch):
        return ours._shared_step(batch)[0]

    their_step = bert_training_step(theirs, smoothing)

    sides = {
        "docclass": (our_step, ours, lambda b: ours.model(b["input_ids"], b["attention_mask"])),
        "transformers BertForSequenceClassification": (
            their_step,
            theirs,
            lambda b: theirs(input_ids=b["input_ids"], attention_mask=b["attention_mask"].long()),
        ),
    }
    train: dict[str, list[float]] = {name: [] for name in sides}
    infer: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, (step, model, forward) in sides.items():
            model.train()
            run = _train_steps(step, list(model.parameters()), batches, torch.device("cpu"), "32")
            train[name].append(run["real_tokens_per_s"])
            model.eval()
            infer[name].append(_inference_tokens_per_s(forward, batches))
    figures: dict[str, Any] = {
        "config": str(config_path),
        "encoder": model_section["encoder"],
        "threads": torch.get_num_threads(),
        "steps_per_round": steps,
        "rounds": rounds,
        "tokens_per_batch": [int(b["attention_mask"].sum()) for b in batches],
        "training_real_tokens_per_s": {n: statistics.median(v) for n, v in train.items()},
        "inference_real_tokens_per_s": {n: statistics.median(v) for n, v in infer.items()},
        "all_rounds": {"training": train, "inference": infer},
    }
    reference = "transformers BertForSequenceClassification"
    for kind in ("training", "inference"):
        speeds = figures[f"{kind}_real_tokens_per_s"]
        figures[f"{kind}_ratio_docclass_over_transformers"] = round(
            speeds["docclass"] / speeds[reference], 3
        )
    return figures


def _padded_slots(module: DocClassifierModule, batches: list[dict[str, torch.Tensor]]) -> dict:
    """Window-row slots the blocks see per real token: every row padded to the batch's longest
    row, against each length group padded to its own longest."""
    from docclass.nn.model import length_groups
    from docclass.nn.windows import window_layout

    config = module.model.config
    real = one = grouped = 0
    for batch in batches:
        mask = batch["attention_mask"].bool()
        if mask.shape[1] <= config.window_tokens:
            continue  # read as one window per document, as the model does: nothing to group
        positions = torch.arange(mask.shape[1]).expand_as(mask)
        layout = window_layout(mask, positions, config.window_tokens, config.window_overlap)
        real += int(mask.sum())
        one += layout.rows * layout.width
        grouped += sum(len(rows) * width for rows, width in length_groups(
            layout.row_mask.sum(dim=1), layout.width))  # fmt: skip
    if not real:
        return {}
    return {"one_padding": round(one / real, 3), "length_groups": round(grouped / real, 3)}


def window_grouping_speed(
    config_path: str | Path = "configs/minilm.yaml", steps: int = 4, rounds: int = 3
) -> dict[str, Any]:
    """Whole documents in encoder windows: the window rows run through the blocks in groups of
    similar length (docclass's way) against all padded to the batch's longest row, on the same
    training batches, training and inference real tokens/s, rounds alternating."""
    from docclass.nn import model as model_module

    datamodule, model_section = load_config_datamodule(config_path)
    torch.manual_seed(0)
    module = DocClassifierModule(
        **model_section, num_classes=datamodule.num_classes, vocab_size=datamodule.vocab_size
    )
    if not module.model.config.window_tokens:
        raise ValueError(f"{config_path}: reads no encoder windows (model.window_tokens)")
    batches = list(datamodule.train_dataloader())[:steps]
    sides = {"length groups": model_module.GROUP_FILL, "one padding": 0.0}
    train: dict[str, list[float]] = {name: [] for name in sides}
    infer: dict[str, list[float]] = {name: [] for name in sides}

    def step(batch):
        return module._shared_step(batch)[0]

    def forward(batch):
        return module.model(batch["input_ids"], batch["attention_mask"])

    default = model_module.GROUP_FILL
    try:
        for round_index in range(rounds):
            # Alternate which side goes first, so neither always meets a warmer machine.
            order = list(sides.items())[:: 1 if round_index % 2 == 0 else -1]
            for name, fill in order:
                model_module.GROUP_FILL = fill
                module.train()
                run = _train_steps(
                    step, list(module.parameters()), batches, torch.device("cpu"), "32"
                )
                train[name].append(run["real_tokens_per_s"])
                module.eval()
                infer[name].append(_inference_tokens_per_s(forward, batches))
    finally:
        model_module.GROUP_FILL = default
    figures: dict[str, Any] = {
        "config": str(config_path),
        "threads": torch.get_num_threads(),
        "steps_per_round": steps,
        "rounds": rounds,
        "tokens_per_batch": [int(b["attention_mask"].sum()) for b in batches],
        # Batches no longer than a window run unwindowed, the same either way (timed, not
        # counted in the slots).
        "windowed_batches": sum(
            b["input_ids"].shape[1] > module.model.config.window_tokens for b in batches
        ),
        "slots_per_real_token": _padded_slots(module, batches),
        "training_real_tokens_per_s": {n: statistics.median(v) for n, v in train.items()},
        "inference_real_tokens_per_s": {n: statistics.median(v) for n, v in infer.items()},
        "all_rounds": {"training": train, "inference": infer},
    }
    for kind in ("training", "inference"):
        speeds = figures[f"{kind}_real_tokens_per_s"]
        figures[f"{kind}_ratio_groups_over_one_padding"] = round(
            speeds["length groups"] / speeds["one padding"], 3
        )
    return figures
