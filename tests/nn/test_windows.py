"""Encoder windows: a whole document through blocks that see one window at a time, one pool
over every token (docclass/nn/windows.py). The reference is the same model run on each window
as a document of its own."""

import pytest
import torch
from helpers import padded_batch
from torch.testing import assert_close

from docclass.errors import ConfigError
from docclass.interpret.methods import attention_rollout, word_relevance
from docclass.nn import model as model_module
from docclass.nn.model import DocumentClassifier, ModelConfig, length_groups
from docclass.nn.windows import window_layout

# The BERT layout pre-trained encoders are loaded into, with 8 learned positions: windows of 8.
POST_LN = dict(
    norm="post", embedding_norm=True, scale_embeddings=False, positions="learned", max_positions=8
)


def windowed(window: int = 8, overlap: int = 0, **overrides) -> DocumentClassifier:
    settings = dict(
        vocab_size=60, num_classes=3, d_model=16, n_heads=2, n_layers=2, pool_heads=2,
        dropout=0.0, embed_dropout=0.0, window_tokens=window, window_overlap=overlap,
        **POST_LN,
    )  # fmt: skip
    settings.update(overrides)
    return DocumentClassifier(ModelConfig(**settings)).eval()


def unwindowed(model: DocumentClassifier) -> DocumentClassifier:
    """The same weights reading every row as one sequence."""
    config = ModelConfig(**{**model.config.to_dict(), "window_tokens": 0, "window_overlap": 0})
    plain = DocumentClassifier(config).eval()
    plain.load_state_dict(model.state_dict())
    return plain


def states_of_window(plain: DocumentClassifier, ids: torch.Tensor) -> torch.Tensor:
    """``[T,D]``: one window's tokens encoded as a document of their own."""
    return plain(ids[None], torch.ones(1, len(ids), dtype=torch.bool)).token_states[0]


def test_each_window_is_encoded_alone_and_one_pool_reads_them_all():
    model = windowed()
    plain = unwindowed(model)
    ids = torch.randint(2, 60, (20,))
    out = model(ids[None], torch.ones(1, 20, dtype=torch.bool))
    expected = torch.cat([states_of_window(plain, ids[s : s + 8]) for s in (0, 8, 16)])
    assert_close(out.token_states[0], expected, atol=1e-5, rtol=1e-5)
    logits, weights = model.read_out(expected[None], torch.ones(1, 20, dtype=torch.bool))
    assert_close(out.logits, logits, atol=1e-5, rtol=1e-5)
    assert_close(out.pool_weights.sum(-1), torch.ones(1, 2))  # one pool over all 20 tokens
    assert out.windows.rows == 3


def test_overlapping_windows_give_each_token_the_copy_with_more_context():
    model = windowed(overlap=3)
    plain = unwindowed(model)
    ids = torch.randint(2, 60, (13,))
    out = model(ids[None], torch.ones(1, 13, dtype=torch.bool))
    # Windows start every 5 tokens: [0, 8) and [5, 13). Token 6 has 1 token of context on its
    # right in the first window and 1 on its left in the second (a tie: the earlier window);
    # token 7 has 0 on its right in the first and 2 on its left in the second.
    first, second = states_of_window(plain, ids[0:8]), states_of_window(plain, ids[5:13])
    expected = torch.cat([first[:7], second[2:]])
    assert_close(out.token_states[0], expected, atol=1e-5, rtol=1e-5)
    # A third window, [10, 13), would own no token (each has more context in [5, 13)): not run.
    assert out.windows.rows == 2


def test_a_document_shorter_than_the_window_reads_as_before():
    model = windowed()
    plain = unwindowed(model)
    # A longer batch mate sends the whole batch through window rows.
    ids, mask = padded_batch([7, 3, 20], vocab=60)
    assert_close(model(ids, mask).logits[:2], plain(ids[:2, :7], mask[:2, :7]).logits)


def test_padding_and_batch_mates_do_not_change_a_document():
    model = windowed(overlap=2)
    ids, mask = padded_batch([19, 4, 30], vocab=60, extra_padding=5)
    together = model(ids, mask)
    for row, length in enumerate((19, 4, 30)):
        alone = model(ids[row : row + 1, :length], mask[row : row + 1, :length])
        assert_close(together.logits[row], alone.logits[0], atol=1e-5, rtol=1e-5)
    weights = together.pool_weights
    assert torch.all(weights.masked_select(~mask[:, None, :].expand_as(weights)) == 0)
    assert_close(weights.sum(-1), torch.ones(3, 2))


def test_a_copy_with_tokens_cut_out_equals_masking_them():
    """Erasure checks cut removed tokens out and keep the rest at their document positions: each
    kept token stays in its window at its own in-window position."""
    model = windowed(overlap=3)
    ids = torch.randint(2, 60, (1, 26))
    keep = torch.ones(1, 26, dtype=torch.bool)
    keep[0, [0, 5, 6, 7, 12, 13, 14, 15, 25]] = False  # the first window half gone, the last token
    masked = model(ids, keep)
    kept = keep[0].nonzero()[:, 0]
    cut = model(ids[:, kept], torch.ones(1, len(kept), dtype=torch.bool), positions=kept[None])
    assert_close(cut.logits, masked.logits, atol=1e-5, rtol=1e-5)


