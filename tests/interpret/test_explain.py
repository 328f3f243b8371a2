"""Word scores: every method checked against its definition, on hard text and long documents."""

import json
import math

import numpy as np
import pytest
import torch
from helpers import (
    DOCUMENTS,
    HARD_TEXTS,
    LABELS,
    lead_weights,
    norms_and_gates_held,
    tiny_classifier,
)
from torch.testing import assert_close

from docclass.artifacts.load import TrainedClassifier
from docclass.data.tokenizer import align_words, encode_batch
from docclass.interpret.explain import (
    LAYER_MAP_MAX_WORDS,
    _layer_maps,
    class_contrast,
    contrast_classes,
    explain_documents,
)
from docclass.interpret.inputs import encode_documents
from docclass.interpret.methods import RELEVANCE_METHODS, scoring_pass, word_relevance
from docclass.interpret.records import (
    compact,
    file_record,
    method_names,
    read_jsonl,
    write_jsonl,
)
from docclass.nn.attention import banded_to_dense

SUMS_TO_ONE = ["attention", "rollout", "attention_head0", "attention_head1"]


def test_one_record_per_document_in_input_order_with_every_method():
    records = explain_documents(
        tiny_classifier(), DOCUMENTS, labels=["markets", None, "tech", None]
    )
    assert [r["id"] for r in records] == [0, 1, 2, 3]
    assert [r["text"] for r in records] == DOCUMENTS
    assert records[0]["label"] == "markets" and records[1]["label"] is None
    for record in records:
        assert set(record["scores"]) == set(method_names(2))
        assert record["predicted"] in LABELS
        assert math.isclose(sum(record["probs"].values()), 1.0, abs_tol=1e-5)
        for values in record["scores"].values():
            assert len(values) == len(record["words"]) and all(map(math.isfinite, values))
        for method in SUMS_TO_ONE:
            assert math.isclose(sum(record["scores"][method]), 1.0, abs_tol=1e-4), method
            assert min(record["scores"][method]) >= 0


@pytest.mark.parametrize("text, words", HARD_TEXTS + [("many   spaces\tand\n\nlines", None)])
def test_words_are_exact_slices_of_the_original_text(text, words):
    (record,) = explain_documents(tiny_classifier(), [text])
    assert record["words"] == [text[s:e] for s, e in record["spans"]]
    if words is not None:
        assert record["words"] == words
    # Between words there is only whitespace: no character of the text is lost.
    cursor = 0
    for start, end in record["spans"]:
        assert start >= cursor and text[cursor:start].strip() == ""
        cursor = end
    assert text[cursor:].strip() == ""


def test_contributions_plus_bias_reproduce_the_logits_for_every_class():
    records = explain_documents(tiny_classifier(), DOCUMENTS, classes="all")
    for record in records:
        for name in LABELS:
            total = sum(record["contributions"][name]) + record["contribution_bias"][name]
            assert math.isclose(total, record["logits"][name], abs_tol=1e-4)
        predicted = record["predicted"]
        assert record["scores"]["contribution"] == record["contributions"][predicted]


def test_scores_do_not_depend_on_the_other_documents_in_the_batch():
    classifier = tiny_classifier()
    alone = [explain_documents(classifier, [text])[0] for text in DOCUMENTS]
    together = explain_documents(classifier, DOCUMENTS, batch_size=4)
    for single, batched in zip(alone, together, strict=True):
        for method, values in single["scores"].items():
            assert_close(
                np.array(batched["scores"][method]), np.array(values), atol=2e-5, rtol=1e-3
            )


def _token_level_reference(classifier: TrainedClassifier, text: str) -> dict[str, np.ndarray]:
    """Each method written out from its definition for one unpadded document."""
    model = classifier.model
    encoding = encode_batch(classifier.tokenizer, [text])[0]
    ids = torch.tensor([encoding.ids])
    mask = torch.ones_like(ids, dtype=torch.bool)
    tokens = (model.embed(ids) * model.embed_scale).detach().requires_grad_(True)
    with norms_and_gates_held(model):
        out = model(ids, mask, need_layer_weights=True, token_vectors=tokens)
    predicted = out.logits.argmax().item()
    # The records explain the class's lead over its rivals (their weights held constant).
    weights = lead_weights(out.logits, torch.tensor([predicted]))
    (out.logits.double() * weights).sum().backward()
    length = ids.shape[1]
    flow = torch.eye(length)
    for weights in out.layer_weights:
        if weights.dim() == 5:  # a windowed model's banded weights, as the full matrix
            weights = banded_to_dense(weights, length)
        flow = (0.5 * weights[0].mean(0) + 0.5 * torch.eye(length)) @ flow
    rollout = out.pool_weights[0].mean(0) @ flow
    return {
        "grad_input": (tokens.grad * tokens).sum(-1)[0].detach().numpy(),
        "rollout": rollout.detach().numpy(),
        "attention": out.pool_weights[0].mean(0).detach().numpy(),
        "token_words": np.array(align_words(encoding).token_words),
    }


