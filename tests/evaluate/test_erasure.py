"""Faithfulness measures against hand-computed values, and the planted-keyword corpus."""

import gzip
from collections import Counter

import numpy as np
import pytest
import torch
from helpers import CONFIGS, tiny_classifier

from benchmarks.planted_keyword import planted_keyword_hits
from docclass.data.synthetic import planted_keyword_corpus
from docclass.evaluate.erasure import (
    aopc,
    removal_curves,
    top_k,
)
from docclass.interpret.explain import explain_documents


def test_removal_curves_match_a_hand_computed_example():
    # A "model" whose probability is 0.1 plus 0.4 for word 3 and 0.2 for word 1 when present.
    def probability(masks):
        return np.array([0.1 + 0.4 * m[3] + 0.2 * m[1] for m in masks])

    ranking = [3, 1, 0, 2, 4, 5, 6, 7, 8, 9]  # 10 words, the right ones first
    curves = removal_curves(probability, 10, ranking, fractions=(0.1, 0.2, 0.5))
    # full 0.7; without top 1 (word 3): 0.3; without top 2: 0.1; without top 5: 0.1
    assert curves["comprehensiveness"] == pytest.approx([0.4, 0.6, 0.6])
    # only top 1: 0.5; only top 2: 0.7; only top 5: 0.7
    assert curves["sufficiency"] == pytest.approx([0.2, 0.0, 0.0])
    assert aopc(curves["comprehensiveness"]) == pytest.approx(1.6 / 3)
    worst = removal_curves(probability, 10, ranking[::-1], fractions=(0.1, 0.2, 0.5))
    assert aopc(worst["comprehensiveness"]) < aopc(curves["comprehensiveness"])


def test_top_k_is_at_least_one_word_and_at_most_all():
    assert [top_k(10, f) for f in (0.01, 0.05, 0.1, 0.2, 0.5, 1.0)] == [1, 1, 1, 2, 5, 10]
    assert top_k(3, 0.5) == 2 and top_k(1, 0.01) == 1