def test_an_empty_document_in_the_batch_gets_zero_pool_weights():
    model = windowed()
    ids, mask = padded_batch([20, 1], vocab=60)
    mask[1] = False
    out = model(ids, mask)
    assert torch.all(out.pool_weights[1] == 0) and torch.isfinite(out.logits).all()


def test_rollout_runs_through_each_window_row():
    model = windowed(overlap=3, n_layers=1)
    plain = unwindowed(model)
    ids = torch.randint(2, 60, (13,))
    out = model(ids[None], torch.ones(1, 13, dtype=torch.bool), need_layer_weights=True)
    assert out.layer_weights[0].shape == (2, 2, 8, 8)  # per row: 2 windows, 2 heads, 8 × 8
    pool = out.pool_weights.mean(1)[0]
    # Written out: windows [0, 8) and [5, 13); tokens 0-6 are read from the first, 7-12 from
    # the second. Each window's flow starts at the pool's weight on the tokens it owns, goes
    # through its own attention, and a token's two copies add up.
    expected = torch.zeros(13)
    for start, owned in ((0, range(0, 7)), (5, range(7, 13))):
        part = ids[start : start + 8]
        attention = plain(part[None], torch.ones(1, 8, dtype=torch.bool), True).layer_weights[0]
        flow = torch.zeros(8)
        flow[[t - start for t in owned]] = pool[list(owned)]
        expected[start : start + 8] += flow @ (0.5 * attention[0].mean(0) + 0.5 * torch.eye(8))
    rollout = attention_rollout(out.layer_weights, pool[None], out.windows)
    assert_close(rollout[0], expected, atol=1e-6, rtol=1e-5)
    assert_close(rollout.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("lengths", [[30, 9, 2, 17, 8], [16, 15, 2]])
def test_window_rows_of_unlike_lengths_run_in_groups_with_the_same_results(monkeypatch, lengths):
    """Last windows are short: rows run in groups of similar length, each padded only to its
    own width. Logits, states, real rows' attention and relevance equal one padded run; every
    slot of the weights is written (uninitialised memory is NaN here) and padded keys get 0.
    [16, 15, 2] puts a padded row (7 of 8) inside a group, so the masked path runs too."""
    model = windowed()
    ids, mask = padded_batch(lengths, vocab=60)
    target = torch.arange(len(lengths)) % 3

    def run():
        out = model(ids, mask, need_layer_weights=True)
        rules = ("cp", "cp-gamma", "gradient")
        return out, {rule: word_relevance(model, ids, mask, target, rule) for rule in rules}

    new_empty = torch.Tensor.new_empty
    with monkeypatch.context() as patch:
        patch.setattr(model_module, "GROUP_MULTIPLE", 1)  # widths as short as the rows
        patch.setattr(
            torch.Tensor, "new_empty", lambda t, *a, **k: new_empty(t, *a, **k).fill_(torch.nan)
        )
        grouped, grouped_relevance = run()
        layout = grouped.windows
        assert len(length_groups(layout.row_mask.sum(dim=1))) > 1  # two ways are compared
    monkeypatch.setattr(model_module, "GROUP_FILL", 0.0)  # every row in one group
    single, single_relevance = run()
    assert_close(grouped.logits, single.logits, atol=1e-6, rtol=1e-5)
    assert_close(grouped.token_states, single.token_states, atol=1e-6, rtol=1e-5)
    real = layout.row_mask[:, None, :, None] & layout.row_mask[:, None, None, :]
    padded_keys = ~layout.row_mask[:, None, None, :]
    for ours, theirs in zip(grouped.layer_weights, single.layer_weights, strict=True):
        assert torch.isfinite(ours).all()
        assert_close(ours * real, theirs * real, atol=1e-6, rtol=1e-5)
        assert torch.all(ours.masked_select(padded_keys.expand_as(ours)) == 0)
    for rule, scores in grouped_relevance.items():
        assert_close(scores, single_relevance[rule], atol=1e-6, rtol=1e-5)


def test_length_groups_cover_every_row_once_with_little_padding():
    lengths = torch.tensor([512, 3, 88, 512, 400, 1, 380, 90, 70])
    groups = length_groups(lengths)
    rows = torch.cat([index for index, _ in groups])
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    for index, width in groups:
        longest = int(lengths[index].max())
        assert longest <= width < longest + model_module.GROUP_MULTIPLE and width <= 512
    assert len({width for _, width in groups}) == len(groups)  # one pass per width
    # Widths round up to 8 but never past the rows' own width; equal widths merge.
    assert [(sorted(i.tolist()), w) for i, w in length_groups(torch.tensor([13, 12, 5]), 13)] == [
        ([0, 1], 13),
        ([2], 8),
    ]
    assert [(sorted(i.tolist()), w) for i, w in length_groups(torch.tensor([7, 5]), 20)] == [
        ([0, 1], 8)
    ]


def test_rounded_group_widths_give_the_same_results_as_one_padding(monkeypatch):
    """With the default rounding a group can be wider than its longest row yet narrower than
    the rows: windows of 20, last windows of 13, 7 and 5 tokens (groups of width 16 and 8)."""
    model = windowed(window=20, max_positions=20)
    ids, mask = padded_batch([53, 47, 25, 40], vocab=60)
    grouped = model(ids, mask, need_layer_weights=True)
    widths = [w for _, w in length_groups(grouped.windows.row_mask.sum(dim=1), 20)]
    assert any(8 < w < 20 for w in widths) and len(widths) > 1
    monkeypatch.setattr(model_module, "GROUP_FILL", 0.0)
    single = model(ids, mask, need_layer_weights=True)
    assert_close(grouped.logits, single.logits, atol=1e-6, rtol=1e-5)
    assert_close(grouped.token_states, single.token_states, atol=1e-6, rtol=1e-5)


def test_layout_keeps_every_real_token_once_as_an_owner():
    mask = torch.zeros(3, 40, dtype=torch.bool)
    mask[0], mask[1, :17], mask[2, :1] = True, True, True
    positions = torch.arange(40).expand(3, -1)
    for overlap in (0, 1, 4, 7):
        layout = window_layout(mask, positions, 8, overlap)
        owners = torch.zeros_like(mask, dtype=torch.long)
        owners.index_put_(
            (layout.document[layout.owner], layout.token[layout.owner]),
            torch.tensor(1),
            accumulate=True,
        )
        assert torch.equal(owners, mask.long())
        assert (layout.position < 8).all() and (layout.slot < layout.width).all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(window_tokens=-1), "window_tokens must be >= 0"),
        (dict(window_overlap=5), "window_overlap must be in \\[0, window_tokens // 2 = 4\\]"),
        (dict(window_overlap=-1), "window_overlap must be in"),
        (dict(window_tokens=0, window_overlap=1), "window_tokens // 2 = 0"),
        (dict(window_tokens=16), "window_tokens 16 exceeds the 8 learned positions"),
        (dict(attention_window=4), "set one of them"),
    ],
)
def test_impossible_windows_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        windowed(**overrides)


