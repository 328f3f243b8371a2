import pytest
import torch
import torch.nn.functional as F
from helpers import padded_batch
from torch.testing import assert_close

from docclass.errors import ConfigError
from docclass.nn.model import DocumentClassifier, ModelConfig, drop_words


def tiny_config(**overrides) -> ModelConfig:
    settings = dict(
        vocab_size=50,
        num_classes=3,
        d_model=16,
        n_heads=2,
        n_layers=2,
        pool_heads=2,
        dropout=0.0,
        embed_dropout=0.0,
    )
    return ModelConfig(**{**settings, **overrides})


# The BERT layout that pre-trained encoders are loaded into.
POST_LN = dict(
    norm="post", embedding_norm=True, scale_embeddings=False, positions="learned", max_positions=64
)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "none"])
def test_output_shapes(positions):
    model = DocumentClassifier(tiny_config(positions=positions)).eval()
    ids, mask = padded_batch([5, 9, 2])
    out = model(ids, mask, need_layer_weights=True)
    assert out.logits.shape == (3, 3)
    assert out.pool_weights.shape == (3, 2, 9)
    assert len(out.layer_weights) == 2 and out.layer_weights[0].shape == (3, 2, 9, 9)
    assert model(ids, mask).layer_weights is None


@pytest.mark.parametrize("layout", [{}, POST_LN], ids=["pre-LN", "post-LN"])
def test_pool_weights_are_zero_on_padding_and_sum_to_one(layout):
    model = DocumentClassifier(tiny_config(**layout)).eval()
    ids, mask = padded_batch([4, 11, 7])
    weights = model(ids, mask).pool_weights
    assert torch.all(weights.masked_select(~mask[:, None, :].expand_as(weights)) == 0)
    assert_close(weights.sum(-1), torch.ones(3, 2))


@pytest.mark.parametrize(
    ("positions", "window", "layout"),
    [("sinusoidal", 0, {}), ("learned", 0, {}), ("sinusoidal", 2, {}), ("learned", 0, POST_LN)],
)
def test_extra_padding_does_not_change_logits(positions, window, layout):
    settings = {"positions": positions, "attention_window": window, **layout}
    model = DocumentClassifier(tiny_config(**settings)).eval()
    torch.manual_seed(1)
    ids, mask = padded_batch([6, 3])
    torch.manual_seed(1)
    padded_ids, padded_mask = padded_batch([6, 3], extra_padding=10)
    assert_close(
        model(padded_ids, padded_mask).logits, model(ids, mask).logits, atol=1e-5, rtol=1e-5
    )