def test_planted_corpus_has_one_deciding_keyword_per_document():
    keywords = ("zorblax", "quintessa", "vermilox")
    rows = planted_keyword_corpus(50, keywords, seed=3)
    assert Counter(row["label"] for row in rows) == {k: 50 for k in keywords}
    for row in rows:
        words = row["text"].split()
        assert [w for w in words if w in keywords] == [row["label"]]
        assert words[row["keyword_position"]] == row["label"]
    assert planted_keyword_corpus(50, keywords, seed=3) == rows  # reproducible


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The tiny config trained once on the planted-keyword corpus, no self-attention block."""
    workdir = tmp_path_factory.mktemp("planted")
    return planted_keyword_hits(str(workdir), block_counts=(0,), epochs=6), workdir


@pytest.mark.fault(
    "a corpus where one planted keyword decides every label (ground truth for word scores)",
    "with no self-attention block, pool attention, contribution, rollout and gradient × "
    "input all rank the keyword first in ≥ 95 % of held-out documents",
)
def test_word_scores_find_the_planted_keyword(planted):
    figures, _ = planted
    run = figures["runs"]["0 blocks"]
    assert run["test_accuracy"] >= 0.95
    for method in ("attention", "contribution", "rollout", "grad_input"):
        assert run["keyword_ranked_first"][method] >= 0.95, method


@pytest.mark.parametrize(
    ("window", "removal"),
    [(0, "mask"), (3, "mask"), (0, "unk"), (0, "delete"), (3, "delete"), (-4, "mask"),
     (-4, "delete")],
    ids=["cut-out copies", "windowed, masked whole", "unk", "deleted", "windowed, deleted",
         "encoder windows, cut-out copies", "encoder windows, deleted"],
)  # fmt: skip
def test_batched_curves_equal_one_forward_per_perturbed_copy(window, removal):
    """Every perturbed copy of one document, batched (and a copy asked for twice run once),
    gives what one forward pass per copy gives. A negative window is an encoder window: the
    document is read in windows of that many tokens, and a cut-out copy keeps each token in
    its own window."""

    from docclass.data.tokenizer import UNK_ID, align_words, encode_batch
    from docclass.evaluate.erasure import document_curves
    from docclass.interpret.explain import explain_documents

    if window < 0:
        classifier = tiny_classifier(n_layers=1, window_tokens=-window, window_overlap=1)
    else:
        classifier = tiny_classifier(n_layers=1, attention_window=window)
    text = "Markets rallied as the central bank held interest rates, and shares rose."
    (record,) = explain_documents(classifier, [text])
    n_words = record["words_read"]
    ranking = np.argsort(-np.asarray(record["scores"]["rollout"][:n_words])).tolist()
    batched = document_curves(classifier, text, record, {"rollout": ranking}, removal, batch_size=3)

    encoding = encode_batch(classifier.tokenizer, [text])[0]
    token_words = np.asarray(align_words(encoding).token_words)
    ids = torch.tensor([encoding.ids])
    predicted = classifier.label_names.index(record["predicted"])

    def one_at_a_time(masks):
        probs = []
        with torch.no_grad():
            for mask in masks:
                keep = torch.from_numpy(mask[token_words])[None]
                if removal == "mask":
                    logits = classifier.model(ids, keep).logits
                elif removal == "delete":
                    # The text without those words: later tokens take the freed positions.
                    shorter = ids[keep][None]
                    logits = classifier.model(shorter, torch.ones_like(shorter, dtype=bool)).logits
                else:
                    logits = classifier.model(ids.masked_fill(~keep, UNK_ID), keep | True).logits
                probs.append(torch.softmax(logits, -1)[0, predicted].item())
        return np.array(probs)

    expected = removal_curves(one_at_a_time, n_words, ranking)
    for measure in ("comprehensiveness", "sufficiency"):
        assert batched["rollout"][measure] == pytest.approx(expected[measure], abs=1e-5)


@pytest.mark.parametrize("removal", ["mask", "delete"])
def test_planted_keyword_rankings_beat_random_by_a_wide_margin(planted, removal):
    from docclass.artifacts.load import load_classifier
    from docclass.evaluate.erasure import faithfulness_table
    from docclass.interpret.explain import explain_documents

    _, workdir = planted
    classifier = load_classifier(workdir / "blocks-0" / "checkpoints" / "last.ckpt")
    texts = [row["text"] for row in planted_keyword_corpus(5, seed=2)]
    records = explain_documents(classifier, texts)
    table = faithfulness_table(classifier, texts, records, removal)
    floor = table["random"]["comprehensiveness"]
    for method in ("attention", "contribution", "grad_input"):
        assert table[method]["comprehensiveness"] > 3 * max(floor, 0.01), method
        assert table[method]["sufficiency"] < table["random"]["sufficiency"], method


def test_report_with_rationales_scores_plausibility_and_finds_counterfactuals(planted, tmp_path):
    import json

    from docclass.cli import main
    from docclass.data.synthetic import eraser_rationales

    _, workdir = planted
    rows = planted_keyword_corpus(4, seed=3)
    ids = [f"doc-{i}" for i in range(len(rows))]
    corpus, rationales = tmp_path / "held-out.jsonl", tmp_path / "rationales.jsonl"
    corpus.write_text("".join(
        json.dumps({"id": i, "text": r["text"], "label": r["label"]}) + "\n"
        for i, r in zip(ids, rows, strict=True)
    ))  # fmt: skip
    # Two documents carry no rationale: plausibility covers the others, nothing fails.
    annotations = eraser_rationales(rows, ids)[2:]
    rationales.write_text("".join(json.dumps(a) + "\n" for a in annotations))
    ckpt = str(workdir / "blocks-0" / "checkpoints" / "last.ckpt")
    out = tmp_path / "report"
    main(["report", "--ckpt", ckpt, "--data", str(corpus), "--split", "train",
          "--out", str(out), "--rationales", str(rationales)])  # fmt: skip
    meta = json.loads((out / "report.json").read_text())
    table = meta["checks"]["plausibility"]
    assert table["documents"] == len(rows) - 2
    # The keyword is one word: every method that ranks it first has token F1 1 and AUPRC 1.
    for method in ("attention", "contribution", "grad_input"):
        assert table["methods"][method]["token_f1"] == 1.0, method
        assert table["methods"][method]["iou_f1"] == 1.0, method
        assert table["methods"][method]["auprc"] == 1.0, method
    index = (out / "index.html").read_text(encoding="utf-8")
    assert 'id="plausibility-table"' in index
    # The default method's top word is the keyword; without it most documents change label
    # (those of the class the filler words lean to keep theirs, and flip a few words later).
    counterfactual = meta["checks"]["counterfactual"]
    assert counterfactual["share"] >= 0.6 and counterfactual["median_words"] == 1
    records = [json.loads(line) for line in gzip.open(out / "explanations.jsonl.gz", "rt")]
    flipped = [(p, r) for p, r in enumerate(records) if r["counterfactual"]["k"]]
    for position, record in flipped:
        assert record["counterfactual"]["words"][0] == rows[position]["label"]
        assert record["counterfactual"]["label"] != record["predicted"]
    position = flipped[0][0]
    page = (out / "docs" / f"doc-{position:05d}.html").read_text(encoding="utf-8")
    assert f"removing <i>{rows[position]['label']}</i>" in page
    main(["faithfulness", "--ckpt", ckpt, "--data", str(corpus), "--split", "train",
          "--out", str(tmp_path / "f"), "--rationales", str(rationales), "--sample", "0",
          "--removals", "[mask]"])  # fmt: skip
    figures = json.loads((tmp_path / "f" / "faithfulness.json").read_text())
    assert figures["plausibility"]["methods"] == table["methods"]
    # The same documents unlabelled, under another column name: the figures follow the
    # predicted class, so they are the same (before, such a file could not be read at all).
    unlabelled = tmp_path / "unlabelled.jsonl"
    unlabelled.write_text("".join(
        json.dumps({"id": i, "body": r["text"]}) + "\n" for i, r in zip(ids, rows, strict=True)
    ))  # fmt: skip
    main(["faithfulness", "--ckpt", ckpt, "--data", str(unlabelled), "--split", "train",
          "--out", str(tmp_path / "u"), "--rationales", str(rationales), "--sample", "0",
          "--removals", "[mask]", "--text_column", "body", "--label_column", "null"])  # fmt: skip
    again = json.loads((tmp_path / "u" / "faithfulness.json").read_text())
    assert again["plausibility"] == figures["plausibility"]
    assert again["removal"]["mask"]["aopc"] == figures["removal"]["mask"]["aopc"]


def test_faithfulness_command_writes_table_plot_checks_and_updates_the_report(
    fitted, tmp_path, capsys
):
    import json

    from docclass.cli import main

    out = tmp_path / "faithfulness"
    ckpt = str(fitted / "checkpoints" / "last.ckpt")
    main(["report", "--ckpt", ckpt, "--data", str(CONFIGS / "tiny.yaml"), "--out", str(out),
          "--limit", "6"])  # fmt: skip
    assert "sanity-table" not in (out / "index.html").read_text(encoding="utf-8")
    own = json.loads((out / "report.json").read_text())["faithfulness"]
    main([
        "faithfulness", "--ckpt", ckpt, "--data", str(CONFIGS / "tiny.yaml"),
        "--out", str(out), "--limit", "6", "--sample", "3", "--ig_steps", "4",
        "--permutations", "3",
    ])  # fmt: skip
    figures = json.loads((out / "faithfulness.json").read_text())
    # The documents the tables cover, counted as the report's own table counts them.
    assert figures["documents"] == own["documents"] and figures["documents_given"] == 6
    assert set(figures["removal"]) == {"mask", "delete", "unk"}
    for table in figures["removal"].values():
        assert {"attention", "contribution", "rollout", "grad_input", "random"} <= set(
            table["aopc"]
        )
        assert all(len(row["curve"]) == len(figures["fractions"]) for row in table["aopc"].values())
    sample = figures["sample"]
    assert sample["documents"] == 3 and len(sample["indices"]) == 3
    assert "integrated_gradients" in sample["aopc_mask"]
    assert "integrated_gradients" in sample["kendall_tau_vs_leave_one_out"]
    assert list(sample["randomised_weights"]) == ["read-out", "pool", "block 0", "embeddings"]
    assert figures["permuted_pool"]["documents"] == 6
    assert (out / "faithfulness.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "× random" in printed and "rendered again" in printed
    index = (out / "index.html").read_text(encoding="utf-8")
    assert 'id="sanity-table"' in index and "Permuted pool" in index
    assert "integrated gradients" in index
    # A new report in the folder drops the old figures rather than show them beside new ones.
    main(["report", "--ckpt", ckpt, "--data", str(CONFIGS / "tiny.yaml"), "--out", str(out),
          "--limit", "4"])  # fmt: skip
    assert not (out / "faithfulness.json").exists()
    assert "sanity-table" not in (out / "index.html").read_text(encoding="utf-8")


def test_faithfulness_figures_count_the_documents_they_measured():
    """A one-word document is in no table, nor in τ or ρ: the count says the documents the
    figures cover (and the page, the documents given beside it)."""
    from helpers import DOCUMENTS, tiny_classifier

    from docclass.evaluate.faithfulness import faithfulness_figures
    from docclass.report.html import _extra_rows

    texts = [*DOCUMENTS, "Short"]  # one word read: nothing to rank
    classifier = tiny_classifier(n_layers=1)
    figures = faithfulness_figures(
        classifier, texts, removals=("mask",), sample=len(texts), ig_steps=0, permutations=2
    )
    assert figures["documents"] == len(texts) - 1
    assert figures["documents_given"] == len(texts)
    assert figures["sample"]["documents"] == len(texts) - 1
    assert len(figures["sample"]["indices"]) == len(texts)
    extra = _extra_rows(figures)
    assert (extra["documents"], extra["given"]) == (len(texts) - 1, len(texts))


def test_faithfulness_of_other_weights_leaves_the_report_in_the_folder_alone(fitted, tmp_path):
    """A report names the weights it explains: figures of another checkpoint written into its
    folder must not appear on its pages as if they were its model's."""
    import torch

    from docclass.cli import main

    out = tmp_path / "report"
    ckpt = fitted / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["state_dict"]["model.head.weight"] += 0.5
    other = tmp_path / "other.ckpt"
    torch.save(checkpoint, other)
    data = str(CONFIGS / "tiny.yaml")
    main(["report", "--ckpt", str(ckpt), "--data", data, "--out", str(out), "--limit", "3"])
    main(["faithfulness", "--ckpt", str(other), "--data", data, "--out", str(out), "--limit", "3",
          "--sample", "0", "--removals", "[mask]", "--permutations", "2"])  # fmt: skip
    assert (out / "faithfulness.json").is_file()
    assert "sanity-table" not in (out / "index.html").read_text(encoding="utf-8")