def test_head_mean_weights_are_the_mean_of_every_head_s_in_every_window_row():
    """``need_layer_weights="mean"`` (what rollout reads): the per-head weights averaged, head
    axis kept, through rows grouped by width as through one padding."""
    model = windowed(window=20, max_positions=20)
    ids, mask = padded_batch([53, 47, 25, 40], vocab=60)
    heads = model(ids, mask, need_layer_weights=True)
    mean = model(ids, mask, need_layer_weights="mean")
    assert_close(mean.logits, heads.logits, atol=0, rtol=0)
    assert len(mean.layer_weights) == len(heads.layer_weights)
    for averaged, every in zip(mean.layer_weights, heads.layer_weights, strict=True):
        assert every.shape[1] > 1 and averaged.shape == (every.shape[0], 1, *every.shape[2:])
        assert_close(averaged, every.mean(dim=1, keepdim=True), atol=1e-7, rtol=0)
    with pytest.raises(ValueError, match="'mean'"):
        model(ids, mask, need_layer_weights="heads")  # a typo must not mean "every head"


@pytest.mark.parametrize("window", [8, 0])
@pytest.mark.parametrize("blocks", [0, 1, 2])
def test_states_between_blocks_continue_to_the_same_output(window, blocks):
    """What a run with its lowest blocks frozen caches (lower_block_states) and what it trains
    on (classify_from_block) together are the model: the same logits and pool weights, in
    window rows of unlike lengths (documents of 20 and 17 tokens end in short windows) and as
    plain sequences."""
    torch.manual_seed(0)
    model = windowed(window=window, n_layers=3, max_positions=32)
    ids, mask = padded_batch([7, 3, 20, 17, 9], vocab=60)
    out = model(ids, mask)
    states = model.lower_block_states(ids, mask, blocks)
    assert states.shape == (5, 20, 16) and torch.all(states[~mask] == 0)
    logits, pool_weights = model.classify_from_block(states, mask, blocks)
    assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)
    assert_close(pool_weights, out.pool_weights, atol=1e-6, rtol=1e-5)
    # Not a pass-through: the states between blocks are not the encoder's output.
    assert not torch.allclose(states[mask], out.token_states[mask], atol=1e-2)


def test_states_between_blocks_are_refused_where_a_token_has_two():
    model = windowed(overlap=3)
    ids, mask = padded_batch([20], vocab=60)
    with pytest.raises(ValueError, match="no window_overlap"):
        model.lower_block_states(ids, mask, 1)
    with pytest.raises(ValueError, match=r"in \[0, 2\)"):
        windowed().classify_from_block(torch.zeros(1, 20, 16), mask, 2)
