"""``docclass calibrate``: the temperature of a trained model, fitted on its validation split, and
how well calibrated its probabilities are before and after, on validation and test.

``docclass fit`` does this after testing. The figures go to ``<run>/calibration.json``, which
names the weights they were measured on (a run keeps several checkpoints): ``DocClassifier``,
``classify`` and ``serve`` divide the logits of those weights by the temperature, and ``docclass
export`` carries it into the model folder's ``config.json``. The temperature is fitted on
validation only; the test split is scored with it, never fitted on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from docclass.artifacts.load import TrainedClassifier, load_classifier
from docclass.calibration import (
    ECE_BINS,
    accepted_at,
    calibration_scores,
    ece_if_calibrated,
    fit_temperature,
    precision_threshold,
    reliability_bins,
    risk_coverage,
    scaled_probabilities,
)
from docclass.errors import CheckpointError, DataError
from docclass.files import write_atomically
from docclass.inference.classifier import resolve_device
from docclass.inference.model_facts import CALIBRATION_FILE, read_json, run_dir_of
from docclass.inference.reporting import (
    CONFIG_SUFFIXES,
    Documents,
    check_same_split,
    documents_from_datamodule,
    trained_source_matches,
)
from docclass.interpret.inputs import batched, encode_documents, float32_model
from docclass.nn.model import DocumentClassifier
from docclass.train.lightning_cli import datamodule_from_config

log = logging.getLogger(__name__)

# (model, input_ids, attention_mask) -> logits: another way to a batch's logits, the same values.
LogitsFunction = Callable[[DocumentClassifier, torch.Tensor, torch.Tensor], torch.Tensor]

# The precisions at which bulk users ask how many documents can be labelled unread.
PRECISION_TARGETS = (0.95, 0.99)


def labelled_logits(
    classifier: TrainedClassifier,
    documents: Documents,
    device: str = "cpu",
    batch_size: int = 64,
    logits_of: LogitsFunction | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits [N, C], label indices [N])`` of the documents with a label and a token.

    A label the model does not know is an error, never mapped to another class. ``logits_of``
    gives a batch's logits another way than the whole model's forward pass (fit's held
    blocks' cached states); it must give the same values."""
    known = {name: i for i, name in enumerate(classifier.label_names)}
    unknown = sorted({label for label in documents.labels if label and label not in known})
    if unknown:
        raise DataError(
            f"{documents.description}: labels {unknown[:5]} are not among the model's "
            f"({', '.join(classifier.label_names)}); calibrate on the data it was trained on"
        )
    # In float32, as every reader of the temperature runs the model (predict, classify, serve,
    # the report): fit's own bf16-true weights would otherwise fit a temperature to bf16 logits
    # that no later run of the same weights produces.
    model = float32_model(classifier.model.to(device).eval())
    encoded = encode_documents(classifier.tokenizer, documents.texts, classifier.max_tokens)
    rows: dict[int, torch.Tensor] = {}
    token_rows = [document.token_ids for document in encoded]
    pad_id = model.config.pad_id
    with torch.inference_mode():
        for indices, input_ids, mask in batched(token_rows, batch_size, pad_id, device):
            if logits_of is None:
                batch = model(input_ids, mask).logits.float().cpu()
            else:
                batch = logits_of(model, input_ids, mask).float().cpu()
            for row, i in enumerate(indices):
                rows[i] = batch[row]
    labelled = [i for i in sorted(rows) if documents.labels[i]]
    if not labelled:
        return torch.zeros(0, len(known)), torch.zeros(0, dtype=torch.long)
    logits = torch.stack([rows[i] for i in labelled])
    labels = torch.tensor([known[documents.labels[i]] for i in labelled], dtype=torch.long)
    return logits, labels


def _before_and_after(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float
) -> dict[str, Any]:
    raw, scaled = scaled_probabilities(logits), scaled_probabilities(logits, temperature)
    return {
        "before": calibration_scores(raw, labels),
        "after": calibration_scores(scaled, labels),
        "reliability": {
            "before": reliability_bins(raw, labels),
            "after": reliability_bins(scaled, labels),
        },
        "risk_coverage": risk_coverage(scaled, labels),
        # What a perfectly calibrated model would show on this many documents (noise).
        "ece_if_calibrated": ece_if_calibrated(scaled),
    }


