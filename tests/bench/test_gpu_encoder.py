"""The GPU benchmark's rows for transformers' BERT are the window rows docclass's blocks see."""

import pytest
import torch

from benchmarks.gpu_encoder import REFERENCE, cycled, mode_figures, window_rows


def test_bert_rows_are_docclass_windows_each_with_its_document_s_label():
    ids = torch.tensor([[11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [21, 22, 23, 24] + [0] * 6])
    mask = ids != 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([3, 1])}
    rows = window_rows(batch, 4)
    assert rows["input_ids"].tolist() == [
        [11, 12, 13, 14], [15, 16, 17, 18], [19, 20, 0, 0], [21, 22, 23, 24]
    ]  # fmt: skip
    assert rows["attention_mask"].sum() == mask.sum()
    assert rows["labels"].tolist() == [3, 3, 3, 1]


def test_documents_no_longer_than_a_window_stay_one_row_each():
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    batch = {"input_ids": ids, "attention_mask": ids != 0, "labels": torch.tensor([0, 2])}
    rows = window_rows(batch, 4)
    assert rows["input_ids"].tolist() == ids.tolist() and rows["labels"].tolist() == [0, 2]


def test_overlapping_windows_are_refused():
    ids = torch.arange(1, 11).unsqueeze(0)
    batch = {"input_ids": ids, "attention_mask": ids != 0, "labels": torch.tensor([0])}
    with pytest.raises(ValueError, match="overlap"):
        window_rows(batch, 4, overlap=2)


def test_steps_cycle_through_the_distinct_batches_in_turn():
    assert cycled(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    assert cycled(["a", "b", "c"], 2) == ["a", "b"]


def test_speeds_flops_and_the_ratio_come_from_each_side_s_median():
    seconds = {"docclass": [2.0, 1.0, 9.0], REFERENCE: [4.0, 3.0, 5.0]}  # medians 2 and 4
    real = {"docclass": 1000, REFERENCE: 1000}
    flops = {"docclass": 6e12, REFERENCE: 12e12}
    figures = mode_figures(seconds, real, flops, peak=10.0)
    assert figures["real_tokens_per_s"] == {"docclass": 500, REFERENCE: 250}
    assert figures["tflops_per_s"] == {"docclass": 3.0, REFERENCE: 3.0}
    assert figures["mfu_vs_dense_bf16_peak"] == {"docclass": 0.3, REFERENCE: 0.3}
    assert figures["docclass_over_transformers"] == 2.0  # docclass twice as fast
    assert mode_figures(seconds, real, flops, peak=None)["mfu_vs_dense_bf16_peak"] is None
    with pytest.raises(ValueError, match="different real tokens"):
        mode_figures(seconds, {"docclass": 1000, REFERENCE: 1200}, flops, peak=None)


def test_bert_gets_docclass_s_dropout_not_its_own_config_s():
    from benchmarks.encoder_speed import bert_like
    from docclass.train.lit_module import DocClassifierModule

    pytest.importorskip("transformers")
    ours = DocClassifierModule(
        vocab_size=30522, num_classes=3, encoder="minilm", dropout=0.05, embed_dropout=0.05
    )
    theirs = bert_like(ours, "minilm", 3)
    # MiniLM's own config says 0.1 for both: BERT would drop attention docclass keeps.
    assert theirs.config.attention_probs_dropout_prob == 0.0
    assert theirs.config.hidden_dropout_prob == 0.05
    assert theirs.num_labels == 3
    # Dropout BERT has no place for is refused, not silently left out of the comparison.
    for other in ({"embed_dropout": 0.2}, {"word_dropout": 0.1}):
        unlike = DocClassifierModule(
            vocab_size=30522,
            num_classes=3,
            encoder="minilm",
            **{"dropout": 0.05, "embed_dropout": 0.05, **other},
        )
        with pytest.raises(ValueError, match="cannot copy"):
            bert_like(unlike, "minilm", 3)