def test_banded_attention_with_and_without_weights_agree():
    # Banded attention only: with full attention both calls take their output from the same
    # fused kernel (the weights are computed beside it), which the comparison cannot test;
    # test_attention checks those weights rebuild the output.
    model = DocumentClassifier(tiny_config(attention_window=3)).eval()
    ids, mask = padded_batch([8, 5, 1])
    assert_close(
        model(ids, mask, need_layer_weights=True).logits,
        model(ids, mask).logits,
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("layout", [{}, POST_LN], ids=["pre-LN", "post-LN"])
def test_logits_are_exact_sums_of_token_contributions(layout):
    """The read-out is linear: logit_c = Σ_h Σ_t α_ht · w_cᵀ W_o[:, h] u_ht + bias_c, where u is
    what each token brings to its value and bias_c holds every constant no token causes."""
    model = DocumentClassifier(tiny_config(**layout)).eval()
    ids, mask = padded_batch([7, 4])
    out = model(ids, mask)
    pool, norm = model.pool, model.final_norm
    # Written out independently of token_contributions, from the parameters: the value of a
    # token is W_v (γ ⊙ x̂_t) + (W_v β + b_v), and Σ_t α_ht = 1 turns the second term into a
    # constant of the document, not of any token.
    brought = (out.token_states - norm.bias) @ pool.value_proj.weight.T
    values = brought.view(2, ids.shape[1], 2, 8)  # (B, T, H, Dh)
    projection = model.head.weight @ pool.out_proj.weight  # (C, D)
    per_head_projection = projection.view(3, 2, 8)  # (C, H, Dh)
    expected = torch.einsum("bht,bthd,chd->btc", out.pool_weights, values, per_head_projection)
    contributions = model.token_contributions(out.token_states, out.pool_weights)
    assert_close(contributions, expected)
    shared_value = pool.value_proj.weight @ norm.bias + pool.value_proj.bias
    bias = model.contribution_bias()
    assert_close(
        bias, projection @ shared_value + model.head.weight @ pool.out_proj.bias + model.head.bias
    )
    assert_close(contributions.sum(1) + bias, out.logits, atol=1e-5, rtol=1e-5)
    assert torch.all(contributions[~mask] == 0)


def test_constants_no_token_causes_stay_out_of_every_token_contribution():
    """Shifting the pool's value bias or the final LayerNorm's β changes the logits by a
    constant; no word may gain or lose credit for it."""
    model = DocumentClassifier(tiny_config()).eval()
    ids, mask = padded_batch([7, 4])
    out = model(ids, mask)
    before = model.token_contributions(out.token_states, out.pool_weights)
    with torch.no_grad():
        model.pool.value_proj.bias.add_(torch.randn(16))
        model.final_norm.bias.add_(torch.randn(16))
    shifted = model(ids, mask)
    assert not torch.allclose(shifted.logits, out.logits)  # the shift does reach the logits
    after = model.token_contributions(shifted.token_states, shifted.pool_weights)
    assert_close(after, before, atol=1e-5, rtol=1e-5)
    assert_close(after.sum(1) + model.contribution_bias(), shifted.logits, atol=1e-5, rtol=1e-5)


def test_post_ln_block_is_the_bert_layout():
    """Written out from the parameters: h = LN1(x + W_o·attn(x)), out = LN2(h + FFN(h)), with
    the attention from PyTorch's SDPA; the last block leaves LN2 to the model's final_norm."""
    model = DocumentClassifier(tiny_config(**POST_LN)).eval()
    ids, mask = padded_batch([6, 3])
    x = model.embedding_norm(model.token_vectors(ids) + model.position_vectors(6, ids.device))
    for index, block in enumerate(model.blocks):
        q, k, v = (
            part.view(2, -1, 2, 8).transpose(1, 2) for part in block.attn.qkv(x).chunk(3, -1)
        )
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        attended = block.attn.out_proj(attended.transpose(1, 2).reshape(2, -1, 16))
        h = F.layer_norm(x + attended, (16,), block.attn_norm.weight, block.attn_norm.bias, 1e-5)
        last_norm = model.final_norm if index == len(model.blocks) - 1 else block.ffn_norm
        x = F.layer_norm(h + block.ffn(h), (16,), last_norm.weight, last_norm.bias, 1e-5)
    out = model(ids, mask)
    assert_close(out.token_states[mask], x[mask], atol=1e-5, rtol=1e-5)
    assert isinstance(model.blocks[-1].ffn_norm, torch.nn.Identity)  # no second final norm


def test_overfits_a_small_batch():
    torch.manual_seed(0)
    model = DocumentClassifier(tiny_config(n_layers=1))
    ids, mask = padded_batch([12, 7, 9, 15, 4, 10, 8, 6])
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        optimiser.zero_grad()
        loss = F.cross_entropy(model(ids, mask).logits, labels)
        loss.backward()
        optimiser.step()
    model.eval()
    assert (model(ids, mask).logits.argmax(-1) == labels).all()
    assert loss.item() < 0.05


def test_word_dropout_hides_tokens_but_never_a_whole_document():
    mask = torch.ones(200, 30, dtype=torch.bool)
    mask[:, 25:] = False
    mask[0, 1:] = False  # a one-token document
    dropped = drop_words(mask, 0.3)
    assert not (dropped & ~mask).any()
    assert dropped.any(-1).all()
    assert 0.25 < 1 - dropped[1:].sum() / mask[1:].sum() < 0.35


def test_word_dropout_only_in_training():
    model = DocumentClassifier(tiny_config(word_dropout=0.5)).eval()
    ids, mask = padded_batch([10, 10])
    assert torch.equal(model(ids, mask).logits, model(ids, mask).logits)


def test_gradients_reach_the_token_vectors():
    model = DocumentClassifier(tiny_config()).eval()
    ids, mask = padded_batch([5, 3])
    vectors = model.token_vectors(ids).detach().requires_grad_()
    model(ids, mask, token_vectors=vectors).logits.sum().backward()
    assert vectors.grad is not None and torch.isfinite(vectors.grad).all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=30, n_heads=4), "d_model \\(30\\) must be divisible by n_heads \\(4\\)"),
        (dict(pool_heads=3), "divisible by pool_heads"),
        (dict(dropout=-0.1), "dropout must be in \\[0, 1\\)"),
        (dict(pool_score="cosine"), "pool_score must be one of"),
        (dict(positions="rotary"), "positions must be one of"),
        (dict(n_layers=-1), "n_layers must be >= 0"),
        # From a hand-edited config.json: a string was a traceback inside layer_norm, -1 made
        # every output NaN (rows said the weights diverged), "no" switched scaling on.
        (dict(norm_eps="1e-5"), "norm_eps must be a positive number below 1, got '1e-5'"),
        (dict(norm_eps=-1.0), "norm_eps must be a positive number below 1"),
        (dict(scale_embeddings="no"), "scale_embeddings must be true or false, got 'no'"),
    ],
)
def test_impossible_configs_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(**overrides)


