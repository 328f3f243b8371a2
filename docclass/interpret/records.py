"""The per-document explanation record, the catalogue of word-score methods, and their JSONL.

No torch here: the report layer reads records and this catalogue without knowing the model.

A record (one JSON object per document, written by :func:`docclass.interpret.explain.
explain_documents`): ``id, text, words, spans`` (character spans of every word),
``words_read``, ``n_tokens, tokens_read, truncated, label`` (true, if known), ``predicted,
probs`` (the softmax of the logits divided by ``temperature``: the model's calibration, 1 when
it has none), ``logits, contribution_bias, scores{method: [one score per word]}``; on request
``contributions{class: [...]}`` (of the classes worth contrasting, or of all) with
``contribution_mean`` (each word's mean contribution over all classes); with more than one
block ``rollout_depths`` (the rollout through the top 1, 2, … blocks, one score per word each;
the full rollout is ``scores.rollout``); for short documents ``layer_maps``; after measuring,
``faithfulness``. A document with nothing to classify gets ``predicted: null`` and ``error``.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EMPTY_DOCUMENT = "empty document: no text to classify"


@dataclass(frozen=True)
class MethodInfo:
    """How a word-score method is named and read."""

    label: str  # as the pages print it
    signed: bool  # scores may be negative (push away from the class)
    help: str  # one sentence for the reader


METHODS: dict[str, MethodInfo] = {
    "attention": MethodInfo(
        "pool attention",
        False,
        "the global pool's weight on each word (mean over its heads unless one head is chosen); "
        "sums to 1 over the words read.",
    ),
    "contribution": MethodInfo(
        "class contribution",
        True,
        "the word's exact share of the class logit: the read-out after the pool is linear, so "
        "shares plus a constant bias give the logit. Red pushes towards the class, blue away.",
    ),
    "rollout": MethodInfo(
        "attention rollout",
        False,
        "attention rollout: the pool's weights carried back through every self-attention block "
        "(½·attention + ½·identity per block), so words that fed the attended words share their "
        "credit; sums to 1.",
    ),
    "grad_input": MethodInfo(
        "gradient × input",
        True,
        "gradient × input: the gradient of the class's lead over its rivals (its logit minus "
        "theirs, averaged by their raw probabilities) at each word's vector, times that "
        "vector, with every normalisation's scale and every GELU gate held fixed (as gradient "
        "× input reads a ReLU network); signed.",
    ),
    "conservative": MethodInfo(
        "conservative propagation",
        True,
        "conservative propagation (LRP): the class's lead over its rivals (its logit minus "
        "theirs, averaged by their raw probabilities) carried back through every block to "
        "what each word brings to the first block (its vector and its position), attention "
        "weights and normalisation held fixed (and contributions that agree with a layer's "
        "output weighing a little more, LRP-γ), so the words' shares and "
        "what no word causes add up to that lead. Red pushes towards the "
        "class, blue away.",
    ),
    "integrated_gradients": MethodInfo(
        "integrated gradients",
        True,
        "integrated gradients: the class logit's gradient integrated from a zero word vector to "
        "each word's embedding (Captum); signed, and sums to the logit's change.",
    ),
}
# Methods every record carries, in the order the pages offer them (integrated gradients is
# measured on samples only: it costs dozens of forward passes per document).
RECORD_METHODS = ("attention", "contribution", "rollout", "grad_input", "conservative")
SIGNED_METHODS = tuple(key for key, info in METHODS.items() if info.signed)
HEAD_PREFIX = "attention_head"


def method_names(pool_heads: int) -> list[str]:
    """Every method a record carries, in the order a report offers them."""
    return [*RECORD_METHODS, *(f"{HEAD_PREFIX}{h}" for h in range(pool_heads))]


def method_label(key: str) -> str:
    """A method's name as the pages print it (``attention_head2`` → "pool attention, head 2")."""
    if key.startswith(HEAD_PREFIX):
        return f"pool attention, head {key[len(HEAD_PREFIX) :]}"
    if key == "random":
        return "random"
    return METHODS[key].label


REMOVAL_LABELS = {"mask": "masking", "delete": "deletion", "unk": "[UNK]"}


