"""Helpers shared by tests in different folders (fixtures live in conftest.py)."""

import contextlib
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import datasets
import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn

from docclass.artifacts.load import TrainedClassifier
from docclass.data.tokenizer import TokenizerSpec, train_tokenizer
from docclass.nn.model import DocumentClassifier, ModelConfig

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def padded_batch(
    lengths: list[int], vocab: int = 50, extra_padding: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids with the given real lengths, padded with id 0 to the longest (+ extra)."""
    width = max(lengths) + extra_padding
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(2, vocab, (length,))
    return ids, ids != 0


AG_NEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]
TOPIC_WORDS = {
    "World": "minister election treaty border",
    "Sports": "match goal season coach",
    "Business": "shares profit market bank",
    "Sci/Tech": "software chip internet robot",
}


def topical_rows(n: int, names=AG_NEWS_CLASSES, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    texts, labels = [], []
    for i in range(n):
        label = i % len(names)
        words = TOPIC_WORDS[names[label]].split()
        picks = torch.randint(0, len(words), (8,), generator=generator).tolist()
        texts.append(f"item {i} " + " ".join(words[p] for p in picks))
        labels.append(label)
    return {"text": texts, "label": labels}


KEYWORDS = ("zorblax", "quintessa", "vermilox")


def write_jsonl(path, rows):
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"text": row["text"], "label": row["label"]}) + "\n")


def write_ag_news_like(root, n_train=80, n_test=20):
    """Files laid out and typed like the hub's ag_news: data/{train,test}-*.parquet, ClassLabel."""
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=AG_NEWS_CLASSES)}
    )
    (root / "data").mkdir(parents=True)
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        dataset = datasets.Dataset.from_dict(topical_rows(n, seed=seed), features=features)
        dataset.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    return root


LABELS = ["markets", "sport", "tech"]
DOCUMENTS = [
    "Markets rallied as the central bank held interest rates.",
    "The striker scored twice in the second half, and the crowd roared!",
    "New smartphones ship with faster chips… and better cameras 🙂.",
    "Short.",
]


