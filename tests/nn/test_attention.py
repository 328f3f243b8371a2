import math

import pytest
import torch
import torch.nn.functional as F
from helpers import padded_batch
from torch.testing import assert_close

from docclass.nn.attention import (
    AdditiveScore,
    AttentionPool,
    DotScore,
    GaussianScore,
    MultiHeadSelfAttention,
    banded_flow,
    banded_to_dense,
    local_attention,
    make_score,
    masked_softmax,
    merge_heads,
    split_heads,
)


def random_mask(batch: int, tokens: int) -> torch.Tensor:
    lengths = torch.randint(1, tokens + 1, (batch,))
    lengths[0] = tokens  # one full row
    return torch.arange(tokens)[None, :] < lengths[:, None]


class TestMaskedSoftmax:
    def test_padding_gets_exactly_zero_and_rows_sum_to_one(self):
        scores = torch.randn(4, 3, 7) * 10
        mask = random_mask(4, 7)[:, None, :]
        weights = masked_softmax(scores, mask)
        assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)
        assert_close(weights.sum(-1), torch.ones(4, 3))

    def test_matches_softmax_over_real_positions_only(self):
        scores = torch.randn(9)
        mask = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1, 0], dtype=torch.bool)
        weights = masked_softmax(scores, mask)
        assert_close(weights[mask], torch.softmax(scores[mask], dim=0))

    def test_all_padding_row_is_zeros_not_nan(self):
        weights = masked_softmax(torch.randn(2, 5), torch.zeros(2, 5, dtype=torch.bool))
        assert torch.equal(weights, torch.zeros(2, 5))

    def test_huge_scores_stay_finite(self):
        scores = torch.tensor([[1e30, -1e30, 3e38]])
        weights = masked_softmax(scores, torch.tensor([[True, True, False]]))
        assert torch.isfinite(weights).all()
        assert weights[0, 2] == 0

    def test_bfloat16(self):
        scores = torch.randn(3, 6).bfloat16()
        mask = random_mask(3, 6)
        weights = masked_softmax(scores, mask)
        assert torch.all(weights[~mask] == 0)
        assert_close(weights.float().sum(-1), torch.ones(3), atol=1e-2, rtol=0)


class TestScores:
    def setup_method(self):
        self.q = torch.randn(2, 3, 4, 8)
        self.k = torch.randn(2, 3, 5, 8)

    def test_dot_is_scaled_dot_product(self):
        expected = torch.einsum("bhqd,bhtd->bhqt", self.q, self.k) / math.sqrt(8)
        assert_close(DotScore()(self.q, self.k), expected)

    def test_gaussian_is_half_negative_squared_distance(self):
        expected = -torch.cdist(self.q, self.k).pow(2) / 2
        assert_close(GaussianScore()(self.q, self.k), expected, atol=1e-4, rtol=1e-4)

    def test_additive_against_a_loop(self):
        score = AdditiveScore(n_heads=3, head_dim=8, hidden=6)
        got = score(self.q, self.k)
        expected = torch.empty(2, 3, 4, 5)
        for b in range(2):
            for h in range(3):
                for i in range(4):
                    for j in range(5):
                        hidden = torch.tanh(
                            self.q[b, h, i] @ score.query_proj[h]
                            + self.k[b, h, j] @ score.key_proj[h]
                        )
                        expected[b, h, i, j] = hidden @ score.out[h]
        assert_close(got, expected, atol=1e-5, rtol=1e-5)

    def test_unknown_kind_is_refused(self):
        with pytest.raises(ValueError, match="unknown attention score 'cosine'"):
            make_score("cosine", 2, 4)

    def test_heads_round_trip(self):
        x = torch.randn(2, 7, 12)
        assert split_heads(x, 3).shape == (2, 3, 7, 4)
        assert torch.equal(merge_heads(split_heads(x, 3)), x)