def test_faithfulness_leaves_a_report_explained_under_other_rules_alone(fitted, tmp_path):
    """The same weights explained under other relevance rules (the rules changed, the
    checkpoint did not): the report's pages would describe and measure scores its records do
    not hold, so the folder's report is not rendered again; the table names its rules."""
    import json

    from docclass.cli import main
    from docclass.interpret.methods import score_rules
    from docclass.report.html import REPORT_META

    out = tmp_path / "report"
    ckpt, data = str(fitted / "checkpoints" / "last.ckpt"), str(CONFIGS / "tiny.yaml")
    main(["report", "--ckpt", ckpt, "--data", data, "--out", str(out), "--limit", "3"])
    meta = json.loads((out / REPORT_META).read_text(encoding="utf-8"))
    assert meta["scores"] == score_rules()
    meta["scores"] = "conservative: cp; conservative and grad_input explain the logit"
    (out / REPORT_META).write_text(json.dumps(meta), encoding="utf-8")
    faithfulness = ["faithfulness", "--ckpt", ckpt, "--data", data, "--out", str(out),
                    "--limit", "3", "--sample", "0", "--removals", "[delete]",
                    "--permutations", "2"]  # fmt: skip
    written = (out / "index.html").stat().st_mtime_ns
    main(faithfulness)
    assert (out / "index.html").stat().st_mtime_ns == written  # not rendered again
    assert json.loads((out / "faithfulness.json").read_text())["scores"] == score_rules()
    assert "Words removed by deletion" not in (out / "index.html").read_text(encoding="utf-8")
    meta["scores"] = score_rules()  # the same rules: rendered again with the figures
    (out / REPORT_META).write_text(json.dumps(meta), encoding="utf-8")
    main(faithfulness)
    assert "Words removed by deletion" in (out / "index.html").read_text(encoding="utf-8")


