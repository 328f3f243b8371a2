"""The model card (``README.md``) of an exported model folder, from the run's facts.

The hub reads the YAML block at the top (task, library, license, datasets, languages, scores)
and renders the Markdown below it. Everything a card states comes from the facts it is given:
what ``docclass fit`` measured, the report's faithfulness table and the default word-score
method chosen from it. Label names and sources are escaped, since the hub renders HTML inside
Markdown.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from docclass.interpret.default_method import REPORT_TABLE
from docclass.interpret.records import HEAD_PREFIX, REMOVAL_LABELS, method_label
from docclass.report.summaries import times_random

USAGE = [
    "from docclass import DocClassifier",
    "",
    'classifier = DocClassifier.load("this-folder")  # or "hub:owner/name@<commit>"',
    'classifier.predict(["some document text"], word_scores=True)',
]


# The characters that make Markdown markup inside a line (links and images need brackets, HTML
# is escaped as entities): a label named "[docs](https://…)" would otherwise be a link on the
# hub's page, and one with a backtick would end a code span.
_MARKDOWN_MARKUP = re.compile(r"([\\`*_\[\]~])")
_LINE_BREAK = re.compile(r"\r\n?|\n")


def _one_line(text: str) -> str:
    """Every line break Markdown knows (a lone carriage return ends a line too, and started a
    heading inside a class name) as one space."""
    return _LINE_BREAK.sub(" ", text)


def _cell(value: Any) -> str:
    """Text shown as written inside a Markdown table cell rendered as HTML."""
    return _prose(value, quote=True).replace("|", "&#124;")


def _prose(value: Any, quote: bool = False) -> str:
    """Text shown as written in a Markdown paragraph rendered as HTML: Markdown's markup
    characters backslash-escaped, then HTML's as entities (quotes left readable in prose)."""
    escaped = _MARKDOWN_MARKUP.sub(r"\\\1", str(value))
    return _one_line(html.escape(escaped, quote=quote))


def _code(value: Any) -> str:
    """A Markdown code span showing the value as written: its content is never markup, so
    nothing is escaped inside; the fence is one backtick longer than any run in the value."""
    text = _one_line(str(value))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _yaml_string(value: Any) -> str:
    # JSON strings are YAML strings: quotes and backslashes escaped, no tag or anchor parsed.
    return json.dumps(str(value))


def _front_matter(facts: dict[str, Any]) -> list[str]:
    lines = ["---", "library_name: docclass", "pipeline_tag: text-classification"]
    lines.append(f"license: {_yaml_string(facts.get('license') or 'other')}")
    for key in ("language", "datasets"):
        if facts.get(key):
            lines.append(f"{key}:")
            lines += [f"  - {_yaml_string(value)}" for value in facts[key]]
    lines += ["tags:", "  - docclass", "  - explainability", "  - attention-pooling"]
    test = facts.get("test") or {}
    if "accuracy" in test:
        lines += ["metrics:", "  - accuracy", "  - f1"]
        lines += [
            "model-index:",
            f"  - name: {_yaml_string(facts['name'])}",
            "    results:",
            "      - task:",
            "          type: text-classification",
            "        dataset:",
            f"          name: {_yaml_string(facts.get('data_name', 'training corpus'))}",
            f"          type: {_yaml_string(facts.get('data_name', 'training corpus'))}",
            "          split: test",
            "        metrics:",
            "          - type: accuracy",
            f"            value: {round(test['accuracy'], 4)}",
            "          - type: f1",
            "            name: macro-F1",
            f"            value: {round(test['macro_f1'], 4)}",
        ]
    return [*lines, "---", ""]