class TestSelfAttention:
    def setup_method(self):
        self.attention = MultiHeadSelfAttention(d_model=16, n_heads=4).eval()
        self.x = torch.randn(3, 9, 16)
        self.mask = random_mask(3, 9)

    def reference(self, x, mask):
        """Independent computation: per-head projections, torch's SDPA with a float mask, W_o."""
        w_q, w_k, w_v = self.attention.qkv.weight.chunk(3, dim=0)
        b_q, b_k, b_v = self.attention.qkv.bias.chunk(3, dim=0)
        heads = []
        for h in range(4):
            rows = slice(4 * h, 4 * h + 4)
            q = x @ w_q[rows].T + b_q[rows]
            k = x @ w_k[rows].T + b_k[rows]
            v = x @ w_v[rows].T + b_v[rows]
            bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))[:, None, :]
            heads.append(F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
        return self.attention.out_proj(torch.cat(heads, dim=-1))

    def test_fused_path_matches_reference(self):
        out, weights = self.attention(self.x, self.mask)
        assert weights is None
        assert_close(out, self.reference(self.x, self.mask), atol=1e-5, rtol=1e-5)

    def test_weights_asked_for_leave_the_output_as_is_and_are_masked(self):
        fused, _ = self.attention(self.x, self.mask)
        explicit, weights = self.attention(self.x, self.mask, need_weights=True)
        assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
        assert weights.shape == (3, 4, 9, 9)
        assert torch.all(
            weights.masked_select(~self.mask[:, None, None, :].expand_as(weights)) == 0
        )
        assert_close(weights.sum(-1), torch.ones(3, 4, 9))

    def test_weights_without_a_mask_match_the_reference(self):
        """A batch with no padding passes mask None: the weights come from a plain softmax."""
        every = torch.ones(3, 9, dtype=torch.bool)
        out, weights = self.attention(self.x, None, need_weights=True)
        assert_close(out, self.reference(self.x, every), atol=1e-5, rtol=1e-5)
        _, masked_weights = self.attention(self.x, every, need_weights=True)
        assert_close(weights, masked_weights)
        assert_close(weights.sum(-1), torch.ones(3, 4, 9))

    @pytest.mark.parametrize("padded", [True, False])
    def test_the_weights_returned_are_those_the_output_was_made_with(self, padded):
        """The output comes from the fused kernel, the weights from beside it: weights · V,
        through W_o, must give the output of every real query, and a gradient must reach the
        input through the output (gradient × input differentiates the attention)."""
        mask = self.mask if padded else None
        x = self.x.clone().requires_grad_(True)
        out, weights = self.attention(x, mask, need_weights=True)
        assert not weights.requires_grad
        values = split_heads(self.attention.qkv(self.x).chunk(3, dim=-1)[2], 4)
        rebuilt = self.attention.out_proj(merge_heads(weights @ values))
        real = self.mask if padded else torch.ones(3, 9, dtype=torch.bool)
        assert_close(out[real], rebuilt[real], atol=1e-5, rtol=1e-5)
        (gradient,) = torch.autograd.grad(out[real].sum(), x)
        (reference,) = torch.autograd.grad(self.attention(x, mask)[0][real].sum(), x)
        assert_close(gradient, reference)

    def test_empty_document_gives_finite_output(self):
        mask = self.mask.clone()
        mask[1] = False
        out, _ = self.attention(self.x, mask)
        assert torch.isfinite(out).all()
        out, weights = self.attention(self.x, mask, need_weights=True)
        assert torch.isfinite(out).all() and torch.equal(weights[1], torch.zeros_like(weights[1]))
        assert torch.all(weights[~mask[:, None, None, :].expand_as(weights)] == 0)

    def test_head_count_must_divide_width(self):
        with pytest.raises(ValueError, match="divisible"):
            MultiHeadSelfAttention(d_model=10, n_heads=4)


class TestAttentionPool:
    @pytest.mark.parametrize("score", ["dot", "additive", "gaussian"])
    def test_weights_and_pooled_vector(self, score):
        pool = AttentionPool(d_model=12, n_heads=3, score=score)
        x = torch.randn(4, 6, 12)
        mask = random_mask(4, 6)
        pooled, weights = pool(x, mask)
        assert pooled.shape == (4, 12) and weights.shape == (4, 3, 6)
        assert torch.all(weights.masked_select(~mask[:, None, :].expand_as(weights)) == 0)
        assert_close(weights.sum(-1), torch.ones(4, 3))
        # Pooled = W_o · concat_h(Σ_t α_ht v_ht) + b_o, computed independently.
        values = pool.value_proj(x).view(4, 6, 3, 4)
        per_head = torch.einsum("bht,bthd->bhd", weights, values).reshape(4, 12)
        assert_close(pooled, pool.out_proj(per_head), atol=1e-5, rtol=1e-5)

    def test_folded_dot_pool_without_gradients_matches_the_explicit_pool(self):
        # Inference skips projecting every token's key and value (the same sums, reordered):
        # weights, pooled vector, exact zeros on padding and an all-padding row must agree
        # with the path that projects them, which training takes.
        torch.manual_seed(0)
        pool = AttentionPool(d_model=16, n_heads=4).eval()
        for parameter in pool.parameters():
            torch.nn.init.normal_(parameter, std=0.5)  # far from the defaults: big scores
        x = torch.randn(3, 9, 16)
        mask = random_mask(3, 9)
        mask[2] = False  # a document with no real token
        with torch.enable_grad():
            explicit = pool(x, mask)
        with torch.no_grad():
            folded = pool(x, mask)
        assert_close(folded[1], explicit[1], atol=1e-6, rtol=1e-5)
        assert_close(folded[0], explicit[0], atol=1e-5, rtol=1e-5)
        assert torch.all(folded[1].masked_select(~mask[:, None, :].expand_as(folded[1])) == 0)
        with torch.no_grad():
            pool.fold_without_grad = False
            assert_close(pool(x, mask)[0], explicit[0])

    @pytest.mark.parametrize("score", ["additive", "gaussian"])
    def test_only_the_dot_pool_folds(self, score):
        assert not AttentionPool(d_model=8, n_heads=2, score=score).fold_without_grad

    def test_padding_does_not_change_the_result(self):
        pool = AttentionPool(d_model=8, n_heads=2)
        x = torch.randn(1, 5, 8)
        mask = torch.ones(1, 5, dtype=torch.bool)
        padded_x = torch.cat([x, torch.randn(1, 7, 8) * 100], dim=1)
        padded_mask = torch.cat([mask, torch.zeros(1, 7, dtype=torch.bool)], dim=1)
        assert_close(pool(padded_x, padded_mask)[0], pool(x, mask)[0])


def _band_reference(queries, keys, values, key_mask, window):
    """Full T×T attention restricted to |i-j| <= window and real keys (the definition)."""
    length = queries.shape[2]
    positions = torch.arange(length)
    band = (positions[:, None] - positions[None, :]).abs() <= window
    allowed = band & key_mask[:, None, None, :]
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5
    weights = masked_softmax(scores, allowed)
    return weights @ values, weights


@pytest.mark.parametrize(("lengths", "window"), [([13, 7], 4), ([16, 16], 4), ([9, 3], 16)])
@pytest.mark.parametrize("need_weights", [False, True])
def test_local_attention_matches_banded_full_attention(lengths, window, need_weights):
    ids, mask = padded_batch(lengths, extra_padding=2)
    batch, length = ids.shape
    queries, keys, values = (torch.randn(batch, 2, length, 8) for _ in range(3))
    out, banded = local_attention(queries, keys, values, mask, window, need_weights)
    want, want_weights = _band_reference(queries, keys, values, mask, window)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], want[real], atol=1e-5, rtol=1e-5)
    if need_weights:
        dense = banded_to_dense(banded, length)
        torch.testing.assert_close(dense, want_weights, atol=1e-6, rtol=1e-5)
        # Padded keys and keys beyond the window get exactly zero weight.
        assert (dense * ~mask[:, None, None, :]).abs().max() == 0
        far = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).abs() > window
        assert not far.any() or dense[..., far].abs().max() == 0
        # Rollout's product through the band equals the dense product.
        flow = torch.rand(batch, length) * mask
        mean = banded.mean(dim=1)
        torch.testing.assert_close(
            banded_flow(flow, mean),
            (flow.unsqueeze(1) @ dense.mean(dim=1)).squeeze(1),
            atol=1e-6,
            rtol=1e-5,
        )
    else:
        assert banded is None