def compact(values: Iterable[float]) -> list[float | None]:
    """Floats with 6 significant digits: exact enough to rank and sum, small in JSONL. A value
    that is not finite becomes None (JSON null): ``NaN`` is not JSON, and readers choke on it."""
    return [float(f"{value:.6g}") if math.isfinite(value) else None for value in values]


# What a record file keeps of a list of word scores: each value to FILE_STEP of the list's
# largest magnitude (an absolute step, so that differences such as a class's share minus the
# mean over classes stay exact to it, where significant digits would not), which keeps a
# report of 1,000 long documents tens of megabytes, not hundreds.
FILE_STEP = 1e-4
_WORD_SCORE_KEYS = ("scores", "contributions", "contribution_mean", "rollout_depths")


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list) and any(isinstance(v, list) for v in value):
        return [_rounded(item) if isinstance(item, list) else item for item in value]
    if isinstance(value, list):
        top = max((abs(v) for v in value if v is not None), default=0.0)
        if top == 0:
            return value
        decimals = max(0, math.ceil(-math.log10(top * FILE_STEP)))
        return [round(v, decimals) if v is not None else None for v in value]
    return value


# Significant digits a file keeps of a class probability: a page shows three decimals, and at
# 150 classes the probabilities at six digits were half a short request's record.
PROBABILITY_DIGITS = 4


def contribution_totals(record: dict[str, Any]) -> dict[str, float]:
    """Each kept class's words' total: the record's own (summed before a file rounded them)
    when it has one, else the sum of its contributions over the words read."""
    if record.get("contribution_totals"):
        return record["contribution_totals"]
    read = record["words_read"]
    return {name: sum(values[:read]) for name, values in record.get("contributions", {}).items()}


def file_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as a file keeps it: each list of word scores rounded to :data:`FILE_STEP` of
    its largest magnitude, probabilities to :data:`PROBABILITY_DIGITS` significant digits
    but the predicted class's (it, the logits and faithfulness figures as computed), and
    ``contribution_totals``: each class's words' total before the rounding."""
    kept = {
        key: _rounded(value) if key in _WORD_SCORE_KEYS else value for key, value in record.items()
    }
    if record.get("contributions"):
        # Before rounding: what a page prints as the words' part of a logit difference, which
        # 500 rounded shares would miss in the third decimal.
        kept["contribution_totals"] = contribution_totals(record)
    if record.get("probs"):
        probs, predicted = record["probs"], record.get("predicted")
        top = probs.get(predicted)

        def kept_probability(name: str, p: float) -> float:
            rounded = float(f"{p:.{PROBABILITY_DIGITS}g}")
            # The predicted class's as computed: a page rendered again from the file flags it
            # uncertain below LOW_CONFIDENCE as the first did (0.5999996 read back as 0.6 lost
            # its flag). A runner-up that would round up to it or past it keeps its own as
            # computed too (a tie read first in label order took the argmax).
            if top is not None and (name == predicted or rounded >= top):
                return p
            return rounded

        kept["probs"] = {name: kept_probability(name, p) for name, p in probs.items()}
    return kept


# zlib's default level. gzip.open's own, 9, spent 5.2 s of the BBC MiniLM report's 213
# records compressing; on lists of scores level 6 took a ninth of the time for files about 12 %
# larger.
GZIP_LEVEL = 6


def _open_text(path: str | Path, mode: str):
    # A ``.gz`` name is read and written compressed: numbers compress about threefold.
    if str(path).endswith(".gz"):
        return gzip.open(path, mode + "t", compresslevel=GZIP_LEVEL, encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def write_jsonl(records: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write one record per line (UTF-8, non-ASCII kept; gzip-compressed when ``path`` ends in
    ``.gz``); returns how many were written."""
    count = 0
    with _open_text(path, "w") as handle:
        for record in records:
            # allow_nan=False: a non-finite number anywhere is a bug to see, not invalid JSON.
            line = json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            handle.write(line + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read records written by :func:`write_jsonl`."""
    with _open_text(path, "r") as handle:
        return [json.loads(line) for line in handle if line.strip()]