def _calibration_section(facts: dict[str, Any]) -> list[str]:
    calibration = facts.get("calibration")
    lines = ["## How sure", ""]
    if not calibration:
        return [*lines, "Not calibrated: the probabilities are the raw softmax of the logits.", ""]
    if calibration.get("fit", "likelihood") == "likelihood":
        lines.append(
            f"The probabilities are calibrated: every logit is divided by a temperature of "
            f"{calibration['temperature']:.3f}, fitted by likelihood on "
            f"{_cell(calibration.get('fitted_on', 'the validation split'))} "
            "(`calibrated=False` in `predict` gives the raw ones; no label changes)."
        )
    else:
        lines.append(f"The probabilities are the raw softmax: {_cell(calibration['fit'])}.")
    rows = [(split, calibration[split]) for split in ("validation", "test") if split in calibration]
    lines += ["", "| split | ECE (15 bins) | Brier | NLL |", "|---|---|---|---|"]
    lines += [
        f"| {split} | {figures['before']['ece']:.3f} → {figures['after']['ece']:.3f} | "
        f"{figures['before']['brier']:.3f} → {figures['after']['brier']:.3f} | "
        f"{figures['before']['nll']:.3f} → {figures['after']['nll']:.3f} |"
        for split, figures in rows
    ]
    return [*lines, ""]


def _scores_section(facts: dict[str, Any]) -> list[str]:
    test, spread = facts.get("test") or {}, facts.get("spread")
    if "accuracy" not in test:
        why = facts.get("unmeasured") or "the run left no test figures"
        return ["## Scores", "", f"Not measured on these weights: {_cell(why)}.", ""]
    lines = ["## Scores", ""]
    lines.append(
        f"On the held-out test split ({_prose(test.get('n_documents', '?'))} documents, never "
        "used to train the weights or choose them): "
        f"accuracy **{test['accuracy']:.4f}**, macro-F1 **{test['macro_f1']:.4f}**."
    )
    if spread:
        accuracy, macro_f1 = spread["accuracy"], spread["macro_f1"]
        lines.append(
            f"The same recipe over {_prose(spread['seeds'])} seeds: accuracy "
            f"{accuracy['mean']:.4f} ± "
            f"{accuracy['std']:.4f}, macro-F1 {macro_f1['mean']:.4f} ± {macro_f1['std']:.4f} "
            "(mean ± sd)."
        )
    else:
        lines.append("One training run: its spread over seeds was not measured.")
    per_class = test.get("per_class_f1")
    if per_class and len(per_class) == len(facts["labels"]):
        lines += ["", "| class | F1 |", "|---|---|"]
        lines += [
            # None: no test document of this class and none predicted, so no F1 (not a 0).
            f"| {_cell(name)} | {'no documents' if f1 is None else f'{f1:.3f}'} |"
            for name, f1 in zip(facts["labels"], per_class, strict=True)
        ]
    return [*lines, ""]


def _faithfulness_section(facts: dict[str, Any]) -> list[str]:
    default, tables = facts.get("default_method") or {}, facts.get("faithfulness") or {}
    lines = ["## Which words decided", ""]
    reason = default.get("reason", "")
    lines.append(
        "Every prediction can be explained word by word; `predict(word_scores=True)` and the "
        "server return the scores of the default method"
        + (f". {_prose(reason[:1].upper() + reason[1:])}" if reason else ".")
    )
    if not tables:
        return [*lines, "", "Faithfulness was not measured for this model.", ""]
    lines += [
        "",
        "ERASER faithfulness on the documents each table names (after `docclass fit`, the "
        "test split; AOPC over removing 1–50 % of the words): "
        "comprehensiveness is how much the prediction drops when a method's top words are "
        "removed (higher is better), sufficiency how much it drops when only they are kept "
        "(lower is better). A method earns trust by beating the random ranking on both.",
        "",
    ]
    for name, table in tables.items():
        methods = table.get("methods", {})
        floor = methods.get("random", {}).get("comprehensiveness", 0.0)
        # The report's own table is the one the default method is chosen from; the others come
        # from 'docclass faithfulness' and inform, without changing the choice.
        own = name == REPORT_TABLE
        removal = table.get("removal", "mask") if own else name
        lines += [
            ("The report's table, which chose the default: r" if own else "R")
            + f"emoval by {_prose(REMOVAL_LABELS.get(removal, removal))} ("
            + _prose(table.get("sample") or f"{table.get('documents', '?')} documents")
            + "):",
            "",
            "| method | comprehensiveness | × random | sufficiency |",
            "|---|---|---|---|",
        ]
        # One pool head is a view of pool attention, never a default: methods only.
        shown = {name: row for name, row in methods.items() if not name.startswith(HEAD_PREFIX)}
        for name, row in sorted(shown.items(), key=lambda kv: -kv[1]["comprehensiveness"]):
            lines.append(
                f"| {_cell(method_label(name))} | {row['comprehensiveness']:.3f} | "
                f"{'' if name == 'random' else times_random(row['comprehensiveness'], floor)} | "
                f"{row['sufficiency']:.3f} |"
            )
        lines.append("")
    return lines


