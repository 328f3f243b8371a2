"""Faithfulness measures against hand-computed values, and the planted-keyword corpus."""

from collections import Counter

import numpy as np
import pytest
import torch
from helpers import CONFIGS

from benchmarks.planted_keyword import planted_keyword_hits
from docclass.data.synthetic import planted_keyword_corpus
from docclass.evaluate.erasure import (
    aopc,
    removal_curves,
    top_k,
)


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


@pytest.mark.fault(
    "a corpus where one planted keyword decides every label (ground truth for word scores)",
    "with no self-attention block, pool attention, contribution, rollout and gradient × "
    "input all rank the keyword first in ≥ 95 % of held-out documents",
)
def test_word_scores_find_the_planted_keyword(tmp_path):
    figures = planted_keyword_hits(str(tmp_path), block_counts=(0,), epochs=6)
    run = figures["runs"]["0 blocks"]
    assert run["test_accuracy"] >= 0.95
    for method in ("attention", "contribution", "rollout", "grad_input"):
        assert run["keyword_ranked_first"][method] >= 0.95, method


@pytest.mark.parametrize(
    ("window", "removal"),
    [(0, "mask"), (3, "mask"), (0, "unk")],
    ids=["cut-out copies", "windowed, masked whole", "unk"],
)
def test_batched_curves_equal_one_forward_per_perturbed_copy(window, removal):
    from helpers import tiny_classifier

    from docclass.data.tokenizer import UNK_ID, align_words, encode_batch
    from docclass.evaluate.erasure import document_curves
    from docclass.interpret.explain import explain_documents

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
                else:
                    logits = classifier.model(ids.masked_fill(~keep, UNK_ID), keep | True).logits
                probs.append(torch.softmax(logits, -1)[0, predicted].item())
        return np.array(probs)

    expected = removal_curves(one_at_a_time, n_words, ranking)
    for measure in ("comprehensiveness", "sufficiency"):
        assert batched["rollout"][measure] == pytest.approx(expected[measure], abs=1e-5)


def test_planted_keyword_rankings_beat_random_by_a_wide_margin(tmp_path):
    from docclass.evaluate.erasure import faithfulness_table
    from docclass.interpret.explain import explain_documents
    from docclass.train.checkpoint import load_classifier

    planted_keyword_hits(str(tmp_path), block_counts=(0,), epochs=6)
    classifier = load_classifier(tmp_path / "blocks-0" / "checkpoints" / "last.ckpt")
    texts = [row["text"] for row in planted_keyword_corpus(5, seed=2)]
    records = explain_documents(classifier, texts)
    table = faithfulness_table(classifier, texts, records)
    floor = table["random"]["comprehensiveness"]
    for method in ("attention", "contribution", "grad_input"):
        assert table[method]["comprehensiveness"] > 3 * max(floor, 0.01), method
        assert table[method]["sufficiency"] < table["random"]["sufficiency"], method


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
    main([
        "faithfulness", "--ckpt", ckpt, "--data", str(CONFIGS / "tiny.yaml"),
        "--out", str(out), "--limit", "6", "--sample", "3", "--ig_steps", "4",
        "--permutations", "3",
    ])  # fmt: skip
    figures = json.loads((out / "faithfulness.json").read_text())
    assert figures["documents"] == 6 and set(figures["removal"]) == {"mask", "unk"}
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
