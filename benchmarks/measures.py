"""Measurements the docs quote, run by thin scripts in ``scripts/`` (never by unit tests)."""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from docclass.data.sources import SourceSpec, load_source


def write_generated_corpus(path: Path, n_documents: int, words_per_document: int) -> None:
    """A JSONL corpus of ``n_documents`` made by cycling through BBC article openings."""
    texts = load_source(SourceSpec("bbc")).splits["train"]["text"]
    openings = [" ".join(text.split()[:words_per_document]) for text in texts]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(n_documents):
            handle.write(json.dumps({"text": openings[i % len(openings)]}) + "\n")


def classify_memory(
    ckpt: str, sizes: list[int], words_per_document: int = 40, batch_size: int = 64
) -> dict[str, Any]:
    """Peak resident memory of ``docclass classify`` over generated corpora of each size.

    Each size runs in a fresh process (``getrusage`` of children gives its peak RSS), so the
    figures are comparable: flat memory means the peak does not grow with the corpus.
    """
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        for size in sizes:
            corpus = Path(workdir) / f"corpus-{size}.jsonl"
            write_generated_corpus(corpus, size, words_per_document)
            out = Path(workdir) / "out.jsonl"
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "docclass.cli", "classify", "--ckpt", ckpt, str(corpus),
                 "--out", str(out), "--device", "cpu", "--batch_size", str(batch_size),
                 "--progress", "false"],
                check=True,
                capture_output=True,
            )  # fmt: skip
            seconds = time.perf_counter() - started
            peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            with open(out, encoding="utf-8") as handle:
                rows = sum(1 for _ in handle)
            runs.append(
                {
                    "documents": size,
                    "rows_out": rows,
                    "seconds": round(seconds, 1),
                    "documents_per_s": round(size / seconds, 1),
                    # ru_maxrss of children is the maximum over all of them so far; sizes run in
                    # increasing order, so a flat pipeline shows the same figure every time.
                    "peak_rss_mib": round(peak_kib / 1024, 1),
                    "peak_grew": peak_kib > before,
                }
            )
            corpus.unlink()
    return {"checkpoint": ckpt, "words_per_document": words_per_document, "runs": runs}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def _load_round(
    ckpt: str, texts: list[str], clients: int, requests_per_client: int, setting: dict[str, Any]
) -> dict[str, Any]:
    """One server process, ``clients`` threads each sending requests back to back."""
    import http.client
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.server import HOST, post_json, running_server

    extra_args = ["--device", "cpu", *setting.get("args", [])]
    with running_server(ckpt, extra_args=extra_args, env=setting.get("env")) as port:
        for text in texts[:clients]:  # warm-up: first calls pay for lazy initialisation
            post_json(port, {"texts": [text]})

        def client(index: int) -> list[tuple[float, bool]]:
            connection = http.client.HTTPConnection(HOST, port, timeout=120)
            outcomes = []
            for k in range(requests_per_client):
                text = texts[(index * requests_per_client + k) % len(texts)]
                started = time.perf_counter()
                try:
                    status, body = post_json(port, {"texts": [text]}, connection=connection)
                    ok = status == 200 and body["results"][0].get("label") is not None
                except (OSError, http.client.HTTPException, ValueError):
                    connection.close()
                    connection = http.client.HTTPConnection(HOST, port, timeout=120)
                    ok = False
                outcomes.append((time.perf_counter() - started, ok))
            connection.close()
            return outcomes

        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            outcomes = [o for per_client in pool.map(client, range(clients)) for o in per_client]
        seconds = time.perf_counter() - started
    latencies_ms = [latency * 1000 for latency, _ in outcomes]
    return {
        "requests": len(outcomes),
        "errors": sum(1 for _, ok in outcomes if not ok),
        "seconds": round(seconds, 2),
        "requests_per_s": round(len(outcomes) / seconds, 1),
        "latency_ms": {
            "p50": round(_percentile(latencies_ms, 50), 1),
            "p95": round(_percentile(latencies_ms, 95), 1),
            "p99": round(_percentile(latencies_ms, 99), 1),
            "max": round(max(latencies_ms), 1),
        },
    }