def abstention(
    validation: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor] | None,
    temperature: float,
) -> dict[str, Any]:
    """For each precision target: the lowest calibrated top probability at which the accepted
    validation documents reach it (chosen on validation only), and what it accepts there and
    on test. A threshold of None: no threshold reaches the target, nothing is accepted."""
    val_probs = scaled_probabilities(validation[0], temperature)
    test_probs = scaled_probabilities(test[0], temperature) if test else None
    targets = {}
    for target in PRECISION_TARGETS:
        threshold = precision_threshold(val_probs, validation[1], target)
        targets[f"{target:g}"] = {
            "threshold": threshold,
            "validation": accepted_at(val_probs, validation[1], threshold),
            **({"test": accepted_at(test_probs, test[1], threshold)} if test else {}),
        }
    return targets


def calibrate(
    classifier: TrainedClassifier,
    validation: Documents,
    test: Documents | None = None,
    device: str = "cpu",
    logits_of: LogitsFunction | None = None,
) -> dict[str, Any]:
    """The temperature fitted on ``validation`` and the scores before and after it on both
    splits (with each split's reliability bins), for the weights they name (``logits_of``:
    as :func:`labelled_logits`).

    Where no temperature fits (a validation split the model gets entirely right, or worse than
    an even guess), the temperature is 1, the raw probabilities, and ``fit`` says why."""
    logits, labels = labelled_logits(classifier, validation, device, logits_of=logits_of)
    if not len(labels):
        raise DataError(f"{validation.description}: no labelled document to fit a temperature on")
    _refuse_non_finite(logits, validation)
    fitted = fit_temperature(logits, labels)
    # Everything below uses the temperature as stored, the one predict() will divide by.
    temperature = round(fitted, 6) if fitted is not None else 1.0
    facts: dict[str, Any] = {
        "weights": classifier.fingerprint,
        "temperature": temperature,
        "fit": "likelihood"
        if fitted is not None
        else "no temperature in the range fits (its best lies past a bound: a validation split "
        "the model gets entirely right, or one it does worse on than an even guess): the raw "
        "probabilities are kept",
        "fitted_on": validation.description,
        "ece_bins": ECE_BINS,
        "validation": _before_and_after(logits, labels, temperature),
    }
    if fitted is None:
        log.warning("%s: %s", validation.description, facts["fit"])
    scored = None
    if test is not None:
        scored = labelled_logits(classifier, test, device, logits_of=logits_of)
        _refuse_non_finite(scored[0], test)
        if len(scored[1]):
            facts["test"] = _before_and_after(*scored, temperature)
            facts["test"]["split"] = test.description
        else:
            scored = None
    facts["abstention"] = abstention((logits, labels), scored, temperature)
    return facts


def _refuse_non_finite(logits: torch.Tensor, documents: Documents) -> None:
    broken = int((~torch.isfinite(logits).all(dim=1)).sum())
    if broken:
        # A NaN fitted the largest temperature as the likelihood's choice; in the test figures
        # it would pass into the ECE, the reliability bins and the risk-coverage curve.
        raise CheckpointError(
            f"{documents.description}: the model's logits are not finite on {broken} of "
            f"{len(logits)} documents (weights that diverged); nothing is calibrated on them: "
            "train again with a lower learning rate or gradient clipping"
        )