def test_window_wider_than_the_document_is_full_attention():
    ids, mask = padded_batch([11, 6])
    full = MultiHeadSelfAttention(16, 2).eval()
    local = MultiHeadSelfAttention(16, 2, window=32).eval()
    local.load_state_dict(full.state_dict())
    x = torch.randn(2, ids.shape[1], 16)
    torch.testing.assert_close(
        local(x, mask)[0][mask], full(x, mask)[0][mask], atol=1e-5, rtol=1e-5
    )


def test_gaussian_score_keeps_its_precision_under_bf16_autocast():
    # Nearby query and key of large norm: ‖q‖², 2q·k and ‖k‖² nearly cancel.
    torch.manual_seed(0)
    keys = (8 * torch.randn(1, 1, 6, 16)).bfloat16()
    queries = (keys[:, :, :1].float() + 0.05 * torch.randn(1, 1, 1, 16)).bfloat16()
    difference = queries.double().unsqueeze(-2) - keys.double().unsqueeze(-3)
    reference = -difference.pow(2).sum(-1) / 2  # exact, on the same bf16 inputs
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = GaussianScore()(queries, keys)
    assert scores.dtype == torch.bfloat16
    # bf16 rounding of the result: under 1 % of each score (and the near key's stays near 0).
    assert ((scores.double() - reference).abs() <= 0.01 * reference.abs() + 1e-3).all()