def serve_load(
    ckpt: str,
    texts: list[str],
    clients: int = 8,
    requests_per_client: int = 100,
    server_settings: dict[str, dict[str, Any]] | None = None,
    rounds: int = 3,
) -> dict[str, Any]:
    """A bounded load test of ``docclass serve``: every client sends its requests back to back.

    Each setting (``{"args": [...], "env": {...}}`` for the server) gets a fresh server process
    per round, and rounds interleave the settings (A B C A B C …), so slow spells of a noisy
    machine fall on all of them; figures are medians over rounds, compared as ratios. One
    document per request, with the default response (label, probabilities, every word's pool
    attention).
    """
    settings = server_settings or {"default": {}}
    per_setting: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name, setting in settings.items():
            per_setting[name].append(
                _load_round(ckpt, texts, clients, requests_per_client, setting)
            )
    runs = []
    for name, results in per_setting.items():
        runs.append(
            {
                "setting": name,
                "server_args": settings[name].get("args", []),
                "server_env": settings[name].get("env", {}),
                "requests": sum(r["requests"] for r in results),
                "errors": sum(r["errors"] for r in results),
                "requests_per_s": statistics.median(r["requests_per_s"] for r in results),
                "latency_ms": {
                    key: statistics.median(r["latency_ms"][key] for r in results)
                    for key in ("p50", "p95", "p99", "max")
                },
                "rounds": results,
            }
        )
    return {
        "checkpoint": ckpt,
        "clients": clients,
        "requests_per_client": requests_per_client,
        "rounds": rounds,
        "documents_per_request": 1,
        "mean_document_characters": round(sum(map(len, texts)) / len(texts)),
        "runs": runs,
    }