def test_learned_positions_refuse_overlong_input():
    model = DocumentClassifier(tiny_config(positions="learned", max_positions=8))
    ids, mask = padded_batch([9])
    with pytest.raises(ValueError, match="exceeds max_positions=8"):
        model(ids, mask)


def test_windowed_model_reads_a_long_document_with_banded_weights():
    model = DocumentClassifier(tiny_config(attention_window=16, n_layers=1)).eval()
    ids, mask = padded_batch([1000, 700])
    out = model(ids, mask, need_layer_weights=True)
    # 1000 tokens in blocks of 16: 63 blocks, each query meeting 48 keys, never 1000.
    assert out.layer_weights[0].shape == (2, 2, 63, 16, 48)
    assert_close(out.pool_weights.sum(-1), torch.ones(2, 2))  # the pool still sees everything
    assert torch.all(out.pool_weights[1, :, 700:] == 0)


def test_compile_option_compiles_in_place_and_keeps_checkpoint_keys():
    from docclass.train.lit_module import DocClassifierModule

    plain = DocClassifierModule(vocab_size=50, num_classes=3, d_model=16, n_heads=2, pool_heads=2)
    compiled = DocClassifierModule(
        vocab_size=50, num_classes=3, d_model=16, n_heads=2, pool_heads=2, compile=True
    )
    plain.configure_model()
    compiled.configure_model()
    assert plain.model._compiled_call_impl is None
    assert compiled.model._compiled_call_impl is not None
    # Checkpoints of a compiled run load into an uncompiled model: same keys, no wrapper prefix.
    assert compiled.state_dict().keys() == plain.state_dict().keys()


@pytest.mark.parametrize("layout", [{}, POST_LN], ids=["pre-LN", "post-LN"])
def test_batch_without_padding_takes_the_unmasked_kernel_with_the_same_result(layout, monkeypatch):
    masks = []  # the attn_mask of every fused attention call, in order
    fused = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return fused(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    config = tiny_config(**layout)
    model = DocumentClassifier(config).eval()
    ids = torch.randint(1, 50, (3, 9))
    full = torch.ones(3, 9, dtype=torch.bool)
    fast = model(ids, full).logits
    assert masks == [None] * config.n_layers  # every block took the kernel without a mask
    masks.clear()
    padded = full.clone()
    padded[0, 7:] = False
    model(ids, padded)
    assert len(masks) == config.n_layers and all(mask is not None for mask in masks)
    masks.clear()

    def explicit(queries, keys, values, attn_mask=None, dropout_p=0.0):
        """The reference: softmax(q·kᵀ/√d) v, written out, masked keys at -inf."""
        scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ values

    # With the weights asked for, the output still comes from the kernel without a mask.
    model(ids, full, need_layer_weights=True)
    assert masks == [None] * config.n_layers
    # The kernel without a mask gives what the written-out attention gives, with the weights
    # asked for or not.
    monkeypatch.setattr(F, "scaled_dot_product_attention", explicit)
    assert_close(fast, model(ids, full).logits, atol=1e-5, rtol=1e-5)
    assert_close(fast, model(ids, full, need_layer_weights=True).logits, atol=1e-5, rtol=1e-5)