def test_a_pool_quantised_to_int8_takes_the_explicit_path():
    # Dynamic int8 quantisation packs the projections' weights, which folding cannot read.
    pool = AttentionPool(d_model=16, n_heads=4).eval()
    quantised = torch.ao.quantization.quantize_dynamic(pool, {torch.nn.Linear}, dtype=torch.qint8)
    x, mask = torch.randn(2, 5, 16), random_mask(2, 5)
    with torch.no_grad():
        assert_close(quantised(x, mask)[0], pool(x, mask)[0], atol=0.05, rtol=0.05)


def test_a_bf16_training_step_on_the_cpu_attends_in_float32():
    # The fused kernel's bf16 backward pass took 2.5 times its float32 one on the CPU; a
    # training step's attention runs in float32, inference keeps bf16.
    torch.manual_seed(0)
    attention = MultiHeadSelfAttention(d_model=64, n_heads=4).eval()
    q, k, v = (torch.randn(2, 4, 40, 16).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.arange(40)[None, :] < torch.tensor([[40], [23]])
    key_mask = mask[:, None, None, :]
    in_float32 = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), key_mask)
    in_bf16 = F.scaled_dot_product_attention(q, k, v, key_mask)
    assert not torch.equal(in_float32.bfloat16(), in_bf16)  # the two ways differ here
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trained, _ = attention._attend(q, k, v, mask, need_weights=False)
        with torch.no_grad():
            inferred, _ = attention._attend(q, k, v, mask, need_weights=False)
    assert trained.dtype == inferred.dtype == torch.bfloat16
    assert torch.equal(trained, in_float32.bfloat16())
    assert torch.equal(inferred, in_bf16)
    trained.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad).all()