def write_calibration(run_dir: Path, facts: dict[str, Any]) -> Path:
    """Add these weights' calibration to ``<run>/calibration.json`` (one entry per set of
    weights: calibrating ``best.ckpt`` keeps ``last.ckpt``'s), and put its scores into
    ``metrics.json`` when that holds the test scores of the same weights."""
    path = run_dir / CALIBRATION_FILE
    known = read_json(path) or {}
    by_weights = dict(known.get("by_weights") or {})
    by_weights[facts["weights"]] = facts
    write_atomically(path, json.dumps({"by_weights": by_weights}, indent=2) + "\n")
    metrics_path = run_dir / "metrics.json"
    metrics = read_json(metrics_path)
    if metrics and (metrics.get("test") or {}).get("weights") == facts["weights"]:
        metrics["calibration"] = {
            "temperature": facts["temperature"],
            "fit": facts["fit"],
            "abstention": facts.get("abstention"),
            **{
                split: {"before": facts[split]["before"], "after": facts[split]["after"]}
                for split in ("validation", "test")
                if split in facts
            },
        }
        # Whole or not at all, as the training callback writes it: a kill here must not leave
        # the run's test scores half-written.
        write_atomically(metrics_path, json.dumps(metrics, indent=2, default=str))
    return path


def summary_line(facts: dict[str, Any]) -> str:
    """``temperature 0.62: ECE on test 0.041 → 0.012`` (validation when there is no test)."""
    split = "test" if "test" in facts else "validation"
    before, after = facts[split]["before"]["ece"], facts[split]["after"]["ece"]
    if facts.get("fit", "likelihood") != "likelihood":
        return f"no temperature fitted, the probabilities stay raw ({facts['fit']})"
    return f"temperature {facts['temperature']:.3f}: ECE on {split} {before:.3f} → {after:.3f}"


def calibrate_command(
    ckpt: str,
    data: str,
    test_split: Literal["test"] | None = "test",
    device: str = "cpu",
) -> dict[str, Any]:
    """Fit a checkpoint's temperature on its run's validation split and add it to
    calibration.json in its run folder (docclass fit does this for the weights it tested).

    Args:
        ckpt: checkpoint written by 'docclass fit' (in <run>/checkpoints/).
        data: the run's YAML config; the split is the run's own split.json where it has one.
        test_split: score the test split before and after too (null: do not).
        device: cpu, cuda, ...
    """
    resolve_device(device)  # a device this machine lacks fails now, not after the loading
    if not Path(ckpt).expanduser().exists():
        raise CheckpointError(f"{ckpt}: no such file; give a checkpoint a fit wrote")
    run_dir = run_dir_of(ckpt)
    if run_dir is None:
        raise CheckpointError(
            f"{ckpt}: not a checkpoint in a training run's checkpoints/ folder; calibrate the "
            "run's checkpoint (an exported folder carries the temperature it was exported with)"
        )
    if Path(data).suffix.lower() not in CONFIG_SUFFIXES:
        # A bare source may lack the split, and reading another in its place (its training
        # documents, say) would fit a temperature the model is sure of for the wrong reason.
        raise DataError(f"--data {data}: give the run's YAML config, which fixes its splits")
    overrides = ["--data.tokenizer_from", str(ckpt)]
    split_file = run_dir / "split.json"
    if split_file.is_file():
        # The documents the run held out, whatever the config's seed or fractions say now.
        overrides += ["--data.split_file", str(split_file)]
    classifier = load_classifier(ckpt)
    datamodule = datamodule_from_config(data, overrides)
    validation = documents_from_datamodule(datamodule, "val")
    check_same_source(run_dir, data, datamodule.stats["source"])
    check_same_split(ckpt, run_dir, data, datamodule, "calibrate")
    test = documents_from_datamodule(datamodule, test_split) if test_split else None
    facts = calibrate(classifier, validation, test, device)
    path = write_calibration(run_dir, facts)
    print(f"{summary_line(facts)} → {path}")
    return facts


def check_same_source(run_dir: Path, data: str, source: str) -> None:
    """Refuse a config whose source is not the one the run was trained on (``metrics.json``
    records it, a local path also resolved): two tables numbered alike would give the run's
    split ids other documents, and the temperature would be fitted on them without a word."""
    if trained_source_matches(run_dir, source) is False:
        trained = (read_json(run_dir / "metrics.json") or {}).get("data") or {}
        where, trained_on = trained.get("source_path"), trained.get("source")
        raise DataError(
            f"--data {data} reads {source}, but {run_dir} was trained on {where or trained_on}; "
            "give a config whose data.source is the run's (its own is saved in the run's logs/ "
            "folder)"
        )