def test_the_counterfactual_words_and_positions_pair_up(monkeypatch):
    """Words were in rank order and positions in text order: zipped, each word got another's
    position. A made-up score ranks later words first; removing two words flips the label."""
    import docclass.evaluate.counterfactual as counterfactual

    classifier = tiny_classifier(n_layers=1)
    text = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima"
    [record] = explain_documents(classifier, [text])
    record["scores"]["later_first"] = list(np.linspace(0, 1, record["words_read"]))
    predicted = classifier.label_names.index(record["predicted"])

    def flips_after_two(model, ids, token_words, masks, removal, **kwargs):
        rows = np.full((len(masks), len(classifier.label_names)), 0.1)
        for row, keep in zip(rows, masks, strict=True):
            row[predicted if (~keep).sum() < 2 else (predicted + 1) % len(row)] = 0.8
        return rows / rows.sum(axis=1, keepdims=True)

    monkeypatch.setattr(counterfactual, "keep_distributions", flips_after_two)
    result = counterfactual.document_counterfactual(classifier, text, record, "later_first")
    assert result["k"] == 2 and result["words"] == ["lima", "kilo"]
    assert [record["words"][i] for i in result["indices"]] == result["words"]


def test_the_counterfactual_search_reads_the_faithfulness_copies(planted):
    """As the report runs them: the counterfactual search given the faithfulness measure's
    copies runs fewer new ones, counts the faithfulness counts as tried, and its answer holds
    (removing the top k words changes the label, the top k - 1 do not)."""
    import zlib

    from docclass.artifacts.load import load_classifier
    from docclass.evaluate import erasure
    from docclass.evaluate.counterfactual import document_counterfactual
    from docclass.evaluate.erasure import document_faithfulness, keep_distributions, rank_words
    from docclass.interpret.explain import explain_documents
    from docclass.interpret.inputs import document_inputs

    _, workdir = planted
    classifier = load_classifier(workdir / "blocks-0" / "checkpoints" / "last.ckpt")
    flipped = 0
    for row in planted_keyword_corpus(4, seed=4):
        text = row["text"]
        (record,) = explain_documents(classifier, [text])
        copies: dict = {}
        assert document_faithfulness(classifier, text, record, copies=copies)
        run: list = []
        real = erasure._run_copies

        def counted(model, ids, token_words, masks, *rest, real=real, run=run):
            run.extend(masks)
            return real(model, ids, token_words, masks, *rest)

        erasure._run_copies = counted
        try:
            alone = document_counterfactual(classifier, text, record, "contribution")
            ran_alone = len(run)
            run.clear()
            shared = document_counterfactual(
                classifier, text, record, "contribution", copies=copies
            )
        finally:
            erasure._run_copies = real
        assert len(run) < ran_alone
        n = record["words_read"]
        counts = {erasure.top_k(n, f) for f in erasure.FRACTIONS} & set(range(alone["tried"] + 1))
        assert counts and counts <= set(shared["counts"])
        assert shared["k"] == alone["k"]  # a keyword decides: the label falls and stays down
        if shared["k"] is None:
            continue
        flipped += 1
        ranking = rank_words(record["scores"]["contribution"][:n], zlib.crc32(text.encode()))
        ids, token_words, predicted = document_inputs(classifier, text, record)
        masks = []
        for k in (shared["k"] - 1, shared["k"]):
            keep = np.ones(n, dtype=bool)
            keep[ranking[:k]] = False
            masks.append(keep)
        labels = keep_distributions(classifier.model, ids, token_words, masks).argmax(axis=1)
        assert labels[0] == predicted and labels[1] != predicted
    assert flipped