# A document within the word limit gets maps, so its pass keeps every head's attention; one
# beyond it gets the heads' mean: rollout must not tell the two apart.
MAPS = pytest.mark.parametrize("map_words", [LAYER_MAP_MAX_WORDS, 0], ids=["heads", "mean"])


@MAPS
@pytest.mark.parametrize("window", [0, 3])
def test_rollout_and_gradient_times_input_match_their_definitions(window, map_words):
    classifier = tiny_classifier(n_layers=2, attention_window=window)
    text = DOCUMENTS[1]
    (record,) = explain_documents(classifier, [text], layer_map_max_words=map_words)
    assert ("layer_maps" in record) == bool(map_words)
    reference = _token_level_reference(classifier, text)
    n_words = len(record["words"])
    for method in ("grad_input", "rollout", "attention"):
        per_word = np.bincount(reference["token_words"], reference[method], minlength=n_words)
        assert_close(np.array(record["scores"][method]), per_word, atol=1e-5, rtol=1e-3)


@MAPS
def test_rollout_by_depth_carries_the_pool_back_through_the_top_blocks_only(map_words):
    classifier = tiny_classifier(n_layers=3)
    text = DOCUMENTS[1]
    (record,) = explain_documents(classifier, [text], layer_map_max_words=map_words)
    model = classifier.model
    encoding = encode_batch(classifier.tokenizer, [text])[0]
    ids = torch.tensor([encoding.ids])
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids, dtype=torch.bool), need_layer_weights=True)
    length, token_words = ids.shape[1], np.array(align_words(encoding).token_words)
    flow = torch.eye(length)
    assert len(record["rollout_depths"]) == 2  # top 1 and top 2 blocks; all 3 is "rollout"
    for depth, weights in enumerate(reversed(out.layer_weights), start=1):
        flow = flow @ (0.5 * weights[0].mean(0) + 0.5 * torch.eye(length))
        expected = np.bincount(token_words, (out.pool_weights[0].mean(0) @ flow).numpy())
        shown = record["rollout_depths"][depth - 1] if depth < 3 else record["scores"]["rollout"]
        assert_close(np.array(shown), expected, atol=1e-5, rtol=1e-3)


def test_rollout_without_self_attention_blocks_is_the_pool_attention():
    (record,) = explain_documents(tiny_classifier(n_layers=0), [DOCUMENTS[0]])
    assert record["scores"]["rollout"] == record["scores"]["attention"]
    assert "layer_maps" not in record


def test_truncated_document_keeps_every_word_and_scores_only_what_was_read():
    text = " ".join(["markets rallied as the bank held rates"] * 20)
    (record,) = explain_documents(tiny_classifier(max_tokens=24), [text])
    assert record["truncated"] and record["tokens_read"] == 24 < record["n_tokens"]
    assert record["words"] == text.split()
    read = record["words_read"]
    assert 0 < read < len(record["words"])
    for method, values in record["scores"].items():
        assert all(v == 0 for v in values[read:]), method
    assert math.isclose(sum(record["scores"]["attention"][:read]), 1.0, abs_tol=1e-4)
    assert "layer_maps" not in record  # maps are for whole short documents only


@pytest.mark.parametrize("window", [0, 3])
def test_short_documents_carry_word_by_word_maps_per_block_and_head(window):
    (record,) = explain_documents(
        tiny_classifier(n_layers=2, attention_window=window), [DOCUMENTS[2]]
    )
    maps = np.array(record["layer_maps"])
    n_words = len(record["words"])
    assert maps.shape == (2, 2, n_words, n_words)
    # Each attending word's row is a distribution over the attended words.
    assert_close(maps.sum(-1), np.ones((2, 2, n_words)), atol=1e-4, rtol=0)