def _limits_section(facts: dict[str, Any]) -> list[str]:
    data = facts.get("data") or {}
    limit = facts.get("max_tokens")
    lines = ["## Limitations", ""]
    if limit:
        cut = data.get("test_truncated")
        cut_note = f" ({_prose(cut)} of the test documents were longer)" if cut is not None else ""
        lines.append(
            f"- Reads the first **{_prose(limit)} tokens** of a document{cut_note}; the rest is "
            "not seen, and results flag `truncated`."
        )
    else:
        lines.append("- Reads every token of a document (no truncation).")
    languages = ", ".join(_cell(code) for code in facts.get("language") or []) or "not recorded"
    lines.append(f"- Languages seen in training: {languages}. Other languages are unsupported.")
    lines.append(
        f"- Knows only the {len(facts['labels'])} classes named above; every document gets one "
        "of them, however far it is from the training corpus."
    )
    lines.append(
        "- Word scores explain this model's decision, not the truth of the label; pool "
        "attention alone says where the model looked, not why."
    )
    return [*lines, ""]


def _split_sentence(split: dict[str, Any]) -> str:
    if split.get("split_file"):
        return f"The split was read from {_code(split['split_file'])}."
    if split.get("val_split"):
        return "Validation and test are the source's own splits."
    if split.get("split_seed") is None:
        return ""
    return (
        f"Validation ({100 * (split.get('val_fraction') or 0):.0f} %) and test "
        f"({100 * (split.get('test_fraction') or 0):.0f} %) were held out at random, split seed "
        f"{_prose(split['split_seed'])}."
    )


def model_card(facts: dict[str, Any]) -> str:
    """``README.md`` text for a model folder. ``facts``: name, labels, max_tokens, started_from,
    data, test, spread, calibration, faithfulness (removal → table), default_method, license,
    language,
    datasets, parameters, docclass_version."""
    # Not code spans: a backslash escape inside one would show as written.
    labels = ", ".join(_cell(name) for name in facts["labels"])
    origin = facts.get("started_from")
    data = facts.get("data") or {}
    lines = [*_front_matter(facts), f"# {_cell(facts['name'])}", ""]
    lines.append(
        f"A document classifier trained with docclass {_prose(facts.get('docclass_version', ''))}: "
        + (
            f"the pre-trained encoder {_code(origin)}"
            if origin
            else "self-attention blocks trained from scratch"
        )
        + f", then a global attention pool and a linear read-out ({facts.get('parameters', 0):,}"
        f" parameters). Classes: {labels}."
    )
    lines += ["", "## Intended use", ""]
    lines.append(
        "Sorting documents like those of the training corpus into its classes, in bulk or one "
        "at a time, with the words that decided each label. Not for decisions about people "
        "without a person reading the document: check the scores below against your own data."
    )
    lines += ["", "```python", *USAGE, "```", ""]
    lines += ["## Training data", ""]
    if data:
        lines.append(
            f"Source: {_cell(facts.get('data_name', data.get('source', '?')))}. "
            f"{_prose(data.get('train_documents', '?'))} training, "
            f"{_prose(data.get('val_documents', '?'))} validation and "
            f"{_prose(data.get('test_documents', '?'))} test documents after removing "
            f"{_prose(data.get('duplicates_removed', 0))} duplicates (a duplicate never "
            f"straddles two splits). {_split_sentence(facts.get('split') or {})}"
        )
    else:
        lines.append("Not recorded.")
    lines.append("")
    lines += _scores_section(facts) + _calibration_section(facts)
    lines += _faithfulness_section(facts) + _limits_section(facts)
    return "\n".join(lines).rstrip() + "\n"