def test_the_counterfactual_probability_is_calibrated_as_the_pages_are(planted):
    """The page shows the counterfactual's p beside calibrated probabilities: it is the
    removed copy's softmax of logits / T, not the raw softmax."""
    import zlib

    from docclass.artifacts.load import load_classifier
    from docclass.evaluate.counterfactual import document_counterfactual
    from docclass.evaluate.erasure import keep_distributions, rank_words
    from docclass.interpret.explain import explain_documents
    from docclass.interpret.inputs import document_inputs

    _, workdir = planted
    classifier = load_classifier(workdir / "blocks-0" / "checkpoints" / "last.ckpt")
    hot = classifier.with_temperature(2.5)
    checked = 0
    for row in planted_keyword_corpus(4, seed=4):
        text = row["text"]
        (record,) = explain_documents(hot, [text])
        found = document_counterfactual(hot, text, record, "contribution")
        if found["k"] is None:
            continue
        n = record["words_read"]
        ranking = rank_words(record["scores"]["contribution"][:n], zlib.crc32(text.encode()))
        ids, token_words, _ = document_inputs(hot, text, record)
        keep = np.ones(n, dtype=bool)
        keep[ranking[: found["k"]]] = False
        raw = torch.from_numpy(keep_distributions(hot.model, ids, token_words, [keep])[0])
        label = classifier.label_names.index(found["label"])
        calibrated = (raw.double().log() / 2.5).softmax(-1)[label].item()
        assert found["p"] == pytest.approx(calibrated, abs=1e-4)
        assert abs(found["p"] - raw[label].item()) > 1e-3
        checked += 1
    assert checked