def test_maps_go_to_the_short_documents_of_a_batch_and_need_every_head():
    classifier = tiny_classifier(n_layers=2)
    short, long = DOCUMENTS[2], " ".join([DOCUMENTS[1]] * 3)
    short_words, long_words = (
        len(d.alignment.word_spans)
        for d in encode_documents(classifier.tokenizer, [short, long], None)
    )
    limit = short_words
    assert long_words > limit
    records = explain_documents(classifier, [long, short, long], layer_map_max_words=limit)
    assert ["layer_maps" in record for record in records] == [False, True, False]
    assert np.array(records[1]["layer_maps"]).shape[:2] == (2, 2)  # blocks, heads
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool)
    scoring = scoring_pass(classifier.model, ids, mask)
    assert scoring.layer_weights[0].shape[1] == 1  # the heads' mean
    document = encode_documents(classifier.tokenizer, [short], None)[0]
    with pytest.raises(ValueError, match="each head"):
        _layer_maps(document, scoring, 0)


def test_empty_document_gets_an_error_record_and_keeps_its_place():
    records = explain_documents(tiny_classifier(), ["Markets rallied.", "   ", "The striker."])
    assert len(records) == 3
    assert records[1]["predicted"] is None and "empty" in records[1]["error"]
    assert records[0]["predicted"] and records[2]["predicted"]


def test_the_classes_worth_contrasting():
    # The top two always; then each class at 1 % or more, at most five; the true class added.
    assert contrast_classes([0.90, 0.05, 0.03, 0.015, 0.004, 0.001], None) == [0, 1, 2, 3]
    assert contrast_classes([0.999, 0.0005, 0.0005], 2) == [0, 1, 2]
    assert contrast_classes([0.2] * 3 + [0.1] * 4, 6) == [0, 1, 2, 3, 4, 6]
    assert contrast_classes([0.98, 0.01, 0.005, 0.005], 0) == [0, 1]


def test_a_contrast_record_keeps_few_classes_and_the_mean_over_all():
    classifier = tiny_classifier(n_layers=1, labels=[f"c{i}" for i in range(12)])
    texts = DOCUMENTS[:3]
    labels = ["c11", None, "c3"]
    every = explain_documents(classifier, texts, labels=labels, classes="all")
    few = explain_documents(classifier, texts, labels=labels, classes="contrast")
    for whole, kept, label in zip(every, few, labels, strict=True):
        names = list(kept["contributions"])
        probs = [whole["probs"][f"c{i}"] for i in range(12)]
        true = int(label[1:]) if label else None
        assert names == [f"c{c}" for c in contrast_classes(probs, true)] and len(names) < 12
        assert names[0] == kept["predicted"] and (label is None or label in names)
        assert set(kept["logits"]) == set(kept["contribution_bias"]) == set(names)
        assert len(kept["probs"]) == 12 and len(whole["contributions"]) == 12
        for name in names:
            assert kept["contributions"][name] == pytest.approx(whole["contributions"][name])
        columns = zip(*whole["contributions"].values(), strict=True)
        mean = [sum(values) / 12 for values in columns]
        assert kept["contribution_mean"] == pytest.approx(mean, abs=1e-6)
        assert whole["contribution_mean"] == pytest.approx(mean, abs=1e-6)


def _relevance_per_word(classifier, text, target, rule, quantity="lead"):
    (document,) = encode_documents(classifier.tokenizer, [text], classifier.max_tokens)
    ids = torch.tensor([document.token_ids])
    mask = torch.ones_like(ids)
    target = torch.tensor([target])
    scores = word_relevance(classifier.model, ids, mask, target, rule, quantity=quantity)[0]
    n_words = len(document.alignment.word_spans)
    return np.bincount(document.token_words, scores.double().numpy(), minlength=n_words)


