"""Propagation rules (docclass/nn/relevance.py): the same forward values, relevance that adds up
to the logit, gradient × input measured where a word enters the first block, and the rules
checked against their reference library, lxt, on the real MiniLM weights."""

import copy
import functools
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import (
    embedding_offset,
    first_block_inputs,
    lead_weights,
    norms_and_gates_held,
    padded_batch,
)
from torch import nn
from torch.testing import assert_close

from docclass.interpret.methods import RELEVANCE_METHODS, scoring_pass, word_relevance
from docclass.nn import relevance
from docclass.nn.model import DocumentClassifier, ModelConfig, length_groups
from docclass.nn.relevance import CONSERVATIVE, PROPAGATIONS

LAYOUTS = {
    "pre-LN": dict(positions="learned", max_positions=64),
    "post-LN": dict(
        norm="post", embedding_norm=True, scale_embeddings=False, positions="learned",
        max_positions=64,
    ),
    "post-LN, windows": dict(
        norm="post", embedding_norm=True, scale_embeddings=False, positions="learned",
        max_positions=8, window_tokens=8, window_overlap=2,
    ),
}  # fmt: skip


def model_of(layout: str, **overrides) -> DocumentClassifier:
    settings = dict(
        vocab_size=60, num_classes=3, d_model=16, n_heads=2, n_layers=2, pool_heads=2,
        dropout=0.0, embed_dropout=0.0, **LAYOUTS[layout],
    )  # fmt: skip
    torch.manual_seed(3)
    model = DocumentClassifier(ModelConfig(**{**settings, **overrides})).eval()
    with torch.no_grad():  # non-zero biases and LayerNorm offsets, as after training
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.2)
            elif "norm" in name and name.endswith("weight"):
                parameter.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("propagation", PROPAGATIONS)