def test_the_report_hands_its_faithfulness_copies_to_the_counterfactual_search(
    planted, tmp_path, monkeypatch
):
    """Through ``docclass report``: every measured document's copies reach the search, each
    holds only copies the search may read (at most its limit of words removed), and all are
    read and freed by the end."""
    import json

    from docclass.cli import main
    from docclass.evaluate.counterfactual import search_limit
    from docclass.inference import reporting

    seen: dict = {}
    real = reporting.add_counterfactuals

    def spy(*args, copies=None, **kwargs):
        seen["before"] = {position: dict(kept) for position, kept in copies.items()}
        result = real(*args, copies=copies, **kwargs)
        seen["after"] = dict(copies)
        return result

    monkeypatch.setattr(reporting, "add_counterfactuals", spy)
    _, workdir = planted
    rows = planted_keyword_corpus(3, seed=5)
    corpus = tmp_path / "held-out.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    main(["report", "--ckpt", str(workdir / "blocks-0" / "checkpoints" / "last.ckpt"),
          "--data", str(corpus), "--split", "train", "--out", str(tmp_path / "r")])  # fmt: skip
    assert sorted(seen["before"]) == list(range(len(rows))) and seen["after"] == {}
    explanations = tmp_path / "r" / "explanations.jsonl.gz"
    records = [json.loads(line) for line in gzip.open(explanations, "rt")]
    for position, kept in seen["before"].items():
        limit = search_limit(records[position]["words_read"])
        removed = [int((~np.frombuffer(key[1], dtype=bool)).sum()) for key in kept]
        assert kept and max(removed) <= limit < records[position]["words_read"] * 0.5
        # The faithfulness counts under the limit were read, not run again.
        assert set(removed) & set(records[position]["counterfactual"]["counts"])