@pytest.mark.parametrize("window", [0, 3])
def test_a_contrast_of_two_classes_is_one_class_s_scores_minus_the_other_s(window):
    labels = ["c0", "c1", "c2", "c3"]
    classifier = tiny_classifier(n_layers=2, attention_window=window, labels=labels)
    texts = DOCUMENTS[:3]
    toward, against = ["c1", "c3", "c0"], ["c0", "c1", "c2"]
    every = explain_documents(classifier, texts, classes="all")
    by_contribution = class_contrast(classifier, texts, toward, against, "contribution")
    for record, high, low, contrast in zip(every, toward, against, by_contribution, strict=True):
        difference = np.subtract(record["contributions"][high], record["contributions"][low])
        assert_close(np.array(contrast), difference, atol=1e-5, rtol=1e-4)
    for method, rule in (
        ("conservative", RELEVANCE_METHODS["conservative"]),
        ("grad_input", "gradient"),
    ):
        contrasts = class_contrast(classifier, texts, toward, against, method, batch_size=2)
        for text, high, low, contrast in zip(texts, toward, against, contrasts, strict=True):
            expected = _relevance_per_word(
                classifier, text, labels.index(high), rule, "logit"
            ) - _relevance_per_word(classifier, text, labels.index(low), rule, "logit")
            assert np.abs(expected).max() > 1e-4  # the two classes do differ
            assert_close(np.array(contrast), expected, atol=1e-5, rtol=1e-3)
    # The rule the contrast uses is the record's own conservative propagation: the record's
    # scores are the predicted class's relevance under it (for its lead over its rivals).
    for text, record in zip(texts, every, strict=True):
        own = _relevance_per_word(
            classifier, text, labels.index(record["predicted"]), RELEVANCE_METHODS["conservative"]
        )
        assert_close(np.array(record["scores"]["conservative"]), own, atol=1e-5, rtol=1e-3)


def test_a_contrast_needs_a_class_specific_method_and_the_model_s_classes():
    classifier = tiny_classifier()
    with pytest.raises(ValueError, match="'rollout' scores words whatever the class"):
        class_contrast(classifier, DOCUMENTS[:1], ["sport"], ["tech"], "rollout")
    with pytest.raises(ValueError, match=r"\['nope'\] are not among the model's labels"):
        class_contrast(classifier, DOCUMENTS[:1], ["nope"], ["tech"], "conservative")
    assert class_contrast(classifier, [""], ["sport"], ["tech"], "conservative") == [[]]


def test_the_classes_a_record_keeps_do_not_depend_on_the_temperature():
    """Calibration changes a record's probabilities, never which contributions it keeps."""
    classifier = tiny_classifier(n_layers=1, labels=[f"c{i}" for i in range(12)])
    raw = explain_documents(classifier, DOCUMENTS[:3], classes="contrast")
    sharp = explain_documents(classifier.with_temperature(0.05), DOCUMENTS[:3], classes="contrast")
    for plain, scaled in zip(raw, sharp, strict=True):
        assert scaled["temperature"] == 0.05 and plain["temperature"] == 1.0
        assert list(scaled["contributions"]) == list(plain["contributions"])
        assert len(plain["contributions"]) > 2  # the sharpened probabilities would keep two
        assert max(scaled["probs"].values()) > max(plain["probs"].values())


def test_a_record_file_keeps_each_score_to_a_ten_thousandth_of_its_largest():
    record = {
        "id": 1, "probs": {"a": 0.123456789}, "scores": {"m": [0.5, 0.000012345, -0.25]},
        "contributions": {"a": [5.23456, 5.21111]}, "rollout_depths": [[0.5, 0.123456]],
        "words_read": 2,
    }  # fmt: skip
    kept = file_record(record)
    assert kept["probs"] == {"a": 0.1235} and kept["id"] == 1
    assert kept["scores"]["m"] == [0.5, 0.00001, -0.25]
    # An absolute step: 5.23456 − 5.21111 keeps its 0.0235 to within 1e-3, not 3 digits' 0.02.
    assert kept["contributions"]["a"] == [5.2346, 5.2111]
    assert kept["rollout_depths"] == [[0.5, 0.12346]]
    # The words' totals are summed before the rounding.
    assert kept["contribution_totals"] == {"a": pytest.approx(5.23456 + 5.21111)}