def test_a_rule_changes_gradients_never_values(layout, propagation):
    model = model_of(layout)
    ids, mask = padded_batch([19, 6], vocab=60)
    plain = model(ids, mask, need_layer_weights=True)
    ruled = model(ids, mask, propagation=propagation)
    assert_close(ruled.logits, plain.logits, atol=1e-5, rtol=1e-5)
    assert_close(ruled.token_states, plain.token_states, atol=1e-5, rtol=1e-5)
    # Nor do the ones where the scores are read (padded window slots included).
    read = model(ids, mask, need_layer_weights=True, propagation=propagation,
                 entry_scale=torch.ones(mask.shape, requires_grad=True))  # fmt: skip
    assert_close(read.logits, plain.logits, atol=1e-5, rtol=1e-5)
    assert_close(read.token_states, plain.token_states, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(read.layer_weights, plain.layer_weights, strict=True):
        assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rule", CONSERVATIVE)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_conservative_relevance_and_what_no_word_causes_add_up_to_the_logit(layout, rule):
    """With attention probabilities, LayerNorm scales and GELU gates held constant the network
    is affine in its sources: the word vectors, the position vectors and every additive bias.
    Gradient × source then splits the logit exactly among them (under LRP-γ a bias's gradient
    is its share of its layer's relevance). A token's score is what it brings to the first
    block: its word vector's and its position vector's shares; what no word causes is every
    bias's, the embedding norm's offset included."""
    model = model_of(layout)
    ids, mask = padded_batch([19, 6], vocab=60)
    target = torch.tensor([2, 0])
    words = word_relevance(model, ids, mask, target, rule, quantity="logit")
    assert torch.all(words[~mask] == 0)
    for row in range(2):
        model.zero_grad()
        vectors = model.token_vectors(ids[row : row + 1]).detach().requires_grad_(True)
        out = model(ids[row : row + 1], mask[row : row + 1], token_vectors=vectors,
                    propagation=rule)  # fmt: skip
        logit = out.logits[0, target[row]]
        logit.backward()

        def share(names) -> float:
            parameters = dict(model.named_parameters())
            return sum(
                float((parameters[n].grad * parameters[n]).sum().detach())
                for n in names
                if n in parameters and parameters[n].grad is not None
            )

        # What no word causes: every bias (the embedding norm's offset included); each token's
        # word and position vectors are its own.
        no_word = share([n for n, _ in model.named_parameters() if n.endswith("bias")])
        by_hand = float((vectors.grad * vectors).sum().detach()) + share(["position_table.weight"])
        assert by_hand == pytest.approx(float(words[row].sum()), abs=1e-5, rel=1e-4)
        assert float(words[row].sum()) + no_word == pytest.approx(logit.item(), abs=1e-4)
        assert abs(no_word) > 0.05  # the biases do cause part of it: the check is not vacuous


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_records_explain_the_class_s_lead_over_its_rivals_and_it_adds_up(layout):
    """The records' gradient methods explain the predicted class's lead over its rivals: its
    relevance is each class logit's relevance weighted by 1 for the class and minus the
    rivals' renormalised probabilities; it is the log-probability's relevance divided by
    ``1 - p`` (the same ranking of words); and under conservative propagation the words'
    shares plus what no word causes add up to the lead exactly."""
    model = model_of(layout)
    ids, mask = padded_batch([19, 6], vocab=60)
    scored = scoring_pass(model, ids, mask)
    weights = lead_weights(scored.logits, scored.predicted)
    classes = weights.shape[1]
    rule = RELEVANCE_METHODS["conservative"]
    for method, propagation in (("conservative", rule), ("grad_input", "gradient")):
        per_class = torch.stack(
            [
                word_relevance(model, ids, mask, torch.full((2,), k), propagation, quantity="logit")
                for k in range(classes)
            ],
            dim=-1,
        ).double()  # [B,T,C]
        got = scored.relevance["conservative"] if method == "conservative" else scored.grad_input
        assert_close(got.double(), (per_class * weights[:, None, :]).sum(-1), atol=1e-6, rtol=1e-4)
        # Not the logit's relevance: the rivals' part is there.
        own = per_class.gather(2, scored.predicted[:, None, None].expand(-1, 19, 1))[..., 0]
        assert (got - own).abs().max() > 1e-3
        vectors = model.token_vectors(ids).detach().requires_grad_(True)
        entry = torch.ones(mask.shape, requires_grad=True)
        logits = model(
            ids, mask, token_vectors=vectors, propagation=propagation, entry_scale=entry
        ).logits
        logits.log_softmax(-1).gather(1, scored.predicted[:, None]).sum().backward()
        # Where each method is read: gradient × input at the word vector, conservative
        # propagation at what the token brings to the first block (through the model's own
        # entry_scale here: the read point itself is checked against a hook below).
        read = (vectors.grad * vectors).sum(-1) if method == "grad_input" else entry.grad
        by_log_probability = (read * mask).detach().double()
        rivals_total = 1 - scored.logits.double().softmax(-1).gather(1, scored.predicted[:, None])
        assert_close(got.double() * rivals_total, by_log_probability, atol=1e-7, rtol=1e-4)
    for row in range(2):
        vectors = model.token_vectors(ids[row : row + 1]).detach().requires_grad_(True)
        model.zero_grad()
        logits = model(ids[row : row + 1], mask[row : row + 1], token_vectors=vectors,
                       propagation=rule).logits  # fmt: skip
        lead = (logits[0].double() * weights[row]).sum()
        lead.backward()
        # What no word causes: every bias, the embedding norm's offset included.
        sources = [p for n, p in model.named_parameters() if n.endswith("bias")]
        no_word = sum(float((p.grad * p).sum().detach()) for p in sources if p.grad is not None)
        words = float(scored.relevance["conservative"][row].sum())
        assert words + no_word == pytest.approx(float(lead.detach()), abs=1e-4)
        # Neither part is negligible, and the lead is not the logit.
        assert abs(words) > 1e-3 and abs(no_word) > 1e-3
        logit = float(logits[0, scored.predicted[row]].detach())
        assert abs(float(lead.detach()) - logit) > 1e-2


def test_a_sure_prediction_keeps_its_scores_in_float32():
    """A class far ahead of its rivals (float32 rounds its probability to 1) still gets the
    scores float64 gives it: the log-probability's gradient would vanish there."""
    model = model_of("post-LN")
    with torch.no_grad():
        model.head.weight.mul_(400.0)
    ids, mask = padded_batch([19, 6], vocab=60)
    scored = scoring_pass(model, ids, mask)
    top2 = scored.logits.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 20  # p rounds to 1 in float32
    reference = scoring_pass(copy.deepcopy(model).double(), ids, mask)
    for got, expected in (
        (scored.relevance["conservative"], reference.relevance["conservative"]),
        (scored.grad_input, reference.grad_input),
    ):
        scale = float(expected.abs().max())
        assert scale > 1e-2
        assert_close(got.double(), expected, atol=1e-4 * scale, rtol=1e-3)


@pytest.mark.parametrize(
    "layout, overrides", [*((name, {}) for name in LAYOUTS), ("pre-LN", {"attention_window": 4})]
)
def test_one_forward_pass_gives_each_rule_what_a_pass_of_its_own_gives(layout, overrides):
    """scoring_pass runs conservative propagation and gradient × input through one forward
    graph, the attention valve closed for the first backward pass and open for the second
    (also through banded local attention)."""
    model = model_of(layout, **overrides)
    ids, mask = padded_batch([19, 6, 11], vocab=60)
    scored = scoring_pass(model, ids, mask)
    predicted = scored.predicted
    conservative = word_relevance(model, ids, mask, predicted, RELEVANCE_METHODS["conservative"])
    gradient = word_relevance(model, ids, mask, predicted, "gradient")
    assert_close(scored.relevance["conservative"], conservative, atol=1e-6, rtol=1e-5)
    assert_close(scored.grad_input, gradient, atol=1e-6, rtol=1e-5)
    # The rules differ here, so the two backward passes cannot both be right by accident.
    assert (conservative - gradient).abs().max() > 1e-3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_times_input_is_autograd_with_every_norm_and_gate_held(layout):
    """The rule against plain autograd through forward hooks written from its definition, on
    every layout (encoder windows included)."""
    model = model_of(layout)
    ids, mask = padded_batch([19, 6], vocab=60)
    target = torch.tensor([1, 2])
    vectors = model.token_vectors(ids).detach().requires_grad_(True)
    with norms_and_gates_held(model):
        logits = model(ids, mask, token_vectors=vectors).logits
    logits.gather(1, target[:, None]).sum().backward()
    expected = (vectors.grad * vectors).sum(-1) * mask
    scored = word_relevance(model, ids, mask, target, "gradient", quantity="logit")
    assert_close(scored, expected.detach(), atol=1e-5, rtol=1e-4)
    plain = model.token_vectors(ids).detach().requires_grad_(True)
    model(ids, mask, token_vectors=plain).logits.gather(1, target[:, None]).sum().backward()
    assert ((plain.grad * plain).sum(-1) - scored).abs().max() > 1e-3  # the hooks matter here


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conservative_relevance_is_read_at_what_each_token_brings_to_the_first_block(layout):
    """Conservative propagation is read at the first block's input less the embedding norm's
    offset: each token's word and position together, which masking it removes (a token in two
    overlapping windows gets the sum over both copies). The reference reads it with a hook
    there, one document at a time; the batch is scored at once (with windows its rows run in
    two length groups)."""
    # Windows of 16 (group widths round up to 8): rows of 16, 16, 12 and 3 tokens make two groups.
    windows = {"max_positions": 16, "window_tokens": 16} if "windows" in layout else {}
    model = model_of(layout, **windows)
    ids, mask = padded_batch([40, 3], vocab=60)
    target = torch.tensor([1, 2])
    rule = RELEVANCE_METHODS["conservative"]
    scored = word_relevance(model, ids, mask, target, rule, quantity="logit")
    for row in range(2):
        length = int(mask[row].sum())
        with first_block_inputs(model) as entering:
            out = model(ids[row : row + 1, :length], mask[row : row + 1, :length], propagation=rule)
        out.logits[0, target[row]].backward()
        (entered,) = entering  # one pass of the first block (one document's rows, one group)
        by_hand = (entered.grad * (entered - embedding_offset(model))).sum(-1)
        if out.windows is not None:
            by_hand = out.windows.to_tokens(by_hand, 1, length, owners_only=False)
        assert_close(scored[row, :length], by_hand[0].detach(), atol=1e-5, rtol=1e-4)
        assert torch.all(scored[row, length:] == 0)
        # Not the word vector's share alone (the read point matters).
        words = model.token_vectors(ids[row : row + 1, :length]).detach().requires_grad_(True)
        plain = model(ids[row : row + 1, :length], mask[row : row + 1, :length],
                      token_vectors=words, propagation=rule)  # fmt: skip
        plain.logits[0, target[row]].backward()
        assert ((words.grad * words).sum(-1)[0] - scored[row, :length]).abs().max() > 1e-3
    if windows:
        rows = model(ids, mask).windows.row_mask
        assert len(length_groups(rows.sum(dim=1), rows.shape[1])) == 2


def test_without_blocks_conservative_relevance_is_the_exact_class_contribution():
    model = model_of("pre-LN", n_layers=0, positions="none")
    ids, mask = padded_batch([9, 4], vocab=60)
    out = model(ids, mask)
    target = out.logits.argmax(-1)
    contributions = model.token_contributions(out.token_states, out.pool_weights)
    expected = contributions.gather(2, target[:, None, None].expand(-1, 9, 1))[..., 0]
    relevance = word_relevance(model, ids, mask, target, "cp", quantity="logit")
    assert_close(relevance, expected, atol=1e-5, rtol=1e-4)


def gamma_rule_written_out(x, layer, y, gradient, gamma):
    """LRP-γ's input relevance and bias gradient at one linear layer, from its definition with
    every ``z_ij = x_i·w_ij`` spelt out, in float64: output j's relevance ``g_j·y_j`` goes to
    input i in proportion to ``z_ij + γ·z_ij⁺`` (``z_ij⁻`` for an output below zero), the bias
    keeping ``b_j``'s part. Also ``s_j = g_j·y_j / ẑ_j``, the bias's gradient before summing."""
    x, y, gradient = x.detach().double(), y.detach().double(), gradient.double()
    z = x[..., None, :] * layer.weight.detach().double()  # (..., out, in)
    rising = (y >= 0)[..., None]
    favoured = torch.where(rising, z.clamp(min=0), z.clamp(max=0))
    denominator = (z + gamma * favoured).sum(-1)
    if layer.bias is not None:
        denominator = denominator + layer.bias.detach().double()
    denominator = denominator + relevance.STABILISER * torch.where(denominator >= 0, 1.0, -1.0)
    output_relevance = gradient * y
    ratio = output_relevance / denominator
    return ((z + gamma * favoured) * ratio[..., None]).sum(-2), ratio


@pytest.mark.parametrize("gamma", [0.01, 0.5])
def test_lrp_gamma_at_a_linear_layer_equals_the_rule_written_out(monkeypatch, gamma):
    """One linear layer under ``cp-gamma``, against LRP-γ written from its definition
    (:func:`gamma_rule_written_out`). Inputs and outputs of both signs; the open valve gives
    the plain gradient."""
    monkeypatch.setattr(relevance, "GAMMA", gamma)
    torch.manual_seed(0)
    layer = torch.nn.Linear(6, 5)
    x = torch.randn(2, 3, 6, requires_grad=True)
    gradient = torch.randn(2, 3, 5)
    y = relevance.linear(x, layer, "cp-gamma")
    ours, bias_gradient = torch.autograd.grad(y, (x, layer.bias), gradient)

    expected, ratio = gamma_rule_written_out(x, layer, y, gradient, gamma)
    rising = y.detach() >= 0
    assert rising.any() and not rising.all() and (x > 0).any() and (x < 0).any()  # every case
    assert_close(ours.double() * x.detach().double(), expected, atol=1e-5, rtol=1e-4)
    assert_close(bias_gradient.double(), ratio.flatten(0, -2).sum(0), atol=1e-5, rtol=1e-4)
    bias_share = (bias_gradient * layer.bias.detach()).sum()
    assert float((ours * x.detach()).sum() + bias_share) == pytest.approx(
        float((gradient * y.detach()).sum()), abs=1e-4
    )
    plain = gradient @ layer.weight.detach()
    assert (ours - plain).abs().max() > 1e-3 * gamma  # the rule is not the plain gradient
    valve = relevance.AttentionValve()
    (opened,) = torch.autograd.grad(relevance.linear(x, layer, valve), x, gradient)
    assert_close(opened, plain, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_lrp_gamma_at_inputs_of_zero_without_a_bias_and_from_a_sum(monkeypatch, bias):
    """The rule written out holds where the backward pass's sign tricks could slip: inputs of
    exactly 0 and -0.0 (no γ share), a token at zero (its output 0 without a bias), three
    leading dimensions and the expanded gradient ``.sum()`` hands back; the backward pass
    works in place, so it refuses to be differentiated again."""
    monkeypatch.setattr(relevance, "GAMMA", 0.5)
    torch.manual_seed(1)
    layer = torch.nn.Linear(6, 5, bias=bias)
    x = torch.randn(2, 2, 3, 6)
    x[..., 0], x[..., 1], x[0, 0, 0] = 0.0, -0.0, 0.0
    x.requires_grad_(True)
    y = relevance.linear(x, layer, "cp-gamma")
    (ours,) = torch.autograd.grad(y.sum(), x)
    expected, ratio = gamma_rule_written_out(x, layer, y, torch.ones_like(y), 0.5)
    assert_close(ours.double() * x.detach().double(), expected, atol=1e-5, rtol=1e-4)
    # Relevance is 0 at an input of 0 whatever its gradient: the gradient there is s·W.
    plain = ratio @ layer.weight.detach().double()
    assert_close(ours[..., :2].double(), plain[..., :2], atol=1e-5, rtol=1e-4)
    (twice,) = torch.autograd.grad(
        relevance.linear(x, layer, "cp-gamma").sum(), x, create_graph=True
    )
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(twice.sum(), x)


def test_the_gamma_rule_runs_in_the_layer_s_own_dtype(monkeypatch):
    """A bf16 layer's rule stays in bf16 (a float32 stabiliser made the product fail), with
    rounding errors but no bias: ``1 + γ/2`` formed in bf16 is 1.0078, which scaled every
    gradient. A float16 layer stays finite at a token of zero, where ``g/ẑ`` overflowed."""
    monkeypatch.setattr(relevance, "GAMMA", 0.01)
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).to(torch.bfloat16)
    x = torch.randn(8, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    gradient = torch.randn(8, 32, 64, dtype=torch.bfloat16)
    y = relevance.linear(x, layer, "cp-gamma")
    (ours,) = torch.autograd.grad(y, x, gradient)
    assert ours.dtype == torch.bfloat16 and torch.isfinite(ours).all()
    expected, _ = gamma_rule_written_out(x, layer, y, gradient, 0.01)
    error = ours.double() * x.detach().double() - expected
    # The error's component along the reference: about 2.4e-3 with 1 + γ/2 formed in bf16.
    assert abs(float((error * expected).sum() / (expected * expected).sum())) < 1e-3

    half = torch.nn.Linear(4, 4, bias=False).to(torch.float16)
    x = torch.zeros(2, 4, dtype=torch.float16, requires_grad=True)
    (gradient,) = torch.autograd.grad(relevance.linear(x, half, "cp-gamma").sum() * 10, x)
    assert (gradient == 0).all()  # y = 0 everywhere: no relevance to hand on


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_linear_layer_of_the_blocks_takes_the_gamma_rule(monkeypatch, layout):
    """Through the model, ``cp-gamma`` is ``cp`` with every block's linear layers (queries,
    keys and values, the attention's output, both feed-forward layers) under LRP-γ: the scores
    ``cp`` gives with each of those layers replaced by the rule's own function, other than
    ``cp``'s, and ``cp``'s at γ = 0 (a large γ here, so that the rule's part stands out)."""
    model = model_of(layout)
    ids, mask = padded_batch([19, 6], vocab=60)
    target = torch.tensor([2, 0])
    plain = word_relevance(model, ids, mask, target, "cp")
    scale = plain.abs().max().item()
    monkeypatch.setattr(relevance, "GAMMA", 0.5)
    ruled = word_relevance(model, ids, mask, target, "cp-gamma")
    assert (ruled - plain).abs().max() > 0.05 * scale
    layers = [m for block in model.blocks for m in block.modules() if isinstance(m, nn.Linear)]
    assert len(layers) == 4 * len(model.blocks)
    with monkeypatch.context() as patch:
        for layer in layers:  # cp, each linear layer's own forward replaced by the rule
            rule = functools.partial(relevance.linear, layer=layer, propagation="cp-gamma")
            patch.setattr(layer, "forward", rule)
        patched = word_relevance(model, ids, mask, target, "cp")
    assert_close(patched, ruled, atol=1e-6 * scale, rtol=1e-5)
    monkeypatch.setattr(relevance, "GAMMA", 0.0)
    # Equal but for the stabiliser, which moves a near-zero denominator by 1e-6.
    unruled = word_relevance(model, ids, mask, target, "cp-gamma")
    assert_close(unruled, plain, atol=5e-3 * scale, rtol=1e-3)


def test_gradient_times_input_measures_a_word_where_it_enters_the_first_block():
    """Through an embedding LayerNorm the plain gradient is orthogonal to the centred input,
    so gradient · input there is ~0 whatever the word did. The word's part of the first
    block's input is ``γ ⊙ (e - mean(e)) / σ`` (σ of word + position): the gradient there
    (through the blocks with every LayerNorm's scale and GELU gate held), dotted with it, is
    the score."""
    model = model_of("post-LN")
    ids, mask = padded_batch([11], vocab=60)
    words = model.token_vectors(ids)
    summed = words + model.position_vectors(11, ids.device)
    first_input = model.embedding_norm(summed).detach().requires_grad_(True)
    captured = {}

    def replace_input(module, args):
        captured["x"] = args[0]
        return (first_input, *args[1:])

    handle = model.blocks[0].register_forward_pre_hook(replace_input)
    with norms_and_gates_held(model):
        logits = model(ids, mask).logits
    handle.remove()
    predicted = int(logits.argmax())
    # The records explain the class's lead over its rivals.
    (
        logits[0].double() * lead_weights(logits.detach(), torch.tensor([predicted]))[0]
    ).sum().backward()
    norm = model.embedding_norm
    sigma = (summed.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    word_part = norm.weight * (words - words.mean(-1, keepdim=True)) / sigma
    expected = (first_input.grad * word_part).sum(-1)[0]
    scored = scoring_pass(model, ids, mask, relevance_methods=()).grad_input[0]
    assert_close(scored, expected.detach(), atol=1e-5, rtol=1e-4)


# --- against the reference library on the real MiniLM weights -------------------------------


@pytest.fixture()
def lxt_rules(monkeypatch):
    """lxt's own rule functions (``lxt.efficient.rules`` and ``.patches``). ``import
    lxt.efficient`` runs its package ``__init__``, which imports lxt's copy of an older
    ``transformers`` BERT that no longer imports on transformers 5; the rule modules need torch
    alone, so they are loaded without that ``__init__``."""
    root = Path(importlib.util.find_spec("lxt").origin).parent / "efficient"
    package = types.ModuleType("lxt.efficient")
    package.__path__ = [str(root)]
    monkeypatch.setitem(sys.modules, "lxt.efficient", package)
    for name in ("rules", "patches"):
        monkeypatch.delitem(sys.modules, f"lxt.efficient.{name}", raising=False)
    import lxt.efficient.patches as patches
    import lxt.efficient.rules as rules

    return rules, patches


@pytest.fixture(scope="module")
def minilm():
    from docclass.artifacts.encoders import (
        encoder_model_settings,
        encoder_state_dict,
        encoder_tokenizer,
        locate_encoder,
    )

    folder = locate_encoder("minilm")
    settings = encoder_model_settings(folder)
    model = DocumentClassifier(ModelConfig(num_classes=2, **settings))
    model.load_state_dict(encoder_state_dict(folder, settings["n_layers"]), strict=False)
    return folder, model.eval(), encoder_tokenizer(folder)


@pytest.mark.parametrize(
    ("propagation", "wrapper"),
    [("attnlrp", "wrap_attention_forward"), ("cp", "cp_wrap_attention_forward")],
)
def test_relevance_through_minilm_equals_lxts_on_transformers_bert(
    minilm, lxt_rules, monkeypatch, propagation, wrapper
):
    """lxt's rules patched into ``transformers``' BertModel as lxt patches BERT (its LayerNorm
    forward, the identity rule at GELU, its attention wrapper), on the same weights and ids:
    the relevance of each token for a fixed read-out of the final states must be docclass's."""
    import transformers.models.bert.modeling_bert as modeling_bert
    from transformers import BertModel

    rules, patches = lxt_rules
    folder, model, tokenizer = minilm
    reference = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    for module in reference.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.forward = types.MethodType(patches.layer_norm_forward, module)
    for activation in {
        id(m): m for m in reference.modules() if "Activation" in type(m).__name__
    }.values():
        activation.forward = functools.partial(rules.identity_rule_implicit, activation.forward)
    monkeypatch.setattr(
        modeling_bert,
        "eager_attention_forward",
        getattr(patches, wrapper)(modeling_bert.eager_attention_forward),
    )
    text = "The striker scored twice as the central bank held rates, and shares fell sharply."
    ids = torch.tensor([tokenizer.encode(text).ids])
    readout = torch.randn(ids.shape[1], 384, generator=torch.Generator().manual_seed(0))

    embeds = reference.embeddings.word_embeddings(ids).detach().requires_grad_(True)
    states = reference(inputs_embeds=embeds).last_hidden_state
    (states[0] * readout).sum().backward()
    expected = (embeds.grad * embeds).sum(-1)[0]

    vectors = model.token_vectors(ids).detach().requires_grad_(True)
    mask = torch.ones_like(ids, dtype=torch.bool)
    ours = model(ids, mask, token_vectors=vectors, propagation=propagation).token_states
    (ours[0] * readout).sum().backward()
    relevance = (vectors.grad * vectors).sum(-1)[0]

    assert_close(ours[0], states[0].detach(), atol=1e-4, rtol=1e-4)  # the same network
    assert_close(relevance, expected.detach(), atol=2e-4 * expected.abs().max().item(), rtol=1e-3)
    # The rules matter: plain gradient × input on the same network is something else.
    vectors.grad = None
    plain = model(ids, mask, token_vectors=vectors).token_states
    (plain[0] * readout).sum().backward()
    assert not torch.allclose((vectors.grad * vectors).sum(-1)[0], expected, atol=1e-2)


@pytest.mark.parametrize("propagation", ["cp", "attnlrp"])
def test_the_pools_rule_equals_its_closed_form(propagation):
    """The pool under each rule, against the rule written out by hand (no autograd): the
    values take relevance through the fixed probabilities (all of it under ``cp``; half under
    ``attnlrp``'s uniform rule for probabilities · values), and under ``attnlrp`` the other half
    reaches the scores, passes the softmax by its gradient × input rule (in the gradient form
    the rules take, the softmax's own Jacobian) and the keys whole (the query is a weight: the
    score is linear in the keys)."""
    from docclass.nn.attention import AttentionPool

    torch.manual_seed(0)
    heads, width, tokens = 2, 8, 5
    pool = AttentionPool(width, heads)
    with torch.no_grad():
        for parameter in pool.parameters():
            parameter.normal_(0, 0.5)
    x = torch.randn(1, tokens + 2, width, requires_grad=True)
    mask = torch.tensor([[True] * tokens + [False, False]])
    readout = torch.randn(width)
    pooled, _ = pool(x, mask, propagation=propagation)
    (pooled[0] @ readout).backward()
    ours = (x.grad * x).sum(-1)[0]

    head_dim = width // heads
    with torch.no_grad():
        states = x[0, :tokens]
        keys = pool.key_proj(states).view(tokens, heads, head_dim)
        values = pool.value_proj(states).view(tokens, heads, head_dim)
        queries = pool.queries.view(heads, head_dim)
        scores = torch.einsum("thd,hd->ht", keys, queries) / head_dim**0.5
        weights = scores.softmax(-1)  # (H, T)
        # The gradient of the logit at each head's output.
        at_output = (pool.out_proj.weight.T @ readout).view(heads, head_dim)
        value_share = 1.0 if propagation == "cp" else 0.5
        at_values = value_share * weights[..., None] * at_output[:, None, :]  # (H, T, Dh)
        gradient = torch.einsum(
            "hte,hed->td", at_values, pool.value_proj.weight.view(heads, head_dim, width)
        )
        if propagation == "attnlrp":
            at_weights = 0.5 * torch.einsum("hd,thd->ht", at_output, values)
            at_scores = weights * (at_weights - (weights * at_weights).sum(-1, keepdim=True))
            key_direction = (
                torch.einsum(
                    "hd,hde->he", queries, pool.key_proj.weight.view(heads, head_dim, width)
                )
                / head_dim**0.5
            )
            gradient = gradient + torch.einsum("ht,he->te", at_scores, key_direction)
        expected = (gradient * states).sum(-1)
    assert_close(ours[:tokens], expected, atol=1e-5, rtol=1e-4)
    assert torch.all(ours[tokens:] == 0)
