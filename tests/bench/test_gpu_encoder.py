"""The GPU benchmark's rows for transformers' BERT are the window rows docclass's blocks see."""

import torch

from benchmarks.gpu_encoder import window_rows


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
