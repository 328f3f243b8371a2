"""Integrated gradients, leave-one-word-out agreement and the two sanity checks, on models whose
right answers are known."""

import copy

import numpy as np
import pytest
import torch
from helpers import DOCUMENTS, tiny_classifier

from benchmarks.planted_keyword import planted_keyword_hits
from docclass.artifacts.load import TrainedClassifier, load_classifier
from docclass.data.synthetic import planted_keyword_corpus
from docclass.evaluate import sanity as trust
from docclass.interpret import integrated_gradients as ig
from docclass.interpret.explain import explain_documents
from docclass.interpret.inputs import document_inputs
from docclass.nn.model import DocumentClassifier, ModelConfig


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A model with no self-attention block trained on the planted-keyword corpus, with
    held-out documents and their explanations."""
    workdir = tmp_path_factory.mktemp("planted")
    figures = planted_keyword_hits(str(workdir), block_counts=(0,), epochs=6)
    classifier = load_classifier(workdir / "blocks-0" / "checkpoints" / "last.ckpt")
    rows = planted_keyword_corpus(4, seed=5)
    texts = [row["text"] for row in rows]
    return classifier, rows, texts, explain_documents(classifier, texts), figures


def test_integrated_gradients_add_up_to_the_logit_gap():
    classifier = tiny_classifier(n_layers=1)
    text = DOCUMENTS[1]
    (record,) = explain_documents(classifier, [text])
    scores, relative_delta = ig.integrated_gradients(classifier, text, record, steps=64)
    assert len(scores) == record["words_read"]
    # Completeness: attributions sum to f(x) - f(baseline), the baseline being padding
    # embeddings at the same positions.
    model = classifier.model

    ids, _, predicted = document_inputs(classifier, text, record)
    with torch.no_grad():
        mask = torch.ones(1, len(ids), dtype=torch.bool)
        full = model(ids[None], mask).logits[0, predicted]
        padding = torch.zeros(1, len(ids), model.config.d_model)  # positions kept by the model
        baseline = model(ids[None], mask, token_vectors=padding).logits[0, predicted]
    assert sum(scores) == pytest.approx(float(full - baseline), rel=1e-3, abs=1e-4)
    assert relative_delta < 1e-3


def test_integrated_gradients_find_the_planted_keyword(planted):
    classifier, rows, texts, records, _ = planted
    records = copy.deepcopy(records)
    ig.add_integrated_gradients(classifier, texts, records, steps=16)
    hits = [
        int(np.argmax(record["scores"][ig.IG_METHOD])) == row["keyword_position"]
        for record, row in zip(records, rows, strict=True)
    ]
    # Over training seeds 0-2 (12 documents): 1.00, 0.83, 1.00; a broken attribution finds
    # the keyword about one time in thirty.
    assert np.mean(hits) >= 0.75


def test_leave_one_out_is_each_word_dropped_alone():
    classifier = tiny_classifier(n_layers=1)
    text = DOCUMENTS[0]
    (record,) = explain_documents(classifier, [text])
    importance = trust.leave_one_out(classifier, text, record)

    ids, token_words, predicted = document_inputs(classifier, text, record)
    with torch.no_grad():
        full = torch.softmax(classifier.model(ids[None], torch.ones(1, len(ids)).bool()).logits, -1)
        for word in (0, record["words_read"] - 1):
            keep = torch.from_numpy(token_words != word)[None]
            without = torch.softmax(classifier.model(ids[None], keep).logits, -1)
            expected = float(full[0, predicted] - without[0, predicted])
            assert importance[word] == pytest.approx(expected, abs=1e-6)


def test_kendall_tau_is_one_for_leave_one_out_itself_and_low_for_reversed(planted):
    classifier, _, texts, records, _ = planted
    records = copy.deepcopy(records)
    for record, text in zip(records, texts, strict=True):
        importance = trust.leave_one_out(classifier, text, record)
        record["scores"] = {"itself": importance.tolist(), "reversed": (-importance).tolist()}
    agreement = trust.loo_agreement(classifier, texts, records)
    assert agreement["itself"]["mean"] == pytest.approx(1.0)
    assert agreement["reversed"]["mean"] == pytest.approx(-1.0)
    assert agreement["itself"]["documents"] == len(texts)


def test_permuting_the_pool_moves_a_keyword_model_and_not_a_bag_of_identical_tokens(planted):
    classifier, _, texts, _, _ = planted
    moved = trust.permuted_pool(classifier, texts, permutations=10)
    # The keyword decides the label and only the pool's weights single it out. Over training
    # seeds 0-2: total variation 0.41, 0.45, 0.66; documents changing label 1.00, 0.50, 0.67.
    assert moved["median_total_variation"] > 0.2
    assert moved["documents_any_label_change"] >= 0.4

    # No positions, no blocks, one word repeated: every token vector is the same, so no
    # permutation of the weights can move anything.
    config = ModelConfig(
        vocab_size=classifier.tokenizer.get_vocab_size(), num_classes=3, d_model=16,
        n_heads=2, n_layers=0, pool_heads=2, positions="none",
    )  # fmt: skip
    still = TrainedClassifier(
        DocumentClassifier(config).eval(), classifier.tokenizer, ["a", "b", "c"], None
    )
    unmoved = trust.permuted_pool(still, ["zorblax " * 12, "quintessa " * 30], permutations=5)
    assert unmoved["median_total_variation"] == pytest.approx(0.0, abs=1e-9)
    assert unmoved["documents_any_label_change"] == 0.0


def test_a_documents_pool_shuffles_do_not_depend_on_its_batch(planted):
    # Each document draws its shuffles from its own generator: one batch for all, or one
    # document per batch, gives every figure the same.
    classifier, _, texts, _, _ = planted
    together = trust.permuted_pool(classifier, texts, permutations=6, batch_size=16)
    alone = trust.permuted_pool(classifier, texts, permutations=6, batch_size=1)
    assert together == pytest.approx(alone, abs=1e-9)


def test_randomised_copy_takes_fresh_weights_only_where_asked():
    classifier = tiny_classifier(n_layers=2)
    stages = trust.randomisation_stages(classifier.model)
    assert [name for name, _ in stages] == [
        "read-out", "pool", "block 1", "block 0", "embeddings",
    ]  # fmt: skip
    partial = trust.randomised_copy(classifier, stages[1][1], seed=3).model.state_dict()
    torch.manual_seed(trust.fresh_weights_seed(classifier, 3))
    fresh = DocumentClassifier(classifier.model.config).state_dict()
    trained = classifier.model.state_dict()
    for key, value in partial.items():
        source = fresh if key.split(".")[0] in ("head", "pool", "final_norm") else trained
        assert torch.equal(value, source[key]), key
    assert not torch.equal(partial["head.weight"], trained["head.weight"])
    assert trust.fresh_weights_seed(classifier, 4) != trust.fresh_weights_seed(classifier, 3)


def test_randomised_weights_are_not_the_ones_training_started_from():
    """``tiny_classifier`` is built under ``torch.manual_seed(0)``, as a run trained with
    ``seed_everything(0)`` starts: a copy "randomised" with seed 0 must not be those weights
    again (a weight training barely moved would look randomised and be unchanged)."""
    classifier = tiny_classifier(n_layers=1)
    every_stage = trust.randomisation_stages(classifier.model)[-1][1]
    torch.rand(7)  # a generator state no fresh seeding would leave
    state = torch.random.get_rng_state()
    randomised = trust.randomised_copy(classifier, every_stage, seed=0).model.state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's draws left alone
    for key in ("head.weight", "pool.queries", "embed.weight"):
        pair = torch.stack(
            [randomised[key].flatten(), classifier.model.state_dict()[key].flatten()]
        )
        assert abs(float(torch.corrcoef(pair)[0, 1])) < 0.5, key


def test_the_last_stage_randomises_every_weight_a_pre_trained_encoder_has():
    """A post-norm encoder's embedding LayerNorm holds trained weights (MiniLM's scale is not
    1): left out, "every weight randomised" kept some trained ones."""
    classifier = tiny_classifier(
        n_layers=2, embedding_norm=True, norm="post", positions="learned", max_positions=64
    )
    with torch.no_grad():
        for parameter in classifier.model.parameters():
            parameter.add_(torch.randn_like(parameter))  # trained: no weight at its start value
    every_stage = trust.randomisation_stages(classifier.model)[-1][1]
    randomised = trust.randomised_copy(classifier, every_stage).model.state_dict()
    kept = [
        key
        for key, value in classifier.model.state_dict().items()
        if value.is_floating_point() and torch.equal(value, randomised[key])
    ]
    assert kept == []


def test_randomising_weights_changes_faithful_scores_and_not_what_cannot_see_them(planted):
    classifier, _, texts, records, _ = planted
    result = trust.randomised_weights(classifier, texts, records)
    assert list(result) == ["read-out", "pool", "embeddings"]
    # Pool attention is computed before the read-out: randomising the read-out cannot move it.
    assert result["read-out"]["attention"]["mean"] == pytest.approx(1.0)
    # With every weight fresh the scores have moved. Pool attention keeps a rank correlation of
    # about 0.55 here: fixed sinusoidal positions are not weights and survive randomisation.
    for method in ("contribution", "grad_input"):
        assert result["embeddings"][method]["mean"] < 0.5, method
    assert result["embeddings"]["attention"]["mean"] < 0.7


def _fixed_records(scores_by_method, n_words=4):
    return [{"words_read": n_words, "scores": dict(scores_by_method)} for _ in range(3)]


def test_scores_made_constant_by_randomising_count_as_rho_zero_not_vanish(monkeypatch):
    """A method whose scores randomising flattens has lost everything the trained model gave
    it: dropping its NaN ρ would leave the mean to the documents where it survived."""
    trained = _fixed_records({"flat": [0.4, 0.3, 0.2, 0.1], "kept": [0.4, 0.3, 0.2, 0.1]})
    after = _fixed_records({"flat": [0.0] * 4, "kept": [0.4, 0.3, 0.2, 0.1]})
    after[0]["scores"]["flat"] = [0.1, 0.2, 0.3, 0.4]  # one document reversed, not flattened
    monkeypatch.setattr(trust, "randomisation_stages", lambda model: [("all", [])])
    monkeypatch.setattr(trust, "randomised_copy", lambda classifier, modules, seed: classifier)
    monkeypatch.setattr(trust, "explain_documents", lambda *args, **kwargs: after)
    classifier = type("Stub", (), {"model": None})()
    result = trust.randomised_weights(classifier, ["text"] * 3, trained)["all"]
    assert result["flat"]["documents"] == 3 and result["flat"]["constant"] == 2
    assert result["flat"]["mean"] == pytest.approx(-1 / 3, abs=1e-4)
    assert result["kept"] == {"mean": 1.0, "std": 0.0, "documents": 3, "constant": 0}


def test_every_method_s_tau_covers_the_same_documents(monkeypatch):
    """Constant scores rank nothing (τ = 0) rather than leaving a method a document short;
    a document whose leave-one-out importance is constant is left out for every method."""
    importance = iter([np.array([3.0, 2.0, 1.0, 0.0]), np.zeros(4), np.array([3.0, 2, 1, 0])])
    monkeypatch.setattr(trust, "leave_one_out", lambda *args: next(importance))
    records = _fixed_records({"ranked": [0.4, 0.3, 0.2, 0.1], "flat": [0.4, 0.3, 0.2, 0.1]})
    records[0]["scores"]["flat"] = [0.5] * 4
    agreement = trust.loo_agreement(None, ["text"] * 3, records)
    assert agreement["ranked"] == {"mean": 1.0, "std": 0.0, "documents": 2}
    assert agreement["flat"]["documents"] == 2 and agreement["flat"]["mean"] == 0.5


def test_the_page_says_when_a_method_s_figures_cover_fewer_documents():
    from docclass.report.html import _extra_rows

    summary = {"mean": 0.5, "std": 0.1, "documents": 5}
    sample = {
        "documents": 5,
        "kendall_tau_vs_leave_one_out": {"grad_input": summary, "attention": summary},
        "randomised_weights": {
            "all": {
                "grad_input": {**summary, "constant": 2},
                "attention": {**summary, "documents": 3},
            }
        },
    }
    rows = {row["name"]: row for row in _extra_rows({"sample": sample})["sample"]["rows"]}
    assert rows["gradient × input"]["rho"] == ["0.50 (2 constant)"]
    assert rows["pool attention"]["rho"] == ["0.50 (3 documents)"]
    assert rows["pool attention"]["tau"] == "0.50 ± 0.10"


def test_a_documents_median_over_an_even_count_of_permutations_is_the_middle_twos_mean():
    per_permutation = [torch.tensor([1.0, 4.0]), torch.tensor([3.0, 2.0])]
    assert trust.median_over_permutations(per_permutation) == [2.0, 3.0]
    odd = [*per_permutation, torch.tensor([0.0, 9.0])]
    assert trust.median_over_permutations(odd) == [1.0, 4.0]