def batching_speed(ckpt: str, texts: list[str], group: int = 8, repeats: int = 3) -> dict[str, Any]:
    """Forward passes per second for groups of ``group`` documents, three ways, interleaved.

    ``one at a time``: a forward pass per document; ``one padded batch``: the group padded to
    its longest; ``length_batches``: the group split into batches of similar length. The
    groups are what a server sees: consecutive documents of mixed length.
    """
    import torch

    from docclass.artifacts.load import load_classifier
    from docclass.data.batching import length_batches, pad_token_ids
    from docclass.interpret.inputs import SIMILAR_LENGTH, encode_documents

    classifier = load_classifier(ckpt)
    model = classifier.model.eval()
    limit = classifier.max_tokens
    ids = [d.token_ids for d in encode_documents(classifier.tokenizer, texts, limit)]
    ids = [row for row in ids if row]
    groups = [ids[i : i + group] for i in range(0, len(ids) - group + 1, group)]
    pad_id = model.config.pad_id

    def run(batches_of: Any) -> None:
        for rows in groups:
            for batch in batches_of(rows):
                model(*pad_token_ids(batch, pad_id))

    ways = {
        "one at a time": lambda rows: [[row] for row in rows],
        "one padded batch": lambda rows: [rows],
        "length_batches": lambda rows: [
            [rows[i] for i in g]
            for g in length_batches(
                [len(r) for r in rows], len(rows), similar_length=SIMILAR_LENGTH
            )
        ],
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    with torch.inference_mode():
        run(ways["one padded batch"])  # warm-up
        for _ in range(repeats):
            for name, batches_of in ways.items():
                started = time.perf_counter()
                run(batches_of)
                seconds[name].append(time.perf_counter() - started)
    n_documents = len(groups) * group
    baseline = statistics.median(seconds["one at a time"])
    return {
        "checkpoint": ckpt,
        "documents": n_documents,
        "group": group,
        "mean_tokens": round(sum(len(r) for g in groups for r in g) / n_documents, 1),
        "torch_threads": torch.get_num_threads(),
        "ways": {
            name: {
                "documents_per_s": round(n_documents / statistics.median(times), 1),
                "speed_vs_one_at_a_time": round(baseline / statistics.median(times), 2),
            }
            for name, times in seconds.items()
        },
    }


def attention_scaling(
    lengths: list[int],
    window: int = 64,
    d_model: int = 128,
    n_heads: int = 4,
    batch: int = 4,
    repeats: int = 3,
) -> dict[str, Any]:
    """Training-step time and peak memory of one block, full vs windowed attention, per length.

    The default model's block at each length (random tokens: speed does not depend on them),
    forward + backward, interleaved and repeated; memory is the process RSS growth, sampled.
    """
    import torch

    from benchmarks.throughput import peak_memory
    from docclass.nn.model import DocumentClassifier, ModelConfig

    def model_for(attention_window: int) -> DocumentClassifier:
        torch.manual_seed(0)
        config = ModelConfig(
            vocab_size=20_000, num_classes=5, d_model=d_model, n_heads=n_heads, n_layers=1,
            pool_heads=n_heads, attention_window=attention_window,
        )  # fmt: skip
        return DocumentClassifier(config).train()

    models = {"full attention": model_for(0), f"window {window}": model_for(window)}
    rows = []
    for length in lengths:
        ids = torch.randint(1, 20_000, (batch, length))
        mask = torch.ones_like(ids, dtype=torch.bool)
        times: dict[str, list[float]] = {name: [] for name in models}
        memory: dict[str, float] = {}
        for model in models.values():  # warm-up
            model(ids, mask).logits.sum().backward()
        for _ in range(repeats):
            for name, model in models.items():
                with peak_memory(torch.device("cpu")) as peak:
                    started = time.perf_counter()
                    model(ids, mask).logits.sum().backward()
                    times[name].append(time.perf_counter() - started)
                memory[name] = max(memory.get(name, 0.0), peak["peak_mib"])
                model.zero_grad(set_to_none=True)
        row: dict[str, Any] = {"tokens": length}
        for name in models:
            seconds = statistics.median(times[name])
            row[name] = {
                "ms_per_step": round(seconds * 1000, 1),
                "tokens_per_s": round(batch * length / seconds),
                "peak_mib": round(memory[name], 1),
            }
        row["full / window time"] = round(
            row["full attention"]["ms_per_step"] / row[f"window {window}"]["ms_per_step"], 2
        )
        rows.append(row)
    return {"batch": batch, "d_model": d_model, "heads": n_heads, "window": window, "rows": rows}


def streaming_speed(
    config: str = "configs/bbc.yaml",
    shards: int = 4,
    max_batch_tokens: int = 16384,
    rounds: int = 3,
    train_steps: int = 12,
) -> dict[str, Any]:
    """The streamed training path against the in-memory one on the BBC training split.

    The split is written as JSONL shards; per round (interleaved), each way reads one epoch of
    batches — the streamed ways tokenizing as they go — and is timed, with its padding
    efficiency. Then ``train_steps`` optimiser steps of the config's model on each way's
    first batches give real tokens per second, where the padding shows.
    """
    import functools

    import torch

    from benchmarks.throughput import load_config_datamodule
    from docclass.data.batching import collate, padding_efficiency
    from docclass.data.streaming import StreamedBatches, open_stream
    from docclass.data.tokenizer import encode_batch
    from docclass.train.callbacks import machine_summary
    from docclass.train.lit_module import DocClassifierModule

    datamodule, model_section = load_config_datamodule(config)
    datamodule.prepare()
    train = datamodule.splits["train"]
    names = datamodule.label_names
    tokenizer = datamodule.tokenizer
    with tempfile.TemporaryDirectory() as workdir:
        for shard in range(shards):
            with open(Path(workdir) / f"train-{shard}.jsonl", "w", encoding="utf-8") as handle:
                for i in range(shard, len(train), shards):
                    row = {"text": train[i]["text"], "label": names[train[i]["label"]]}
                    handle.write(json.dumps(row) + "\n")

        def streamed(bucket_documents: int, budget: int | None) -> StreamedBatches:
            return StreamedBatches(
                lambda: open_stream(str(Path(workdir) / "train-*.jsonl")),
                lambda texts: [e.ids for e in encode_batch(tokenizer, texts)],
                {name: i for i, name in enumerate(names)},
                functools.partial(collate, pad_to_multiple=1),
                datamodule.max_tokens,
                datamodule.batch_size,
                budget,
                bucket_documents,
            )

        ways = {
            "in memory (pre-tokenized, length-bucketed)": datamodule.train_dataloader,
            f"streamed, buckets of 2,000 documents, budget {max_batch_tokens:,} tokens": (
                lambda: streamed(2000, max_batch_tokens)
            ),
            "streamed, buckets of 2,000 documents, 32 documents per batch": (
                lambda: streamed(2000, None)
            ),
            "streamed, no bucketing (buffer = one batch)": (
                lambda: streamed(datamodule.batch_size, None)
            ),
        }
        datamodule.tokenized("train")  # the in-memory way's one-off tokenization, not timed
        epochs: dict[str, list[float]] = {name: [] for name in ways}
        batches: dict[str, list] = {}
        for _ in range(rounds):
            for name, make in ways.items():
                started = time.perf_counter()
                batches[name] = list(make())
                epochs[name].append(time.perf_counter() - started)

        torch.manual_seed(0)
        module = DocClassifierModule(
            **model_section, num_classes=len(names),
            vocab_size=tokenizer.get_vocab_size(),
        )  # fmt: skip
        module.train()
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
        step_seconds: dict[str, list[float]] = {name: [] for name in ways}
        real_tokens = {}
        for _ in range(rounds):
            for name in ways:
                chosen = batches[name][:train_steps]
                real_tokens[name] = sum(int(b["attention_mask"].sum()) for b in chosen)
                started = time.perf_counter()
                for batch in chosen:
                    loss = module._shared_step(batch)[0]
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                step_seconds[name].append(time.perf_counter() - started)

    reference = next(iter(ways))
    rows = {}
    for name in ways:
        epoch_s = statistics.median(epochs[name])
        train_s = statistics.median(step_seconds[name])
        rows[name] = {
            "batches_per_epoch": len(batches[name]),
            "documents_per_epoch": sum(len(b["labels"]) for b in batches[name]),
            "padding_efficiency": round(padding_efficiency(batches[name]), 4),
            "epoch_read_s": round(epoch_s, 2),
            "documents_read_per_s": round(len(train) / epoch_s, 1),
            "train_real_tokens_per_s": round(real_tokens[name] / train_s),
        }
    for row in rows.values():
        row["train_speed_vs_in_memory"] = round(
            row["train_real_tokens_per_s"] / rows[reference]["train_real_tokens_per_s"], 2
        )
    return {
        "config": config,
        "train_documents": len(train),
        "shards": shards,
        "rounds": rounds,
        "train_steps": train_steps,
        "ways": rows,
        "torch_threads": torch.get_num_threads(),
        "machine": machine_summary(),
    }


def time_report(
    ckpt: str,
    data: str,
    split: str = "test",
    repeats: int = 3,
    device: str = "cpu",
    faithfulness_documents: int | None = None,
) -> dict[str, Any]:
    """Median seconds to explain ``data`` and write its report, over ``repeats`` runs
    (faithfulness and counterfactuals on a class-stratified sample of
    ``faithfulness_documents`` when given, as the after-fit report of such a config does).

    Loading the checkpoint and the documents is timed once, apart: it is the same for any
    report and does not grow with the number of methods.
    """
    import torch

    from docclass.artifacts.load import load_classifier
    from docclass.inference.reporting import load_documents, make_report
    from docclass.train.callbacks import machine_summary

    started = time.perf_counter()
    classifier = load_classifier(ckpt)
    documents = load_documents(data, ckpt, split)
    load_s = time.perf_counter() - started
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            runs.append(
                make_report(
                    classifier,
                    documents,
                    out,
                    device=device,
                    faithfulness_documents=faithfulness_documents,
                )
            )
    words = sum(len(text.split()) for text in documents.texts)
    return {
        "checkpoint": str(ckpt),
        "data": documents.description,
        "documents": len(documents.texts),
        "whitespace_words": words,
        "methods": "attention (mean + every head), contribution, rollout, gradient x input, "
        "relevance propagation; ERASER comprehensiveness and sufficiency of each, masked "
        "removal; counterfactuals by the default method and agreement between methods",
        "faithfulness_documents": faithfulness_documents or len(documents.texts),
        "repeats": repeats,
        "load_s": round(load_s, 2),
        **{
            f"median_{key}": round(statistics.median(run[key] for run in runs), 2)
            for key in (
                "explain_s",
                "faithfulness_s",
                "counterfactuals_and_agreement_s",
                "pages_s",
                "total_s",
            )
        },
        "all_total_s": [run["total_s"] for run in runs],
        "torch_threads": torch.get_num_threads(),
        "machine": machine_summary(),
    }


def report_cap(
    ckpt: str, n_documents: int = 70_000, words: int = 60, cap: int = 1000, rate_sample: int = 300
) -> dict[str, Any]:
    """The after-fit report on a test split the size of the largest hub config's (dbpedia_14:
    70,000 documents), generated from BBC article openings with their true labels.

    Times the capped report (every document classified, ``cap`` explained with faithfulness and
    paged), and estimates the uncapped one from the per-document time of ``rate_sample``
    documents reported whole.
    """
    import torch

    from docclass.artifacts.load import load_classifier
    from docclass.inference.reporting import Documents, make_report
    from docclass.train.callbacks import machine_summary

    loaded = load_source(SourceSpec("bbc"))
    bbc = loaded.splits["train"]
    openings = [" ".join(text.split()[:words]) for text in bbc["text"]]
    names = list(bbc["label"])
    picks = [i % len(openings) for i in range(n_documents)]
    documents = Documents(
        [openings[i] for i in picks],
        [str(i) for i in range(n_documents)],
        [names[i] for i in picks],
        f"{n_documents:,} generated documents",
    )
    classifier = load_classifier(ckpt)
    with tempfile.TemporaryDirectory() as out:
        capped = make_report(classifier, documents, out, max_documents=cap)
    sample = Documents(
        documents.texts[:rate_sample], documents.ids[:rate_sample],
        documents.labels[:rate_sample], "rate sample",
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        whole = make_report(classifier, sample, out, max_documents=None)
    per_document = whole["total_s"] / rate_sample
    return {
        "checkpoint": ckpt,
        "documents": n_documents,
        "words_per_document": words,
        "cap": cap,
        "capped_report_s": capped["total_s"],
        "capped_stages_s": {k: capped[k] for k in ("explain_s", "faithfulness_s", "pages_s")},
        "uncapped_s_per_document": round(per_document, 4),
        "uncapped_estimate_s": round(per_document * n_documents),
        "torch_threads": torch.get_num_threads(),
        "machine": machine_summary(),
    }