@contextlib.contextmanager
def norms_and_gates_held(model: nn.Module):
    """While open, every LayerNorm and GELU of ``model`` gives its usual value with ``1/σ`` and
    the gate ``Φ(x)`` constant in the backward pass: gradient × input's rule, written here
    from its definition with forward hooks, so plain autograd gives the reference."""

    def held_norm(module, args, output):
        centred = args[0] - args[0].mean(dim=-1, keepdim=True)
        sigma = (centred.pow(2).mean(dim=-1, keepdim=True) + module.eps).sqrt().detach()
        return centred / sigma * module.weight + module.bias

    def held_gate(module, args, output):
        return args[0] * (0.5 * (1 + torch.erf(args[0] / math.sqrt(2)))).detach()

    handles = [
        module.register_forward_hook(held_norm if isinstance(module, nn.LayerNorm) else held_gate)
        for module in model.modules()
        if isinstance(module, nn.LayerNorm | nn.GELU)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def embedding_offset(model: nn.Module) -> torch.Tensor | float:
    """The embedding norm's offset (0 without one): the same for every token, so a bias, not
    part of what a token brings to the first block."""
    offset = getattr(model.embedding_norm, "bias", None)
    return 0.0 if offset is None else offset.detach()


@contextlib.contextmanager
def first_block_inputs(model: nn.Module):
    """While open, each call of the model's first block takes a copy of its input that
    requires gradients; the copies are yielded in a list, in call order (one per group of
    window rows). ``(copy.grad * (copy - embedding_offset(model))).sum(-1)`` is then gradient
    × input of what every token brings to the first block, written without docclass's
    ``entry_scale``."""
    copies: list[torch.Tensor] = []

    def leaf_input(module, args):
        copies.append(args[0].detach().clone().requires_grad_(True))
        return (copies[-1], *args[1:])

    handle = model.blocks[0].register_forward_pre_hook(leaf_input)
    try:
        yield copies
    finally:
        handle.remove()


def lead_weights(logits: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """``[B,C]``: the weights that make a class's lead over its rivals from the logits: 1 at
    the predicted class, minus the rivals' probabilities renormalised among themselves
    elsewhere (float64, written out from the definition, not from docclass's code)."""
    probabilities = logits.detach().double().softmax(-1)
    own = probabilities.gather(1, predicted[:, None])
    weights = -probabilities / (1 - own)
    return weights.scatter(1, predicted[:, None], 1.0)


def tiny_classifier(
    n_layers: int = 2,
    max_tokens: int | None = None,
    attention_window: int = 0,
    labels: list[str] = LABELS,
    **settings,
) -> TrainedClassifier:
    """A small untrained classifier on a real tokenizer; ``settings`` are more ModelConfig
    fields (encoder windows, say)."""
    tokenizer = train_tokenizer(CORPUS, TokenizerSpec(vocab_size=90, min_frequency=1))
    config = ModelConfig(
        vocab_size=tokenizer.get_vocab_size(),
        num_classes=len(labels),
        d_model=16,
        n_heads=2,
        n_layers=n_layers,
        pool_heads=2,
        ffn_mult=2,
        attention_window=attention_window,
        **settings,
    )
    torch.manual_seed(0)
    model = DocumentClassifier(config).eval()
    return TrainedClassifier(model, tokenizer, labels, max_tokens)


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Markets rallied as the central bank held interest rates.",
    "The striker scored twice in the second half.",
    "New smartphones ship with faster chips and better cameras.",
] * 5


HARD_TEXTS = [
    ("Hello, world!", ["Hello", ",", "world", "!"]),
    ("a  b\t\tc\n\nd", ["a", "b", "c", "d"]),
    ("supercalifragilistic", ["supercalifragilistic"]),
    ("Ｆｕｌｌｗｉｄｔｈ text", ["Ｆｕｌｌｗｉｄｔｈ", "text"]),
    ("Zürich's café", ["Zürich", "'", "s", "café"]),
    ("emoji 🙂 ok", ["emoji", "🙂", "ok"]),
    # NFKC expands the ellipsis into three full stops: still one word of the original text.
    ("wait… what", ["wait", "…", "what"]),
]


class WordCollector(HTMLParser):
    """The text of every word (``<b id=wN>``) and of the ``#text`` block, as parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.words: dict[int, dict] = {}
        self.text_parts: list[str] = []
        self._depth = 0  # inside #text
        self._word: int | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if attributes.get("id") == "text":
            self._depth = 1
        elif self._depth:
            self._depth += 1
            if tag == "b" and (attributes.get("id") or "").startswith("w"):
                self._word = int(attributes["id"][1:])
                self.words[self._word] = {"text": "", **attributes}

    def handle_endtag(self, tag):
        if self._depth:
            self._depth -= 1
            self._word = None

    def handle_data(self, data):
        if self._depth:
            self.text_parts.append(data)
            if self._word is not None:
                self.words[self._word]["text"] += data


def assert_only_the_reports_own_scripts(html):
    """Every script of a page is its data block or one of the report folder's own files."""
    opened = re.findall(r"<script[^>]*>", html)
    assert len(opened) == html.count("</script>") <= 3
    for tag in opened:
        assert tag in (
            '<script type="application/json" id="doc-data">',
            '<script type="application/json" id="lexicon-data">',
        ) or re.fullmatch(r'<script src="(\.\./)?assets/(document|index|methods)\.js">', tag), tag


def parsed_page(path) -> WordCollector:
    collector = WordCollector()
    collector.feed(path.read_text(encoding="utf-8"))
    return collector


class RankMetrics(pl.Callback):
    """Writes what each rank sees at the end of fit, ``<root>/rank<r>.json`` (named by class
    path in DDP tests, whose processes get ``PYTHONPATH=tests``), with the last validation
    pass's scores worked out here from every rank's predictions, once per document:
    ``recomputed/val_documents``, ``recomputed/val_acc``, ``recomputed/val_f1`` and
    ``recomputed/val_loss`` (cross-entropy with the module's label smoothing, from the
    probabilities)."""

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._rows: list[tuple] = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *_) -> None:
        smoothing = pl_module.hparams.label_smoothing
        log_probs = outputs["probs"].double().log()
        own = log_probs.gather(1, outputs["labels"][:, None])[:, 0]
        losses = -(1 - smoothing) * own - smoothing * log_probs.mean(dim=1)
        columns = [outputs[key].tolist() for key in ("index", "preds", "labels")]
        self._rows.extend(zip(*columns, losses.tolist(), strict=True))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from docclass.metrics import classification_scores

        rows = [self._rows]
        if torch.distributed.is_initialized():
            rows = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(rows, self._rows)
        once = {index: (pred, label, loss) for part in rows for index, pred, label, loss in part}
        n = pl_module.hparams.num_classes
        matrix = np.zeros((n, n), dtype=int)
        for pred, label, _ in once.values():
            matrix[label, pred] += 1
        scores = classification_scores(matrix)
        self._recomputed = {
            "recomputed/val_documents": len(once),
            "recomputed/val_acc": scores["accuracy"],
            "recomputed/val_f1": scores["macro_f1"],
            "recomputed/val_loss": float(np.mean([loss for _, _, loss in once.values()])),
        }

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        seen = {key: float(value) for key, value in trainer.callback_metrics.items()}
        seen.update(getattr(self, "_recomputed", {}))
        path = Path(trainer.default_root_dir) / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(seen))


class RankRandomState(pl.Callback):
    """Each batch, rank r draws r + 1 random numbers, as ranks whose batches differ in shape
    do: their generators part ways."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        torch.rand(trainer.global_rank + 1)


LONG = "The striker scored twice in the second half and the crowd roared. " * 40


def write_every_input_kind(root: Path) -> Path:
    """Every input ``docclass classify`` reads, good and bad: nested folders (a hidden one),
    empty, Latin-1 and binary files, a document longer than the tiny model reads, and CSV,
    JSON Lines and Parquet tables with a row that lacks its ``body``."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "folder" / "nested").mkdir(parents=True)
    (root / "folder" / "a.txt").write_text("Shares rose after profits beat forecasts.")
    (root / "folder" / "nested" / "b.txt").write_text("Film wins award at festival.")
    (root / "folder" / ".hidden").mkdir()
    (root / "folder" / ".hidden" / "skip.txt").write_text("never read")
    (root / "empty.txt").write_text("  \n\t ")
    (root / "latin1.txt").write_bytes("Chelsea pay £5m for striker".encode("latin-1"))
    (root / "binary.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "long.txt").write_text(LONG)
    with open(root / "rows.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["body", "label"])
        writer.writerows([["Election campaign speech", "politics"], ["", "x"]])
    (root / "rows.jsonl").write_text(
        json.dumps({"body": "New phone chips"}) + "\n" + json.dumps({"title": "no body"}) + "\n"
    )
    pq.write_table(pa.table({"body": ["Bank rates held", None]}), root / "rows.parquet")
    return root
