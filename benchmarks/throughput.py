"""``make bench``: docclass beside the usual way of doing it, measured in one run.

Training: docclass (length-bucketed batches, fused attention) against a model of the same size
built from ``torch.nn.TransformerEncoder`` — once with batches padded to the token limit, the way
most tutorials do it, and once with docclass's own bucketed batches, which separates what the
batching buys from what the implementation buys. Every timing is a median over rounds that
interleave the contenders, so a slow spell of a noisy machine falls on all of them; ratios are
taken within the run. Inference: documents per second for classification alone, with every
word's pool attention, and with the report's full word scores. Anchors: TF-IDF + linear SVM and
fastText (bigrams) trained and tested on the very same split.
"""

from __future__ import annotations

import copy
import functools
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from docclass.data.batching import collate, padding_efficiency
from docclass.train.datamodule import DocDataModule
from docclass.train.lightning_cli import training_cli
from docclass.train.lit_module import DocClassifierModule

# The ways classify ran before its 2,048-token CPU batches and folded pool, kept side by side.
BEFORE_CALL = "float32, as before (batches of 64 documents, every token's pool key and value)"
BEFORE_PREDICT = "labels and probabilities, as before (batches of 64 documents, unfolded pool)"


class PaddedTransformerEncoder(nn.Module):
    """The tutorial model: embeddings + learned positions + ``nn.TransformerEncoder`` + masked
    mean pool + linear read-out, at docclass's width, heads, depth and feed-forward size."""

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        d_model: int,
        n_heads: int,
        n_layers: int,
        ffn_mult: int,
        dropout: float,
        max_tokens: int,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.positions = nn.Embedding(max_tokens, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, ffn_mult * d_model, dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        states = self.encoder(
            self.embed(input_ids) + self.positions(positions), src_key_padding_mask=~mask
        )
        weights = mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.head(pooled)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


@contextmanager
def peak_memory(device: torch.device) -> Iterator[dict[str, float]]:
    """Peak memory growth inside the block, in MiB: CUDA's allocator, or sampled process RSS."""
    figures: dict[str, float] = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield figures
        torch.cuda.synchronize(device)
        figures["peak_mib"] = (torch.cuda.max_memory_allocated(device) - start) / 2**20
        return
    start, peak, running = _rss_bytes(), [0], [True]

    def sample() -> None:
        while running[0]:
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield figures
    finally:
        running[0] = False
        sampler.join()
        figures["peak_mib"] = max(0, peak[0] - start) / 2**20


def _pad_to(batch: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
    """The batch padded to ``width`` tokens, the way a fixed-length pipeline feeds it."""
    extra = width - batch["input_ids"].shape[1]
    if extra <= 0:
        return batch
    input_ids = F.pad(batch["input_ids"], (0, extra), value=0)
    return {**batch, "input_ids": input_ids, "attention_mask": input_ids != 0}


def _train_steps(
    step: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    parameters: list[nn.Parameter],
    batches: list[dict[str, torch.Tensor]],
    device: torch.device,
    precision: str,
) -> dict[str, float]:
    optimizer = torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.01)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    # Counted before the clock starts: a count inside the loop would wait for a GPU every step.
    real = sum(int(batch["attention_mask"].sum()) for batch in batches)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # earlier work queued on the GPU is not timed here
    with peak_memory(device) as memory:
        started = time.perf_counter()
        for batch in batches:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast:
                loss = step(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "real_tokens": real,
        "real_tokens_per_s": real / seconds,
        "peak_mib": memory["peak_mib"],
    }


def load_config_datamodule(config_path: str | Path) -> tuple[DocDataModule, dict[str, Any]]:
    """The config's data module, prepared (tokenizer trained, splits made), and its model
    settings, both read by LightningCLI's own parser."""
    cli = training_cli(["--config", str(config_path), "--trainer.logger", "false"], run=False)
    cli.datamodule.prepare()
    model = cli.config["model"].as_dict()
    # Linked from the data when the module is built: callers pass the prepared data's sizes.
    for linked in ("vocab_size", "num_classes"):
        model.pop(linked, None)
    return cli.datamodule, model


def training_throughput(
    datamodule: DocDataModule,
    model_section: dict[str, Any],
    steps: int = 8,
    rounds: int = 3,
    device: str = "cpu",
    precision: str = "32",
    seed: int = 0,
) -> dict[str, Any]:
    """docclass against two ``nn.TransformerEncoder`` set-ups, ``steps`` optimiser steps each."""
    torch.manual_seed(seed)
    target = torch.device(device)
    module = DocClassifierModule(
        **model_section, num_classes=datamodule.num_classes, vocab_size=datamodule.vocab_size
    ).to(target)
    module.train()
    config = module.config
    max_tokens = datamodule.max_tokens or 1024
    baseline = PaddedTransformerEncoder(
        config.vocab_size,
        config.num_classes,
        config.d_model,
        config.n_heads,
        max(1, config.n_layers),
        config.ffn_mult,
        config.dropout,
        max_tokens,
    ).to(target)
    baseline.train()
    # The same model without dropout on the attention weights (docclass's default): on CPU the
    # fused attention kernel refuses dropout, so this isolates what that costs.
    no_attn_dropout = copy.deepcopy(baseline)
    for layer in no_attn_dropout.encoder.layers:
        layer.self_attn.dropout = 0.0

    bucketed = list(datamodule.train_dataloader())
    # Tutorial batches: documents in random order, every batch padded to the token limit.
    train = datamodule.tokenized("train")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
    size = datamodule.batch_size
    shuffled = [
        _pad_to(collate([train[i] for i in order[start : start + size]]), max_tokens)
        for start in range(0, len(order), size)
    ]
    smoothing = module.hparams.label_smoothing

    def docclass_step(batch):
        return module._shared_step(batch)[0]

    def step_of(model: nn.Module) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
        def step(batch):
            logits = model(batch["input_ids"], batch["attention_mask"])
            return F.cross_entropy(logits.float(), batch["labels"], label_smoothing=smoothing)

        return step

    contenders = {
        "docclass": (docclass_step, list(module.parameters()), bucketed),
        "nn.TransformerEncoder, padded to the token limit": (
            step_of(baseline),
            list(baseline.parameters()),
            shuffled,
        ),
        "nn.TransformerEncoder, docclass's bucketed batches": (
            step_of(baseline),
            list(baseline.parameters()),
            bucketed,
        ),
        "nn.TransformerEncoder, bucketed batches, no attention dropout": (
            step_of(no_attn_dropout),
            list(no_attn_dropout.parameters()),
            bucketed,
        ),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for step, parameters, batches in contenders.values():  # warm-up, not timed
        _train_steps(step, parameters, batches[:1], target, precision)
    for round_index in range(rounds):
        for name, (step, parameters, batches) in contenders.items():
            # Each round takes the next ``steps`` batches, the same for every contender that
            # shares a batch order.
            start = (round_index * steps) % max(1, len(batches) - steps)
            results[name].append(
                _train_steps(step, parameters, batches[start : start + steps], target, precision)
            )
    epoch_real_tokens = sum(int(b["attention_mask"].sum()) for b in bucketed)
    summary = {}
    for name, runs in results.items():
        tokens_per_s = statistics.median(r["real_tokens_per_s"] for r in runs)
        summary[name] = {
            "real_tokens_per_s": round(tokens_per_s, 1),
            # Over a whole epoch of the contender's batches, not only the timed ones.
            "padding_efficiency": round(padding_efficiency(contenders[name][2]), 4),
            "seconds_per_epoch": round(epoch_real_tokens / tokens_per_s, 1),
            "peak_memory_mib": round(max(r["peak_mib"] for r in runs), 1),
            "rounds_real_tokens_per_s": [round(r["real_tokens_per_s"], 1) for r in runs],
        }
    docclass_speed = summary["docclass"]["real_tokens_per_s"]
    for name in summary:
        summary[name]["docclass_speed_ratio"] = round(
            docclass_speed / summary[name]["real_tokens_per_s"], 2
        )
    return {
        "device": str(target),
        "precision": precision,
        "steps_per_round": steps,
        "rounds": rounds,
        "batch_size": size,
        "max_tokens": max_tokens,
        "parameters": {
            "docclass": parameter_count(module.model),
            "nn.TransformerEncoder": parameter_count(baseline),
        },
        "epoch_real_tokens": epoch_real_tokens,
        "contenders": summary,
    }


def interleaved_seconds(
    ways: dict[str, Callable[[], Any]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Run every way once per round, rounds interleaved so a slow spell of the machine falls
    on all of them: each way's seconds per round, and what its last run returned."""
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    results: dict[str, Any] = {}
    for _ in range(rounds):
        for name, run in ways.items():
            started = time.perf_counter()
            results[name] = run()
            seconds[name].append(time.perf_counter() - started)
    return seconds, results


def inference_throughput(
    ckpt: str, texts: list[str], rounds: int = 3, batch_size: int = 64, device: str = "cpu"
) -> dict[str, Any]:
    """Documents per second: labels only (and as before: batches of 64 documents whatever
    their length, every token's pool key and value projected), + every word's pool attention,
    + every word's class contribution, + the report's scores."""
    from docclass.inference.classifier import DocClassifier
    from docclass.interpret.explain import explain_documents

    classifier = DocClassifier.load(ckpt, device=device)
    before = DocClassifier.load(ckpt, device=device)
    before.trained.model.pool.fold_without_grad = False
    ways: dict[str, Callable[[], Any]] = {
        BEFORE_PREDICT: lambda: before.predict(texts, batch_size, batch_tokens=0),
        "labels and probabilities": lambda: classifier.predict(texts, batch_size),
        "+ pool attention per word": lambda: classifier.predict(
            texts, batch_size, word_scores=True, method="attention"
        ),
        "+ class contribution per word": lambda: classifier.predict(
            texts, batch_size, word_scores=True, method="contribution"
        ),
        "+ the report's word scores (all methods)": lambda: explain_documents(
            classifier.trained, texts, batch_size=batch_size, device=classifier.device
        ),
    }
    classifier.predict(texts[:batch_size], batch_size)  # warm-up
    seconds, _ = interleaved_seconds(ways, rounds)
    base = statistics.median(seconds["labels and probabilities"])
    return {
        "documents": len(texts),
        "batch_size": batch_size,
        "ways": {
            name: {
                "documents_per_s": round(len(texts) / statistics.median(times), 1),
                "time_vs_labels_only": round(statistics.median(times) / base, 2),
            }
            for name, times in seconds.items()
        },
    }


def _classify_with(
    model: torch.nn.Module,
    documents: list,
    batch_size: int,
    context: Callable[[], Any],
    batch_tokens: int | None = None,
) -> torch.Tensor:
    """Class probabilities ``[N,C]`` for encoded documents, through ``model``'s forward."""
    from docclass.interpret.inputs import forward_batches

    probs: list[torch.Tensor | None] = [None] * len(documents)
    with context():
        for indices, out in forward_batches(model, documents, batch_size, "cpu", batch_tokens):
            batch = torch.softmax(out.logits.float(), dim=-1)
            for row, i in enumerate(indices):
                probs[i] = batch[row]
    return torch.stack(probs)  # type: ignore[arg-type]


def _unfolded(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose pool projects every token's key and value, as before."""
    explicit = copy.deepcopy(model)
    explicit.pool.fold_without_grad = False
    return explicit


def inference_options(
    ckpt: str,
    texts: list[str],
    labels: list[str],
    rounds: int = 3,
    batch_size: int = 64,
) -> dict[str, Any]:
    """``classify``'s model call on the CPU: as before (batches of 64 documents whatever their
    length, every token's pool key and value projected), the default (2,048-token batches, the
    folded pool), each change alone, and what might make it faster still: ``torch.compile``
    (dynamic shapes), dynamic int8 quantisation of every linear layer, bfloat16 autocast.
    Interleaved rounds, medians; each way's accuracy and its largest probability difference
    from the way before on the same documents (tokenized once, outside the timing, as
    ``classify`` does before its model calls)."""
    import contextlib

    from docclass.inference.classifier import DocClassifier
    from docclass.interpret.inputs import encode_documents

    classifier = DocClassifier.load(ckpt, device="cpu")
    documents = encode_documents(classifier.trained.tokenizer, texts, classifier.max_tokens)
    base = classifier.trained.model.eval()
    started = time.perf_counter()
    compiled = torch.compile(copy.deepcopy(base), dynamic=True)
    _classify_with(compiled, documents, batch_size, torch.no_grad)  # compiles every shape seen
    compile_s = time.perf_counter() - started
    quantised = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(base), {nn.Linear}, dtype=torch.qint8
    )
    plain = contextlib.nullcontext
    options: dict[str, tuple[nn.Module, Callable[[], Any], int | None]] = {
        BEFORE_CALL: (_unfolded(base), plain, 0),
        "float32 (default: 2,048-token batches, folded pool)": (base, plain, None),
        "float32, 2,048-token batches alone": (_unfolded(base), plain, None),
        "float32, folded pool alone": (base, plain, 0),
        "torch.compile": (compiled, plain, None),
        "int8 dynamic (linear layers)": (quantised, plain, None),
        "bfloat16 autocast": (base, lambda: torch.autocast("cpu", dtype=torch.bfloat16), None),
    }
    ways = {
        name: functools.partial(_classify_with, model, documents, batch_size, context, tokens)
        for name, (model, context, tokens) in options.items()
    }
    seconds, probs = interleaved_seconds(ways, rounds)
    names = classifier.labels
    reference = probs[BEFORE_CALL]
    before_s = statistics.median(seconds[BEFORE_CALL])
    results = {}
    for name, times in seconds.items():
        predicted = [names[i] for i in probs[name].argmax(dim=-1).tolist()]
        right = sum(p == t for p, t in zip(predicted, labels, strict=True))
        results[name] = {
            "documents_per_s": round(len(texts) / statistics.median(times), 1),
            "speed_vs_before": round(before_s / statistics.median(times), 2),
            "accuracy": round(right / len(labels), 4),
            "max_probability_difference": float((probs[name] - reference).abs().max()),
        }
    return {"documents": len(texts), "compile_s": round(compile_s, 1), "options": results}


def encoder_batching_speed(
    config_path: str | Path = "configs/minilm.yaml", rounds: int = 3, batch_size: int = 64
) -> dict[str, Any]:
    """The pre-trained-encoder recipe's network on its corpus's validation + test documents,
    batches of 64 documents against 2,048-token batches (the CPU default). Its pool and read-out
    are untrained: the time of a forward pass does not depend on their values."""
    import contextlib

    from docclass.interpret.inputs import encode_documents

    datamodule, model_section = load_config_datamodule(config_path)
    torch.manual_seed(0)
    model = DocClassifierModule(
        **model_section, num_classes=datamodule.num_classes, vocab_size=datamodule.vocab_size
    ).model.eval()
    texts = [text for split in ("val", "test") for text in datamodule.splits[split]["text"]]
    documents = encode_documents(datamodule.tokenizer, texts, datamodule.max_tokens)
    limits = {"batches of 64 documents (before)": 0, "2,048-token batches (default)": None}
    ways = {
        name: functools.partial(
            _classify_with, model, documents, batch_size, contextlib.nullcontext, tokens
        )
        for name, tokens in limits.items()
    }
    seconds, _ = interleaved_seconds(ways, rounds)
    before_s = statistics.median(seconds["batches of 64 documents (before)"])
    return {
        "config": str(config_path),
        "documents": len(texts),
        "max_tokens": datamodule.max_tokens,
        "ways": {
            name: {
                "documents_per_s": round(len(texts) / statistics.median(times), 1),
                "speed_vs_before": round(before_s / statistics.median(times), 2),
            }
            for name, times in seconds.items()
        },
    }


def fasttext_anchor(datamodule: DocDataModule, epochs: tuple[int, ...] = (5, 25, 50)):
    """fastText with word bigrams; the epoch count chosen on validation, then tested once.

    Returns ``None`` when the optional ``fasttext`` module (the ``bench`` extra) is missing.
    """
    try:
        import fasttext
    except ImportError:
        return None
    import tempfile

    splits = {name: datamodule.splits[name] for name in ("train", "val", "test")}
    names = datamodule.label_names

    def line(text: str) -> str:
        return " ".join(text.lower().split())

    with tempfile.TemporaryDirectory() as workdir:
        train_file = Path(workdir) / "train.txt"
        train_file.write_text(
            "".join(
                f"__label__{label} {line(text)}\n"
                for text, label in zip(
                    splits["train"]["text"], splits["train"]["label"], strict=True
                )
            )
        )

        def fit(epoch: int):
            started = time.perf_counter()
            model = fasttext.train_supervised(
                str(train_file), wordNgrams=2, epoch=epoch, lr=0.5, dim=100, verbose=0, seed=0
            )
            return model, time.perf_counter() - started

        def accuracy(model, split) -> tuple[float, float]:
            started = time.perf_counter()
            # The low-level predict: fastText 0.9's Python wrapper breaks under NumPy 2.
            predicted = [int(model.f.predict(line(t) + "\n", 1, 0.0, "strict")[0][1][9:])
                         for t in split["text"]]  # fmt: skip
            seconds = time.perf_counter() - started
            correct = sum(p == y for p, y in zip(predicted, split["label"], strict=True))
            return correct / len(predicted), len(predicted) / seconds

        by_epoch = {}
        for epoch in epochs:
            model, _ = fit(epoch)
            by_epoch[epoch] = accuracy(model, splits["val"])[0]
        best = max(epochs, key=lambda e: (by_epoch[e], -e))
        model, fit_seconds = fit(best)
        test_acc, docs_per_s = accuracy(model, splits["test"])
    return {
        "val_acc_by_epochs": by_epoch,
        "chosen_epochs": best,
        "test_acc": test_acc,
        "fit_s": round(fit_seconds, 2),
        "test_documents_per_s": round(docs_per_s, 1),
        "labels": len(names),
    }


def bench_markdown(figures: dict[str, Any]) -> str:
    """``reports/bench.md``: the tables the README quotes."""
    machine = figures["machine"]
    training = figures["training"]
    lines = [
        "# docclass benchmark",
        "",
        f"Machine: {machine['processor']}, {machine['cpu_count']} CPU cores, torch "
        f"{machine['torch']} ({machine['torch_threads']} threads), "
        f"GPU: {machine['cuda'] or 'none'}. "
        f"Command: `{figures['command']}`.",
        "",
        f"## Training ({training['device']}, precision {training['precision']}, "
        f"{training['steps_per_round']} optimiser steps × {training['rounds']} interleaved rounds, "
        f"batches of {training['batch_size']}, token limit {training['max_tokens']})",
        "",
        f"Same width, heads, depth and feed-forward size: docclass "
        f"{training['parameters']['docclass']:,} parameters, nn.TransformerEncoder model "
        f"{training['parameters']['nn.TransformerEncoder']:,} (learned positions). Real tokens "
        f"are non-padding subword tokens ({training['epoch_real_tokens']:,} per epoch).",
        "",
        "| model | real tokens/s (median) | docclass speed ÷ this | padding efficiency "
        "| s per epoch | peak memory growth (MiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in training["contenders"].items():
        lines.append(
            f"| {name} | {row['real_tokens_per_s']:,.0f} | {row['docclass_speed_ratio']}× "
            f"| {row['padding_efficiency']:.1%} | {row['seconds_per_epoch']} "
            f"| {row['peak_memory_mib']} |"
        )
    inference = figures.get("inference")
    if inference:
        lines += [
            "",
            f"## Inference ({inference['documents']} BBC validation + test articles, batches of "
            f"{inference['batch_size']}, median of {figures['rounds']})",
            "",
            "| output | documents/s | time ÷ labels only |",
            "| --- | --- | --- |",
        ]
        for name, row in inference["ways"].items():
            lines.append(f"| {name} | {row['documents_per_s']} | {row['time_vs_labels_only']}× |")
    anchors = figures["anchors"]
    lines += [
        "",
        "## Accuracy on the same split (BBC, split seed 0, 213 test articles)",
        "",
        "| model | test accuracy | train time | documents/s (test) |",
        "| --- | --- | --- | --- |",
    ]
    for row in anchors:
        lines.append(
            f"| {row['model']} | {row['test_acc']} | {row['train']} | {row['documents_per_s']} |"
        )
    return "\n".join(lines) + "\n"


def classic_anchors(datamodule: DocDataModule) -> list[dict[str, Any]]:
    """TF-IDF + linear SVM and (when installed) fastText on the data module's split: one row
    each with ``model``, ``test_acc``, ``fit_s``, ``documents_per_s`` and the full ``figures``."""
    from benchmarks.anchors import tfidf_svm_anchor

    svm = tfidf_svm_anchor(datamodule)
    rows = [
        {
            "model": "TF-IDF (1–2-grams) + linear SVM",
            "test_acc": svm["test_acc"],
            "fit_s": svm["fit_s"],
            "documents_per_s": round(svm["test_documents_per_s"], 1),
            "figures": svm,
        }
    ]
    fast = fasttext_anchor(datamodule)
    if fast is None:
        print("fastText not installed (pip install -e '.[bench]'); its row is left out")
    else:
        rows.append(
            {
                "model": f"fastText, bigrams ({fast['chosen_epochs']} epochs, chosen on val)",
                "test_acc": fast["test_acc"],
                "fit_s": fast["fit_s"],
                "documents_per_s": fast["test_documents_per_s"],
                "figures": fast,
            }
        )
    return rows
