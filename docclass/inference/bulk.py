"""``docclass classify``: the command, on one of two engines.

``local`` classifies in this process (:mod:`docclass.inference.classify`); ``ray`` on Ray Data
actors, into resumable Parquet parts (:mod:`docclass.inference.ray_classify`, imported only when
asked for, so the default path never imports Ray).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveInt

from docclass.errors import ConfigError
from docclass.inference.classifier import WordScoreMethod
from docclass.inference.classify import run_classify

log = logging.getLogger(__name__)

# Ray's defaults, named once: an option set to anything else without --engine ray is said.
CPUS_PER_WORKER = 1
SHARD_DOCUMENTS = 10_000


def classify_command(
    inputs: list[str],
    ckpt: str,
    out: str | None = None,
    text_column: str = "text",
    top_words: NonNegativeInt = 0,
    batch_size: PositiveInt = 64,
    device: str = "auto",
    strict: bool = False,
    progress: bool | None = None,
    method: WordScoreMethod | None = None,
    calibrated: bool = True,
    min_probability: float | None = None,
    engine: Literal["local", "ray"] = "local",
    address: str | None = None,
    workers: PositiveInt | None = None,
    cpus_per_worker: PositiveInt = CPUS_PER_WORKER,
    num_gpus: NonNegativeFloat = 0.0,
    shard_documents: PositiveInt = SHARD_DOCUMENTS,
) -> dict[str, Any]:
    """Classify documents in bulk: one output row per input document, in order.

    Args:
        inputs: files, folders (recursive), globs, '-' (stdin, one document per line), or
            CSV / JSONL / Parquet tables (one document per row).
        ckpt: checkpoint written by 'docclass fit', a folder written by 'docclass export', or
            hub:owner/name@<commit> (a folder on the hub, pinned).
        out: output file: .csv for CSV, else JSON Lines (default: standard output); with
            --engine ray, a folder of Parquet parts.
        text_column: text column of table inputs.
        top_words: add the K words with the highest word scores to each row.
        batch_size: most documents per forward pass (on the CPU a pass also stops at 2,048
            tokens, which is faster there than larger batches).
        device: auto (CUDA if available), cpu, cuda.
        strict: exit with status 1 if any document got an error.
        progress: progress bar on stderr (default: when stderr is a terminal).
        method: the word-score method of --top_words (default: the one the model's own
            faithfulness measurements trust most).
        calibrated: probabilities divided by the temperature fitted on the validation split
            ('docclass calibrate', which 'docclass fit' runs); false: the raw softmax. The
            label is the same either way.
        min_probability: rows whose top probability is below this are uncertain: an empty
            label, the model's own in the 'predicted' column. The report lists the thresholds
            that reached 95 % and 99 % precision on the validation split.
        engine: local (this process) or ray: Ray Data actors, one model each, writing
            Parquet parts into the --out folder; run the same command again to resume.
        address: with --engine ray, the Ray cluster to join (default: start a local Ray).
        workers: with --engine ray, model workers (default: the cluster's CPUs ÷
            --cpus_per_worker, or its GPUs ÷ --num_gpus).
        cpus_per_worker: with --engine ray, CPUs (and torch threads) per worker.
        num_gpus: with --engine ray, GPUs per worker (0: run on CPUs; 0.5: two per GPU).
        shard_documents: with --engine ray, about this many documents per part file (a
            JSON Lines file is cut at lines, Parquet at row groups; a CSV file stays whole).
    """
    _check_min_probability(min_probability)
    _say_unused_options(
        engine, top_words, method, address, workers, cpus_per_worker, num_gpus, shard_documents
    )
    if engine == "ray":
        from docclass.inference.ray_classify import classify_on_ray

        counts = classify_on_ray(
            ckpt, inputs, out or "", text_column, top_words, batch_size, device, method,
            address, workers, cpus_per_worker, num_gpus, shard_documents, progress, calibrated,
            min_probability,
        )  # fmt: skip
        print(
            f"{out}: {counts['shards']} part files ({counts['shards_skipped']} found written, "
            f"{counts['shards_classified']} classified now)",
            file=sys.stderr,
        )
    else:
        counts = run_classify(
            ckpt, inputs, out, text_column, top_words, batch_size, device, progress, method,
            calibrated, min_probability,
        )  # fmt: skip
    print(
        f"classified {counts['documents'] - counts['errors']} of {counts['documents']} documents"
        f" ({counts['errors']} errors, {counts['warnings']} warnings, "
        f"{counts['truncated']} truncated"
        + (f", {counts['uncertain']} uncertain" if min_probability is not None else "")
        + "); probabilities "
        + (
            f"calibrated (temperature {counts['temperature']:g})"
            if counts.get("temperature") is not None
            else "raw (no temperature fitted for these weights, or --calibrated false)"
        ),
        file=sys.stderr,
    )
    if strict and counts["errors"]:
        sys.exit(1)
    return counts


def _check_min_probability(min_probability: float | None) -> None:
    if min_probability is not None and not 0 < min_probability <= 1:
        raise ConfigError(
            f"--min_probability {min_probability}: give a probability in (0, 1], such as a "
            "threshold the report lists for a target precision"
        )


def _say_unused_options(
    engine, top_words, method, address, workers, cpus_per_worker, num_gpus, shard_documents
) -> None:
    """Options the parser accepts that change nothing in this call: said, not dropped."""
    local = engine != "ray"
    ignored = [
        f"--{name}"
        for name, unused in (
            ("method", method is not None and not top_words),
            ("address", local and address is not None),
            ("workers", local and workers is not None),
            ("cpus_per_worker", local and cpus_per_worker != CPUS_PER_WORKER),
            ("num_gpus", local and num_gpus != 0.0),
            ("shard_documents", local and shard_documents != SHARD_DOCUMENTS),
        )
        if unused
    ]
    if ignored:
        log.warning(
            "%s not used: --method chooses the words of --top_words, and --address, --workers, "
            "--cpus_per_worker, --num_gpus and --shard_documents apply with --engine ray",
            ", ".join(ignored),
        )