def test_a_page_rendered_again_from_the_file_flags_what_the_first_flagged():
    """The predicted class's probability is kept as computed: 0.5999996 read back as 0.6
    lost its "uncertain" flag when ``rewrite_report`` rendered the folder again."""
    from docclass.report.html import _flags

    record = {"id": 1, "predicted": "a", "label": "a", "probs": {"a": 0.5999996, "b": 0.4000004}}
    assert _flags(record) == ["uncertain"]
    kept = file_record(record)
    assert _flags(kept) == ["uncertain"] and kept["probs"]["b"] == 0.4
    # Nor does a runner-up rounded up to it or past it overtake the predicted class in the
    # file, where it comes first in label order.
    close = {"b": 0.250051, "c": 0.25005, "a": 0.250052, "d": 0.249847}
    kept = file_record({"id": 2, "predicted": "a", "label": None, "probs": close})
    assert max(kept["probs"], key=kept["probs"].get) == "a" and kept["probs"]["d"] == 0.2498
    assert kept["probs"]["b"] == 0.250051


def test_jsonl_round_trip(tmp_path):
    records = explain_documents(tiny_classifier(), DOCUMENTS + ["<script>alert(1)</script> ünï"])
    path = tmp_path / "explanations.jsonl"
    assert write_jsonl(records, path) == len(records)
    assert read_jsonl(path) == records
    assert "ünï" in path.read_text(encoding="utf-8")
    compressed = tmp_path / "explanations.jsonl.gz"
    assert write_jsonl(records, compressed) == len(records)
    assert read_jsonl(compressed) == records and compressed.read_bytes()[:2] == b"\x1f\x8b"


@pytest.mark.fault(
    "explaining a model trained with bf16-true weights",
    "word scores computed in float32: contributions add up to the float32 logits to 1e-4",
)
def test_bf16_weights_are_explained_in_float32():
    classifier = tiny_classifier(n_layers=1)
    exact = explain_documents(classifier, DOCUMENTS[:3])
    halved = TrainedClassifier(
        classifier.model.to(torch.bfloat16), classifier.tokenizer, LABELS, None
    )
    records = explain_documents(halved, DOCUMENTS[:3])
    assert next(classifier.model.parameters()).dtype == torch.bfloat16  # the caller's model
    for record, reference in zip(records, exact, strict=True):
        contribution = sum(record["scores"]["contribution"])
        bias = record["contribution_bias"][record["predicted"]]
        assert contribution + bias == pytest.approx(record["logits"][record["predicted"]], abs=1e-4)
        # The same weights rounded to bf16: close to, not equal to, the float32 model's scores.
        assert record["predicted"] == reference["predicted"]


def test_a_model_compiled_in_place_is_explained_uncompiled():
    """``compile: true`` compiles the trained model in place, and the after-fit report explains
    it. A compiled backward pass fixes the attention valve's state when it is traced, so its
    conservative propagation came out as gradient × input; explaining runs the model
    uncompiled (the same weights), and the compiled model stays compiled."""
    classifier = tiny_classifier(n_layers=2)
    eager = explain_documents(classifier, DOCUMENTS[:3])
    classifier.model.compile(backend="aot_eager")  # traces the backward like inductor, quickly
    compiled = explain_documents(classifier, DOCUMENTS[:3])
    assert classifier.model._compiled_call_impl is not None
    for record, reference in zip(compiled, eager, strict=True):
        for method in ("conservative", "grad_input"):
            assert_close(
                np.array(record["scores"][method]), np.array(reference["scores"][method]),
                atol=1e-6, rtol=1e-5,
            )  # fmt: skip
        # The two methods differ here, so one cannot pass for the other.
        difference = np.subtract(
            reference["scores"]["conservative"], reference["scores"]["grad_input"]
        )
        assert np.abs(difference).max() > 1e-3


def test_a_score_that_is_not_finite_is_written_as_json_null(tmp_path):
    record = {"id": 0, "scores": {"contribution": compact([0.5, float("nan"), float("inf")])}}
    write_jsonl([record], tmp_path / "r.jsonl")
    text = (tmp_path / "r.jsonl").read_text()
    strict = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSONL"))
    assert strict["scores"]["contribution"] == [0.5, None, None]


@pytest.mark.fault(
    "word scores asked for inside torch.inference_mode() (a caller's, or an evaluation loop's)",
    "the same records as outside it; never a RuntimeError about inference tensors",
)
def test_word_scores_inside_inference_mode_equal_those_outside_it():
    classifier = tiny_classifier()
    outside = explain_documents(classifier, DOCUMENTS, classes="contrast")
    with torch.inference_mode():
        inside = explain_documents(classifier, DOCUMENTS, classes="contrast")
    assert inside == outside
    assert {"conservative", "grad_input", "rollout"} <= set(inside[0]["scores"])
